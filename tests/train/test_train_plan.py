"""``elfreg plan`` and the cost model behind it and behind the logged MFU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from train_helpers import EXAMPLES, metrics

from elfreg.cli import main
from elfreg.config import Config
from elfreg.model.presets import student_from_config
from elfreg.train.cost import flops_per_token, frozen_shapes, prefix_tokens
from elfreg.train.loop import train
from elfreg.train.plan import make_plan

REG_B, ELF_B = "configs/elf-reg-b-gsm8k.yaml", "configs/elf-b-gsm8k.yaml"


def test_the_student_flops_follow_its_weights():
    """The main pass costs 3 forwards of 2 FLOPs per weight of the blocks, projections and
    projector (the projector on the answer's share of the canvas), plus attention's 4·S·width
    per block: counted from the built model's shapes."""
    cfg = Config.load(REG_B)
    encoder, teacher = frozen_shapes(cfg)
    with torch.device("meta"):
        student = student_from_config(cfg, encoder.width, encoder.vocab, teacher.width)
    matrices = sum(p.numel() for p in student.blocks.parameters() if p.dim() == 2)
    io = sum(layer.weight.numel() for layer in (student.self_cond_proj, student.text_down, student.text_up,
                                                student.final_layer.linear))
    projector = sum(m.weight.numel() for m in student.projector if hasattr(m, "weight"))
    assert prefix_tokens(cfg) == student.n_prefix == 13  # 4 t, 4 w, 4 mode tokens and the REG token
    attention = cfg.model.depth * 4 * (cfg.text.canvas_len + student.n_prefix) * cfg.model.width
    flops = flops_per_token(cfg, encoder, teacher)
    answer = 1 - cfg.text.prompt_cap / (2 * cfg.text.canvas_len)
    assert flops["student_fwd_bwd"] == pytest.approx(3 * (2 * (matrices + io + answer * projector) + attention))
    head = 2 * (student.dec_proj.weight.numel() + student.vocab_head.weight.numel())
    assert flops["decoder_head"] == pytest.approx(4 * 0.2 * answer * head)
    assert flops["total"] == pytest.approx(sum(v for k, v in flops.items() if k not in ("total", "recompute")))
    # the frozen teacher (Qwen3-1.7B read at layer 24) dominates, and ELF has none
    assert flops["frozen_teacher"] > flops["student_fwd_bwd"] + flops["frozen_encoder"]
    elf = Config.load(ELF_B)
    assert flops_per_token(elf, *frozen_shapes(elf))["frozen_teacher"] == 0


def test_a_plan_scales_with_gpus_and_shards_memory_under_fsdp2():
    cfg = Config.load(REG_B)
    one, eight = make_plan(cfg, 1, 989, 0.35), make_plan(cfg, 8, 989, 0.35)
    assert eight.step_seconds == pytest.approx(one.step_seconds / 8)
    assert eight.gpu_hours == pytest.approx(one.gpu_hours)
    assert eight.memory["weights"] == one.memory["weights"]  # ddp-like: replicated
    sharded = make_plan(Config.load(REG_B, ["train.parallel=fsdp2", "text.shard_frozen=true", "train.optimizer=adamw"]),
                        8, 989, 0.35)
    assert sharded.memory["weights"] == pytest.approx(one.memory["weights"] / 8)
    assert sharded.memory["frozen_models"] == pytest.approx(one.memory["frozen_models"] / 8)
    epochs = make_plan(cfg, 8, 989, 0.35, examples=2_404_028, epochs=12)
    assert epochs.steps == -(-12 * 2_404_028 // 512) and epochs.tokens_per_epoch == 2_404_028 * 1024
    for flag, bad in (("--gpus", (0, 989, 0.3)), ("--peak-tflops", (8, 0, 0.3)), ("--mfu", (8, 989, 1.5))):
        with pytest.raises(ValueError, match=flag):
            make_plan(cfg, *bad)


def test_the_paper_budget_comes_from_the_config_alone(tmp_path):
    """configs/elf-reg-b-gsm8k.yaml says 12 epochs and data.paper: gsm8k; without prepared data the
    plan takes Table 8's 2,404,028 examples, and says so. Prepared data's stats.json wins."""
    cfg = Config.load(REG_B)
    plan = make_plan(cfg, 8, 989, 0.209)
    assert plan.data.examples == 2_404_028 and "Table 8" in plan.data.source
    assert plan.steps == -(-12 * 2_404_028 // 512) and plan.budget == "12 epochs"
    assert 100 < plan.gpu_hours < 1000  # the paper's 407.9 H200 GPU-hours is of this order
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / "stats.json").write_text('{"total": {"samples": 1000000}}')
    mine = make_plan(Config.load(REG_B, [f"data.prepared={prepared}"]), 8, 989, 0.209)
    assert mine.data.examples == 1_000_000 and str(prepared) in mine.data.source
    unknown = make_plan(Config.load(REG_B, ["data.paper=null"]), 8, 989, 0.209)
    assert unknown.data.examples is None and unknown.steps is None and unknown.gpu_hours is None


def test_activation_checkpointing_costs_its_recompute_in_time_not_in_mfu():
    plain = make_plan(Config.load(REG_B), 8, 989, 0.209)
    recomputed = make_plan(Config.load(REG_B, ["train.activation_checkpointing=true"]), 8, 989, 0.209)
    assert recomputed.flops["total"] == plain.flops["total"] and recomputed.flops["recompute"] > 0
    assert recomputed.step_seconds / plain.step_seconds == pytest.approx(
        (plain.flops["total"] + recomputed.flops["recompute"]) / plain.flops["total"])


def test_plan_cli_prints_components_memory_and_the_elf_ratio(capsys):
    assert main(["plan", "--config", REG_B, "--gpus", "8", "--examples", "2404028", "--epochs", "12",
                 "--compare", ELF_B]) == 0
    out = capsys.readouterr().out
    for word in ("student_fwd_bwd", "self_cond_aux", "decoder_head", "frozen_encoder", "frozen_teacher",
                 "optimizer", "activations", "tokens per epoch: 2,404,028", "data: 2,404,028 examples per epoch "
                 "(--examples)", "GPU-hours at MFU 20.9% ("):
        assert word in out, word
    ratio = float(out.rsplit("= ", 1)[1].split("x")[0])
    reg, elf = make_plan(Config.load(REG_B), 8, 989, 0.35), make_plan(Config.load(ELF_B), 8, 989, 0.35)
    assert ratio == pytest.approx(reg.flops["total"] / elf.flops["total"], abs=0.01)


def test_logged_mfu_is_tokens_times_flops_over_peak(tiny_cfg):
    cfg = tiny_cfg(train={"steps": 3, "peak_tflops": 0.001})
    train(cfg, EXAMPLES)
    for m in metrics(Path(cfg.train.out_dir)):
        assert m["real_tokens_per_s"] < m["tokens_per_s"]  # padding excluded
        assert m["mfu"] == pytest.approx(m["tokens_per_s"] * m["flops_per_token.total"] / 1e12 / 0.001)


def test_logged_frozen_flops_count_what_the_frozen_models_ran(tiny_cfg):
    """The encoder reads every canvas position; the teacher stops at each batch's last content
    token, and with the feature cache neither runs for examples seen before."""
    from elfreg.train.cost import LMShape

    cfg = tiny_cfg(train={"steps": 4, "batch_size": 4})
    train(cfg, EXAMPLES)
    static = flops_per_token(cfg, *frozen_shapes(cfg))
    for m in metrics(Path(cfg.train.out_dir)):
        assert m["flops_per_token.frozen_encoder"] == pytest.approx(static["frozen_encoder"], rel=1e-9)
        assert 0 < m["flops_per_token.frozen_teacher"] < static["frozen_teacher"]
    teacher = frozen_shapes(cfg)[1]
    used = 12  # a read of 12 positions costs 12 × forward_flops(12)
    assert teacher.flops_of(used, used * used) == pytest.approx(used * teacher.forward_flops(used))
    assert isinstance(teacher, LMShape)
    cached = tiny_cfg(train={"steps": 4, "batch_size": 4, "feature_cache": True, "out_dir": cfg.train.out_dir + "-c"})
    train(cached, EXAMPLES)  # 4 examples: every step after the first is served by the cache
    lines = metrics(Path(cached.train.out_dir))
    assert lines[0]["flops_per_token.frozen_encoder"] > lines[-1]["flops_per_token.frozen_encoder"]
