"""Toy LM pretraining follows the shared learning-rate schedule, step by step."""

from __future__ import annotations

from transformers import AutoTokenizer

from elfreg.toy import corpus as TC
from elfreg.toy import lm as toy_lm
from elfreg.toy import tokenizer as TT
from elfreg.train.optim import scheduled_lr


def test_pretraining_sets_the_shared_schedule_before_every_step(tmp_path, monkeypatch):
    examples = TC.train_examples(TC.ToyTaskConfig(), 200)
    TT.save_tokenizer(TT.train_tokenizer(TC.lm_text(e) for e in examples), tmp_path)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    cfg = toy_lm.ToyLMConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64,
                             steps=9, batch_size=8, lr=4e-3, warmup_steps=3, precision="fp32")
    seen: list[float] = []
    real_step = toy_lm.torch.optim.AdamW.step

    def recording_step(opt, *args, **kwargs):
        seen.append(opt.param_groups[0]["lr"])
        assert len({g["lr"] for g in opt.param_groups}) == 1
        return real_step(opt, *args, **kwargs)

    monkeypatch.setattr(toy_lm.torch.optim.AdamW, "step", recording_step)
    toy_lm.pretrain_lm(cfg, tok, examples, progress=False)
    assert seen == [scheduled_lr(s, 4e-3, 3, 9, 0.1) for s in range(9)]
    assert seen[:3] == [4e-3 / 3, 8e-3 / 3, 4e-3]
    assert seen[-1] < 4e-3 * 0.2  # near the 10 % floor at the end
