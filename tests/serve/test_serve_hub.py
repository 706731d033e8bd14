"""``elfreg.load`` of a Hub id: a release loads from the Hub's cache (offline, laid out here as
``huggingface_hub`` lays it out), the download asks for a release's files alone, and a snapshot
that is not a release, or that holds a file read by unpickling, is refused before anything in it
is opened: a crafted pickle that would write a file writes nothing."""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub.utils import filter_repo_objects
from serve_prompts import PROMPTS

import elfreg
from elfreg.serve import hub
from elfreg.serve.hub import RELEASE_FILES, UnsafeDownload
from elfreg.train.export import export_release


class WritesAFile:
    """Unpickled, it writes ``target``: what a crafted checkpoint runs on the loading machine."""

    def __init__(self, target: Path):
        self.target = str(target)

    def __reduce__(self):
        return exec, (f"open({self.target!r}, 'w').write('ran code from a download')",)


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hub cache, offline: nothing is downloaded, snapshots come from the cache."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


def cached_snapshot(cache: Path, repo_id: str, files: dict[str, Path | bytes]) -> Path:
    """``files`` (their snapshot paths: a file to copy, or bytes) as the snapshot of ``repo_id``'s
    ``main`` and ``v1`` in a Hub cache."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    snapshot = repo / "snapshots" / commit
    for rel, content in files.items():
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (snapshot / rel).write_bytes(content)
        else:
            shutil.copyfile(content, snapshot / rel)
    (repo / "refs").mkdir(parents=True)
    for ref in ("main", "v1"):
        (repo / "refs" / ref).write_text(commit)
    return snapshot


def release_files(folder: Path) -> dict[str, Path]:
    return {p.relative_to(folder).as_posix(): p for p in folder.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def release(served_checkpoint, tmp_path_factory) -> Path:
    return export_release(Path(served_checkpoint), tmp_path_factory.mktemp("release") / "tiny")


def test_a_release_loads_from_the_cache_and_records_the_revision_the_commit_and_file_hashes(
        release, hub_cache, served_checkpoint, monkeypatch):
    snapshot = cached_snapshot(hub_cache, "someone/tiny-elfreg", release_files(release))
    asked = {}
    download = huggingface_hub.snapshot_download

    def recorded(**kwargs):
        asked.update(kwargs)
        return download(**kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", recorded)
    model = elfreg.load("someone/tiny-elfreg", revision="v1", device="cpu")
    assert asked == {"repo_id": "someone/tiny-elfreg", "revision": "v1", "allow_patterns": RELEASE_FILES}
    src = model.source
    assert src["kind"] == "hub" and src["revision"] == "v1" and src["commit"] == snapshot.name
    assert src["files"]["README.md"] == hashlib.sha256((snapshot / "README.md").read_bytes()).hexdigest()
    assert {"ema.safetensors", "config.yaml", "meta.json"} <= set(src["files"])
    assert model.generate(PROMPTS[:1]) == elfreg.load(served_checkpoint, device="cpu").generate(PROMPTS[:1])


def test_the_download_asks_for_a_releases_files_and_nothing_read_by_unpickling(release, served_checkpoint):
    """``huggingface_hub``'s own filter over a repository holding a release beside a whole
    training run keeps the release, every file of it, and none of the run."""
    run = Path(served_checkpoint)
    listing = sorted(release_files(release)) + [f"run/{p.relative_to(run).as_posix()}" for p in run.rglob("*")
                                                if p.is_file()]
    assert any(name.endswith("train_state.pt") for name in listing)  # the run holds its pickled state
    fetched = set(filter_repo_objects(listing, allow_patterns=RELEASE_FILES))
    assert fetched == set(release_files(release))
    assert not any(hub.pickled_file(name) for name in fetched)


@pytest.mark.parametrize("form", ["sharded checkpoint", "release beside a state folder", "one-process checkpoint"])
def test_a_snapshot_holding_a_pickle_is_refused_without_unpickling_it(release, hub_cache, tmp_path, form):
    pwned = tmp_path / "pwned"
    payload = pickle.dumps(WritesAFile(pwned))
    control = tmp_path / "control"
    pickle.loads(pickle.dumps(WritesAFile(control)))  # such a payload, unpickled, does write its file
    assert control.read_text() == "ran code from a download"
    kept = {k: v for k, v in release_files(release).items() if k in ("config.yaml", "meta.json")}
    files = {"sharded checkpoint": {**kept, "state/.metadata": payload, "state/__0_0.distcp": b"\0" * 64},
             "release beside a state folder": {**release_files(release), "state/.metadata": payload},
             "one-process checkpoint": {**release_files(release), "train_state.pt": payload}}[form]
    cached_snapshot(hub_cache, "someone/crafted", files)
    named = "train_state.pt" if form == "one-process checkpoint" else "state/.metadata"
    with pytest.raises(UnsafeDownload, match=rf"someone/crafted: refusing {named} from a download: .*pickle.*"
                                             r"`elfreg export --checkpoint RUN --out DIR`"):
        elfreg.load("someone/crafted", device="cpu")
    assert not pwned.exists()


def test_a_snapshot_without_a_release_is_refused_saying_what_to_publish(hub_cache, served_checkpoint):
    """What an allow-patterned download of a repository holding only a training run brings: no
    weights at the root (its checkpoints/ files are never fetched)."""
    cached_snapshot(hub_cache, "someone/a-run", {"README.md": b"# my run\n"})
    with pytest.raises(UnsafeDownload, match=r"someone/a-run holds no elfreg release at its root: missing "
                                             r"model.safetensors, config.yaml, meta.json\..* publish the folder"):
        elfreg.load("someone/a-run", device="cpu")
    run = Path(served_checkpoint)
    step = sorted((run / "checkpoints").glob("step-*"))[-1]
    cached_snapshot(hub_cache, "someone/a-cached-run", {
        f"checkpoints/{step.name}/{name}": step / name for name in ("model.safetensors", "config.yaml")})
    with pytest.raises(UnsafeDownload, match=r"root \(it holds a training run's checkpoints/\)"):
        elfreg.load("someone/a-cached-run", device="cpu")
