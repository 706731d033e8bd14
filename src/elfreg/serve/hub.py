"""Releases from the Hugging Face Hub, read without running anything from the download.

Loading untrusted weights is the normal use of a Hub id, so ``elfreg.load("owner/name")`` reads
only what cannot run code: safetensors, JSON and YAML, and tokenizer files, which is exactly what
``elfreg export`` writes (a *release*). The download asks the Hub for those files alone
(:data:`RELEASE_FILES`, ``allow_patterns``). A training checkpoint is refused: its optimiser
state (``train_state.pt``) and the sharded form (``state/``, whose ``.metadata`` the reader
unpickles) are pickles, and a crafted pickle runs code when read. A snapshot already in the
local cache may hold such files whatever was asked for (an earlier full download, an offline
machine), so the folder is checked before anything in it is opened, and one that holds a
pickle is refused without reading it.

Local folders are the user's own runs and load as they are (:func:`elfreg.serve.model.load`).
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from typing import Any

from ..provenance import file_sha256

RELEASE_FILES = ["model.safetensors", "ema.safetensors", "config.yaml", "meta.json", "README.md",
                 "tokenizer/*.json", "tokenizer/*.txt", "tokenizer/*.model", "tokenizer/*.jinja"]
"""What a download fetches (``huggingface_hub``'s ``allow_patterns``): a release's files."""
NEEDED = ("model.safetensors", "config.yaml", "meta.json")
PICKLED = (".pt", ".pth", ".bin", ".pkl", ".pickle", ".ckpt", ".metadata")
"""Suffixes of files that are read by unpickling (``.metadata``: a sharded checkpoint's index)."""
EXPORT = "publish the folder `elfreg export --checkpoint RUN --out DIR` writes (a release) instead"


class UnsafeDownload(ValueError):
    """A Hub snapshot that is not a release, or that holds a file read by unpickling."""


def pickled_file(rel: str) -> str | None:
    """Why the snapshot file ``rel`` (a path inside it) would be read by unpickling, or None."""
    path = PurePosixPath(rel)
    if "state" in path.parts[:-1]:
        return "a sharded checkpoint's state/ is read through torch.distributed.checkpoint, whose .metadata is a pickle"
    if path.suffix in PICKLED or path.name in PICKLED:
        return f"a {path.suffix or path.name} file is a pickle"
    return None


def check_release(folder: Path, repo_id: str) -> None:
    """Refuse ``folder`` (a snapshot of ``repo_id``) unless it is a release holding no pickle;
    reads file names only."""
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() or p.is_symlink())
    for rel in files:
        why = pickled_file(rel)
        if why:
            raise UnsafeDownload(f"{repo_id}: refusing {rel} from a download: {why}, and a crafted pickle runs code "
                                 f"when read; {EXPORT}")
    missing = [name for name in NEEDED if name not in files]
    if missing:
        run = " (it holds a training run's checkpoints/)" if any(f.startswith("checkpoints/") for f in files) else ""
        raise UnsafeDownload(f"{repo_id} holds no elfreg release at its root{run}: missing {', '.join(missing)}. "
                             "A download is loaded only from a release: a training checkpoint's state "
                             f"(train_state.pt, a sharded state/ folder) is read through pickles; {EXPORT}")


def fetch_release(repo_id: str, revision: str | None = None) -> tuple[Path, dict[str, Any]]:
    """The local folder of the release ``repo_id`` at ``revision`` (fetched, or from the cache)
    and the record of where it came from: the id, the revision asked for, the commit it
    resolved to and the sha256 of every file. :class:`UnsafeDownload` in one line when it is
    not a release or holds a pickle (module docstring)."""
    from huggingface_hub import snapshot_download

    folder = Path(snapshot_download(repo_id=repo_id, revision=revision, allow_patterns=RELEASE_FILES))
    check_release(folder, repo_id)
    commit = folder.name  # the cache keeps each snapshot under the commit it resolved to
    files = {p.relative_to(folder).as_posix(): file_sha256(p) for p in sorted(folder.rglob("*")) if p.is_file()}
    return folder, {"kind": "hub", "repo_id": repo_id, "revision": revision, "commit": commit, "files": files}
