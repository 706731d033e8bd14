"""Pre-tokenised training data: token shards with prompt/answer offsets, read memory-mapped.

A prepared folder holds:

- ``shard-NNNNN.tokens.bin`` — the token ids (``uint32``) of its rows, prompt then answer, no
  EOS and no padding (the canvas adds them);
- ``shard-NNNNN.rows.npy`` — one ``(offset, prompt length, answer length)`` row per example;
- ``samples.npy`` — one epoch of the mixture: the row of each sample (a source with an epoch
  multiplier of 2 lists its rows twice, one of 0.5 a fixed half of them);
- ``manifest.json`` — shards, counts, the tokenizer and the recipe they were made from;
- ``stats.json`` — the accounting of :mod:`.prepare`.

:class:`ShardedExamples` is random access by sample index (``examples[i]``), holding no cursor:
the data order stays a pure function of (seed, global position) (``train/batch.py``), so a
process of a data-parallel run reads exactly the positions it is given, and a resumed run reads
what an uninterrupted one would have.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ShardWriter", "ShardedExamples", "TokenizedExample", "read_manifest"]

TOKEN_DTYPE = np.uint32
FORMAT = 1


@dataclass(frozen=True)
class TokenizedExample:
    """One training example as token ids (no special tokens)."""

    prompt: list[int]
    answer: list[int]


class ShardWriter:
    """Appends tokenised rows to shard files of at most ``shard_rows`` rows; only the current
    shard's row table is held in memory, tokens go straight to disk."""

    def __init__(self, folder: str | Path, shard_rows: int):
        self.folder, self.shard_rows = Path(folder), shard_rows
        self.folder.mkdir(parents=True, exist_ok=True)
        self.shards: list[dict[str, Any]] = []
        self._file = None
        self._rows: list[tuple[int, int, int]] = []
        self._offset = 0

    def _name(self) -> str:
        return f"shard-{len(self.shards):05d}"

    def add(self, prompt: Sequence[int], answer: Sequence[int]) -> None:
        if self._file is None:
            self._file = open(self.folder / f"{self._name()}.tokens.bin", "wb")  # noqa: SIM115 - closed in _flush
        ids = np.asarray([*prompt, *answer], dtype=TOKEN_DTYPE)
        self._file.write(ids.tobytes())
        self._rows.append((self._offset, len(prompt), len(answer)))
        self._offset += len(ids)
        if len(self._rows) >= self.shard_rows:
            self._flush()

    def _flush(self) -> None:
        if self._file is None:
            return
        self._file.close()
        name = self._name()
        np.save(self.folder / f"{name}.rows.npy", np.asarray(self._rows, dtype=np.int64).reshape(-1, 3))
        self.shards.append({"name": name, "rows": len(self._rows), "tokens": self._offset})
        self._file, self._rows, self._offset = None, [], 0

    def close(self) -> list[dict[str, Any]]:
        """Finish the last shard; the list of shards written."""
        self._flush()
        return self.shards


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of a prepared folder (``FileNotFoundError`` naming it when there is none)."""
    path = Path(folder) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, "not a prepared data folder (no manifest.json; run `elfreg data "
                                "prepare --config FILE --out DIR`)", str(path))
    manifest = json.loads(path.read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{path}: format {manifest.get('format')!r}, expected {FORMAT}; prepare the data again")
    return manifest


class ShardedExamples(Sequence):
    """The samples of a prepared folder as a sequence of :class:`TokenizedExample`: item ``i``
    is sample ``i`` of one epoch of the mixture. Everything is memory-mapped."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.manifest = read_manifest(folder)
        self._tokens = [np.memmap(self.folder / f"{s['name']}.tokens.bin", dtype=TOKEN_DTYPE, mode="r")
                        if s["tokens"] else np.zeros(0, TOKEN_DTYPE) for s in self.manifest["shards"]]
        self._rows = [np.load(self.folder / f"{s['name']}.rows.npy", mmap_mode="r") for s in self.manifest["shards"]]
        self._starts = np.cumsum([0] + [s["rows"] for s in self.manifest["shards"]])
        self.samples = np.load(self.folder / "samples.npy", mmap_mode="r")

    @property
    def rows(self) -> int:
        """Rows stored (each once, whatever its epoch multiplier)."""
        return int(self._starts[-1])

    def row(self, r: int) -> TokenizedExample:
        """Stored row ``r`` (0-based, over all shards)."""
        if not 0 <= r < self.rows:
            raise IndexError(f"row {r} of {self.rows}")
        shard = int(np.searchsorted(self._starts, r, side="right")) - 1
        offset, p, a = (int(v) for v in self._rows[shard][r - self._starts[shard]])
        ids = self._tokens[shard][offset:offset + p + a]
        return TokenizedExample(ids[:p].tolist(), ids[p:].tolist())

    def row_lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """(prompt lengths, answer lengths) of every stored row."""
        rows = [np.asarray(r).reshape(-1, 3) for r in self._rows]
        table = np.concatenate(rows) if rows else np.zeros((0, 3), np.int64)
        return table[:, 1], table[:, 2]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> TokenizedExample:  # type: ignore[override]
        return self.row(int(self.samples[i]))
