"""``elfreg.load``: a folder or a Hub id, the checkpoint's own settings unless a call sets one,
and the texts of ``elfreg.sampling.generate``."""

from __future__ import annotations

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
