from dataclasses import replace

import pytest
import torch

from elfreg.config import ModelConfig
from elfreg.model.presets import PAPER_COUNTS, build_on_meta
from elfreg.model.student import Student

SMALL = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=8)


@pytest.mark.parametrize("name", list(PAPER_COUNTS))
def test_paper_presets_match_table7_within_1_percent(name):
    """ELF's network gives Table 7's counts (ELF-B 89.75M + 156.52M against 90M + 156M; the REG
    variants' projector and REG token add 14.7M at B, 18.9M at L)."""
    groups = build_on_meta(name).parameter_groups()
    non_decoder, decoder = PAPER_COUNTS[name]
    assert abs(groups["non_decoder"] / non_decoder - 1) < 0.01
    assert abs(groups["decoder"] / decoder - 1) < 0.01


def test_the_papers_elf_reg_l_count_adds_the_b_widths_projector_and_reg_token():
    """Table 7's ELF-REG-L (652M) is ELF-L plus what REPA and REG add to ELF-B (14.69M): the
    same modules at L's width 1280 hold 512 × (2,048 + 4,096 + 2,048) + 2 × 512 more, the
    projector's first layer, REG's input (teacher state and its self-conditioning, 2 × 2,048 in)
    and REG's output layer, plus REG's input bias and output norm: elfreg's 656.16M."""
    count = {n: build_on_meta(n).parameter_groups()["non_decoder"] for n in PAPER_COUNTS}
    added_b, added_l = count["elf-reg-b"] - count["elf-b"], count["elf-reg-l"] - count["elf-l"]
    assert (added_b, added_l) == (14_689_792, 18_885_120)
    assert added_l - added_b == (1280 - 768) * (2048 + 2 * 2048 + 2048) + 2 * (1280 - 768)
    assert round((count["elf-l"] + added_b) / 1e6) == PAPER_COUNTS["elf-reg-l"][0] / 1e6 == 652
    assert round(count["elf-reg-l"] / 1e6) == 656


def test_presets_are_built_on_meta_and_projector_is_training_only():
    student = build_on_meta("elf-reg-b")
    assert all(p.is_meta for p in student.parameters())
    groups = student.parameter_groups()
    assert groups["training_only_projector"] > 9e6  # 768→2048→2048→2048
    assert build_on_meta("elf-b").parameter_groups()["training_only_projector"] == 0


def _inputs(b=3, length=6, d=8, dr=12):
    torch.manual_seed(0)
    prompt = torch.zeros(b, length, dtype=torch.bool)
    prompt[:, :2] = True
    return dict(z=torch.randn(b, length, d), self_cond=torch.randn(b, length, d), t=torch.rand(b),
                w=torch.rand(b) + 1, prompt_mask=prompt, reg=torch.randn(b, dr))


def test_prompt_positions_are_restored_and_heads_start_at_zero():
    student = Student(SMALL, enc_dim=8, vocab_size=20, teacher_dim=12)
    inp = _inputs()
    out = student(**inp, want_repa=True)
    assert torch.equal(out.x_hat[inp["prompt_mask"]], inp["z"][inp["prompt_mask"]])
    assert torch.all(out.x_hat[~inp["prompt_mask"]] == 0)  # zero-initialised output layer
    assert out.reg_hat.shape == (3, 12) and torch.all(out.reg_hat == 0)
    assert out.repa.shape == (3, 6 + 1, 12)  # content positions + REG position


def test_repa_positions_project_exactly_those_positions():
    """Projecting only the positions L_REPA reads gives their rows of the full projection, in
    row-major order, and gradients flow to the projector through them alone."""
    student = Student(SMALL, enc_dim=8, vocab_size=20, teacher_dim=12)
    for p in student.parameters():
        torch.nn.init.normal_(p, std=0.2)
    inp = _inputs()
    full = student(**inp, want_repa=True).repa
    at = torch.zeros(3, 6 + 1, dtype=torch.bool)
    at[0, 2:4] = at[1, 3] = at[2, 2:6] = True
    at[:, -1] = True  # the REG position
    packed = student(**inp, want_repa=True, repa_positions=at).repa
    assert packed.shape == (int(at.sum()), 12)
    assert torch.allclose(packed, full[at], atol=1e-6)
    packed.sum().backward()
    assert student.projector[0].weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="repa_positions has shape"):
        student(**inp, want_repa=True, repa_positions=at[:, :-1])
    with pytest.raises(ValueError, match="needs want_repa"):
        student(**inp, repa_positions=at)


def test_the_decode_gate_switches_only_the_mode_tokens():
    """The network is a function of its inputs: decode calls differ from denoise calls by the mode
    tokens alone (callers pass t = 1 and q = 0), as ELF's ``decoder_step_active``."""
    student = Student(SMALL, enc_dim=8, vocab_size=20, teacher_dim=12)
    for p in student.parameters():
        torch.nn.init.normal_(p, std=0.2)
    inp = _inputs()
    dec = torch.ones(3, dtype=torch.bool)
    a = student(**inp, decode=dec).hidden
    assert not torch.allclose(a, student(**inp).hidden, atol=1e-3)  # the gate matters
    with torch.no_grad():
        student.prefix.mode_tokens.zero_()  # with zero mode tokens the gate has nothing to switch
    assert torch.allclose(student(**inp, decode=dec).hidden, student(**inp).hidden, atol=1e-6)
    # t and q are inputs in decode calls too
    assert not torch.allclose(student(**inp, decode=dec).hidden,
                              student(**{**inp, "t": torch.ones(3)}, decode=dec).hidden, atol=1e-3)
    assert student.decode_logits(a).shape == (3, 6, 20)


def test_attention_is_bidirectional():
    student = Student(replace(SMALL, extra_token="none", repa=False), enc_dim=8, vocab_size=20, teacher_dim=None)
    for p in student.parameters():
        torch.nn.init.normal_(p, std=0.2)
    inp = _inputs()
    inp.pop("reg")
    base = student(**inp).x_hat
    z2 = inp["z"].clone()
    z2[:, -1] += 5.0  # changing the last position changes earlier answer predictions
    after = student(**{**inp, "z": z2}).x_hat
    assert not torch.allclose(base[:, 2], after[:, 2])


def test_missing_teacher_dim_and_reg_input_fail_clearly():
    with pytest.raises(ValueError, match="teacher_dim"):
        Student(SMALL, enc_dim=8, vocab_size=20, teacher_dim=None)
    student = Student(SMALL, enc_dim=8, vocab_size=20, teacher_dim=12)
    inp = _inputs()
    inp.pop("reg")
    with pytest.raises(ValueError, match="REG"):
        student(**inp)


def test_params_cli_prints_table7_split(capsys):
    from elfreg.cli import main

    assert main(["params", "--preset", "all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in out] == list(PAPER_COUNTS)
    reg_b = next(line for line in out if line.startswith("elf-reg-b"))
    assert "104.44M" in reg_b and "decoder   156.52M" in reg_b and "paper: 104M + 156M" in reg_b


def test_params_cli_counts_a_paper_config_offline(capsys):
    from pathlib import Path

    from elfreg.cli import main

    config = Path(__file__).resolve().parents[2] / "configs" / "elf-reg-l-code.yaml"
    assert main(["params", "--config", str(config)]) == 0
    assert "656.16M" in capsys.readouterr().out


def test_reg_can_be_dropped_at_inference():
    torch.manual_seed(0)
    cfg = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16)
    student = Student(cfg, 8, 11, teacher_dim=6).eval()
    torch.nn.init.normal_(student.final_layer.linear.weight, std=0.3)
    z, q = torch.randn(2, 5, 8), torch.randn(2, 5, 8)
    t, w = torch.tensor([0.2, 0.7]), torch.full((2,), 2.0)
    mask = torch.tensor([[True, False, False, False, False]] * 2)
    with torch.no_grad():
        full = student(z, q, t, w, mask, reg=torch.randn(2, 6))
        dropped = student(z, q, t, w, mask, drop_reg=True)  # no REG input needed
    assert dropped.reg_hat is None and full.reg_hat.shape == (2, 6)
    assert dropped.hidden.shape == full.hidden.shape
    assert not torch.allclose(dropped.x_hat[~mask], full.x_hat[~mask])  # the REG token took part before
    with pytest.raises(ValueError, match="REPA"):
        student(z, q, t, w, mask, drop_reg=True, want_repa=True)
