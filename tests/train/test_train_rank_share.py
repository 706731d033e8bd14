"""World-size invariance without launching ranks: each rank's share of a global micro-batch,
per-row draws that do not depend on the rest of the batch, and an objective whose per-share
terms and gradients add up to the global batch's. Also the options a paper-scale run needs
(activation checkpointing, Muon) train what they should."""

from __future__ import annotations

import pytest
import torch
from train_helpers import EXAMPLES, metrics

from elfreg.flow.objective import elf_reg_loss
from elfreg.train.batch import make_batch, rank_share, row_draws
from elfreg.train.build import build_run, calibrate_reg
from elfreg.train.loop import train
from elfreg.train.muon import ElfMuon
from elfreg.train.optim import make_optimizer
from elfreg.train.step import train_step


def test_rank_shares_partition_the_global_batch_in_order():
    positions = list(range(100, 112))
    for world in (1, 2, 3, 4, 6):
        shares = [rank_share(positions, r, world) for r in range(world)]
        assert sum(shares, []) == positions and len({len(s) for s in shares}) == 1
    with pytest.raises(ValueError, match="cannot be split over 5 ranks"):
        rank_share(positions, 0, 5)
    with pytest.raises(ValueError, match="rank 2 is not in"):
        rank_share(positions, 2, 2)


def test_a_rows_draws_depend_on_its_position_not_on_its_batch():
    whole = row_draws(7, 3, [0, 1, 2, 3], "cpu")
    half = row_draws(7, 3, [2, 3], "cpu")
    a, b = whole.randn((4, 5, 2)), half.randn((2, 5, 2))
    assert torch.equal(a[2:], b)
    assert not torch.equal(a[0], a[1])  # rows differ
    assert torch.equal(whole.rand((4,))[2:], half.rand((2,)))  # and so do later draws
    assert not torch.equal(row_draws(7, 4, [2], "cpu").randn((1, 3)), row_draws(7, 3, [2], "cpu").randn((1, 3)))


def _grads(student) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("decode_prob", [0.2, 1.0])
def test_the_shares_terms_and_gradients_add_up_to_the_global_batchs(tiny_cfg, decode_prob):
    """Two halves of a batch, each averaged over the global set sizes, sum to the whole batch's
    loss terms and gradients: what two ranks compute and average (times two) is what one does."""
    cfg = tiny_cfg(train={"batch_size": 4}, flow={"decode_prob": decode_prob})
    run = build_run(cfg, EXAMPLES)
    calibrate_reg(run)
    student, rows = run.student, [0, 1, 2, 3]

    def loss(part: list[int], reduce=None):
        batch = make_batch(run.frozen, run.examples, part, True, run.device)
        return elf_reg_loss(student, batch, cfg.flow, cfg.loss, row_draws(0, 5, part, "cpu"), reduce)

    student.zero_grad()
    whole = loss(rows)
    whole.total.backward()
    want = _grads(student)
    counts = {}
    for name, part in (("a", rows[:2]), ("b", rows[2:])):
        loss(part, lambda c, name=name: counts.setdefault(name, c))
    together = counts["a"] + counts["b"]
    student.zero_grad()
    halves = [loss(part, lambda c: together) for part in (rows[:2], rows[2:])]
    for half in halves:
        half.total.backward()
    got = _grads(student)
    for key, value in whole.as_floats().items():
        assert sum(h.as_floats()[key] for h in halves) == pytest.approx(value, rel=1e-5, abs=1e-7), key
    assert got.keys() == want.keys()
    for name, g in want.items():
        assert torch.allclose(got[name], g, rtol=1e-4, atol=1e-6), name


def test_activation_checkpointing_changes_no_number(tiny_cfg):
    results = []
    for on in (False, True):
        run = build_run(tiny_cfg(train={"activation_checkpointing": on, "grad_accum": 2}), EXAMPLES)
        calibrate_reg(run)
        results.append((train_step(run, 0), _grads(run.student)))
    (plain, g_plain), (ckpt, g_ckpt) = results
    assert ckpt.losses == pytest.approx(plain.losses, rel=1e-6)
    assert all(torch.allclose(g_ckpt[k], v, rtol=1e-5, atol=1e-7) for k, v in g_plain.items())


def test_muon_updates_every_matrix_and_nesterov_adam_the_rest(tiny_cfg, tmp_path):
    cfg = tiny_cfg(train={"optimizer": "muon"})
    run = build_run(cfg, EXAMPLES)
    opt = make_optimizer(run.student, cfg.train)
    assert isinstance(opt, ElfMuon)
    muon, adam = ({id(p) for p in g["params"]} for g in opt.param_groups)
    assert [g["use_muon"] for g in opt.param_groups] == [True, False]
    assert muon == {id(p) for p in run.student.parameters() if p.dim() == 2} and not muon & adam
    assert muon | adam == {id(p) for p in run.student.parameters()}
    # the schedule sets every group's lr, and a resumed Muon run continues exactly
    straight = tiny_cfg(train={"optimizer": "muon", "steps": 4, "out_dir": str(tmp_path / "a")})
    train(straight, EXAMPLES)
    sliced = tiny_cfg(train={"optimizer": "muon", "steps": 4, "out_dir": str(tmp_path / "b")})
    train(sliced, EXAMPLES, stop_at=2)
    train(sliced, EXAMPLES)
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [m["total"] for m in a] == [m["total"] for m in b] and a[-1]["total"] != a[0]["total"]


def test_muon_with_fsdp2_is_refused_in_one_line(tiny_cfg):
    from elfreg.config import ConfigError

    with pytest.raises(ConfigError, match="muon is not supported with train.parallel=fsdp2"):
        tiny_cfg(train={"optimizer": "muon", "parallel": "fsdp2"})


@pytest.mark.slow  # compiling on 2 shared cores takes most of a minute
def test_compiled_blocks_train_what_eager_blocks_train(tiny_cfg, tmp_path):
    from elfreg.checkpoint import open_checkpoint

    runs = {}
    for compiled in (False, True):
        cfg = tiny_cfg(train={"steps": 3, "compile": compiled, "out_dir": str(tmp_path / str(compiled))})
        train(cfg, EXAMPLES)
        runs[compiled] = [m["total"] for m in metrics(tmp_path / str(compiled))]
        assert open_checkpoint(cfg.train.out_dir).load_student() is not None  # same parameter names
    assert runs[True] == pytest.approx(runs[False], rel=1e-3)


@pytest.mark.slow  # three compiles of the blocks, tens of seconds each on 2 shared cores
def test_a_compiled_run_resumed_in_a_new_process_repeats_the_uninterrupted_one(tiny_cfg, tmp_path):
    """The auxiliary passes run on a different number of rows each step; a resumed process meets
    those shapes in another order. ``torch._dynamo.reset()`` stands for the new process."""
    straight = tiny_cfg(train={"steps": 6, "compile": True, "out_dir": str(tmp_path / "a")})
    sliced = tiny_cfg(train={"steps": 6, "compile": True, "out_dir": str(tmp_path / "b")})
    torch._dynamo.reset()
    train(straight, EXAMPLES)
    torch._dynamo.reset()
    train(sliced, EXAMPLES, stop_at=3)
    torch._dynamo.reset()
    train(sliced, EXAMPLES)
    a, b = metrics(tmp_path / "a"), metrics(tmp_path / "b")
    assert [m["total"] for m in a] == [m["total"] for m in b] and a[-1]["total"] != a[0]["total"]
