"""``elfreg.load``: a folder or a Hub id, the checkpoint's own settings unless a call sets one,
and the texts of ``elfreg.sampling.generate``."""

from __future__ import annotations

from pathlib import Path

import pytest
from serve_prompts import PROMPTS

import elfreg
from elfreg.config import ConfigError
from elfreg.sampling import generate, load_checkpoint


def test_generate_is_the_sampling_rooms_generate(served_checkpoint):
    model = elfreg.load(served_checkpoint, device="cpu")
    assert model.settings.nfe == 8 and model.source["kind"] == "local" and model.source["weights"] == "ema"
    texts = model.generate(PROMPTS[:2], samples=2, seed=5, sampler="full-span")
    ref = generate(load_checkpoint(served_checkpoint, "cpu"), PROMPTS[:2],
                   model.settings.replace(sampler="full-span"), samples=2, seed=5, progress=False)
    assert texts == [r.text for r in ref] and len(texts) == 4
    with_trajectories = model.sample(PROMPTS[0], nfe=6, record_every=2)
    assert with_trajectories[0].trajectory is not None and with_trajectories[0].nfe == 6
    assert with_trajectories[0].text == model.generate(PROMPTS[0], nfe=6)[0]


def test_bad_settings_and_sources_are_one_line(served_checkpoint, tmp_path):
    model = elfreg.load(served_checkpoint, device="cpu")
    with pytest.raises(ConfigError, match="sample: unknown key\\(s\\) temperature"):
        model.generate(PROMPTS[:1], temperature=0.7)
    with pytest.raises(ConfigError, match="sample.nfe: must be an integer >= 2"):
        model.generate(PROMPTS[:1], nfe=1)
    with pytest.raises(FileNotFoundError, match="not a folder here, nor an owner/name Hub id"):
        elfreg.load(tmp_path / "nowhere" / "at" / "all")
    with pytest.raises(ValueError, match="revision='v1' is for Hub ids"):
        elfreg.load(served_checkpoint, revision="v1")


def test_a_hub_id_records_the_revision_the_commit_and_file_hashes(served_checkpoint, tmp_path, monkeypatch):
    import hashlib
    import shutil

    import huggingface_hub

    from elfreg.train.export import export_release

    release = export_release(Path(served_checkpoint), tmp_path / "release")
    snapshot = tmp_path / "hub" / "snapshots" / ("c0ffee" * 6 + "abcd")
    shutil.copytree(release, snapshot)
    asked = {}

    def fake_download(repo_id: str, revision: str | None = None, **_: object) -> str:
        asked.update(repo_id=repo_id, revision=revision)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    model = elfreg.load("someone/tiny-elfreg", revision="v1", device="cpu")
    assert asked == {"repo_id": "someone/tiny-elfreg", "revision": "v1"}
    src = model.source
    assert src["kind"] == "hub" and src["revision"] == "v1" and src["commit"] == snapshot.name
    card = snapshot / "README.md"
    assert src["files"]["README.md"] == hashlib.sha256(card.read_bytes()).hexdigest()
    assert "ema.safetensors" in src["files"] and "config.yaml" in src["files"]
    assert model.generate(PROMPTS[:1]) == elfreg.load(served_checkpoint, device="cpu").generate(PROMPTS[:1])
