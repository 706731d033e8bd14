"""The scale-out seam: what ``parallelize`` returns is what the optimiser, EMA and steps train."""

import pytest
import torch
from train_helpers import EXAMPLES

from elfreg.train import build as build_module
from elfreg.train.build import build_run
from elfreg.train.parallel import parallelize


def test_parallelize_is_the_identity_on_one_process(tiny_cfg):
    run = build_run(tiny_cfg(), EXAMPLES)
    assert parallelize(run.student, run.cfg) is run.student


def test_build_hands_the_parallelized_student_to_optimiser_and_ema(tiny_cfg, monkeypatch):
    given = []

    def replacing(student, cfg):
        given.append(student)
        replacement = build_module.student_from_config(cfg, student.enc_dim, student.vocab_size, student.teacher_dim)
        with torch.no_grad():
            for p in replacement.parameters():
                p.fill_(0.5)
        return replacement

    monkeypatch.setattr(build_module, "parallelize", replacing)
    run = build_run(tiny_cfg(), EXAMPLES)
    assert len(given) == 1 and run.student is not given[0]
    assert next(given[0].parameters()).device == run.device  # called once the student is on its device
    optimised = [p for group in run.optimizer.param_groups for p in group["params"]]
    assert {id(p) for p in optimised} == {id(p) for p in run.student.parameters()}
    assert all(torch.all(v == 0.5) for k, v in run.ema.state_dict().items() if v.is_floating_point())


def test_training_refuses_compile_before_any_step_where_it_cannot_run(tiny_cfg, monkeypatch):
    from elfreg import compiling
    from elfreg.compiling import CompileUnavailable

    monkeypatch.setattr(compiling, "compile_problem", lambda: "InvalidCxxCompiler: none here")
    with pytest.raises(CompileUnavailable, match="none here"):
        build_run(tiny_cfg(train={"compile": True}), EXAMPLES)
