"""``elfreg export``: a release folder from a one-process or a sharded checkpoint, which
``elfreg sample`` loads directly and samples the checkpoint's tokens from."""

from __future__ import annotations

import pytest
import torch
import yaml
from train_helpers import EXAMPLES

from elfreg.checkpoint import is_sharded, open_checkpoint, resolve_checkpoint
from elfreg.cli import main
from elfreg.config import SampleConfig
from elfreg.distributed import shutdown_distributed
from elfreg.sampling import generate, load_checkpoint
from elfreg.train.export import export_release
from elfreg.train.loop import train

PROMPTS = ["add 1 2", "add 7 1"]


def _tokens(path) -> list[list[int]]:
    models = load_checkpoint(path, device="cpu", precision="fp32")
    results = generate(models, PROMPTS, SampleConfig(nfe=6, sampler="full-span"), samples=2, seed=3, progress=False)
    return [r.tokens for r in results]


@pytest.mark.parametrize("parallel", ["none", "fsdp2"])
def test_export_then_sample_gives_the_checkpoints_tokens(tiny_cfg, tmp_path, parallel):
    cfg = tiny_cfg(train={"steps": 6, "lr": 3e-3, "parallel": parallel, "device": "cpu", "precision": "fp32"})
    try:  # fsdp2 in this process: a process group of one, the sharded checkpoint form
        train(cfg, EXAMPLES)
    finally:
        shutdown_distributed()
    ckpt = resolve_checkpoint(cfg.train.out_dir)
    assert is_sharded(ckpt) == (parallel != "none")
    out = tmp_path / "release"
    assert main(["export", "--checkpoint", cfg.train.out_dir, "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "config.yaml", "ema.safetensors", "meta.json",
                                                     "model.safetensors", "tokenizer"]
    release, source = open_checkpoint(out), open_checkpoint(ckpt)
    for fetch in ("model_state", "ema_state"):
        have, want = getattr(release, fetch)(), getattr(source, fetch)()
        assert have.keys() == want.keys() and all(torch.equal(have[k], want[k]) for k in want)
    assert release.meta["step"] == 6 and release.config == source.config
    card = (out / "README.md").read_text()
    assert "# ELF-REG student (step 6)" in card
    assert yaml.safe_load(card.split("```yaml\n")[1].split("```")[0]) == source.config.to_dict()
    assert _tokens(out) == _tokens(ckpt)
    assert any(_tokens(out))  # something was decoded
    with pytest.raises(FileExistsError, match="already exists"):
        export_release(ckpt, out)
