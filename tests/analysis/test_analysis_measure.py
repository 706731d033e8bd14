"""The sampling side of the trajectory analysis on a random student whose answers vary: the
readouts are those of early-stop at each budget, the endpoint agrees with itself by
construction, and Prop. 2's head-space condition is a certificate where it holds."""

from __future__ import annotations

import copy
import dataclasses
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elfreg.analysis.measure import Plan, head_lipschitz, measure_batch
from elfreg.analysis.report import prop2
from elfreg.config import ModelConfig, SampleConfig
from elfreg.model.student import Student
from elfreg.sampling.generation import SamplingModels, generate
from elfreg.text.load import load_frozen_text

PROMPTS = ["add 1 2", "what is 13+29?", "x"]
SAMPLE = SampleConfig(sc_cfg=1.0)


@pytest.fixture(scope="module")
def models(tiny_assets):
    from conftest import tiny_config

    cfg = tiny_config(tiny_assets, tiny_assets["encoder"].parent, sample={"sc_cfg": 1.0})
    frozen = load_frozen_text(cfg.text, with_teacher=False)
    torch.manual_seed(0)
    mcfg = ModelConfig(width=32, depth=2, heads=2, repa_block=1, projector_hidden=16, time_freq_dim=16, repa=False)
    student = Student(mcfg, frozen.encoder.width, frozen.encoder.vocab_size, teacher_dim=48)
    # clean predictions (and answers) depend on the noise
    torch.nn.init.normal_(student.final_layer.linear.weight, std=0.3)
    torch.nn.init.normal_(student.reg_head.linear.weight, std=0.3)
    return SamplingModels(student.eval(), frozen, cfg, Path("random"), "fp32")


@pytest.fixture(scope="module")
def measured(models):
    plan = Plan.make(16, [4, 8], observe_every=2, uniform=5)
    return plan, measure_batch(models, PROMPTS, 3, plan, SAMPLE, batch_size=2, precision="fp32")


def test_each_readout_is_early_stop_at_that_budget(models, measured):
    plan, rows = measured
    for n in plan.nfes:
        alone = generate(models, PROMPTS, SAMPLE.replace(nfe=n, rho=plan.master // n), seed=3, progress=False)
        assert [r["nfe"][str(n)]["text"] for r in rows] == [a.text for a in alone]
    assert [r["endpoint"]["text"] for r in rows] == [r["nfe"]["16"]["text"] for r in rows]
    # the readouts differ from the endpoint somewhere, so the checks below are not vacuous
    assert any(not r["nfe"][str(n)]["exact"] for r in rows for n in plan.nfes)


def test_metrics_are_in_range_and_the_endpoint_agrees_by_construction(measured):
    plan, rows = measured
    for r in rows:
        cells = [r["nfe"][str(n)] for n in plan.reported]
        assert all(0 <= c["stable"] <= 1 and c["endpoint_error"] >= 0 for c in cells)
        assert [c["t"] for c in cells] == sorted(c["t"] for c in cells)
        assert [c["stable"] for c in cells] == sorted(c["stable"] for c in cells)  # never falls
        end = r["nfe"][str(plan.master)]
        assert end["stable"] == 1.0 and end["exact"] and end["endpoint_error"] == 0 and end["joint_error"] == 0
        for n in plan.nfes:  # exact agreement at every later observation means every token is stable
            assert r["nfe"][str(n)]["stable"] < 1.0 or r["nfe"][str(n)]["exact"]


def test_prop2_on_the_head_is_a_certificate_and_prop1_rows_have_their_shapes(models, measured):
    plan, rows = measured
    lip = head_lipschitz(models)
    assert lip > 0
    for r in rows:
        assert r["prop2"]["margin"] >= 0 and set(r["prop2"]["error"]) == {"4", "8"}
        for n in plan.nfes:
            error = r["prop2"]["error"][str(n)]
            assert error >= 0 and prop2(r, n, lip) == (lip * error < r["prop2"]["margin"])
        acc = r["acceleration"]
        assert len(acc["a"]) == 3 and len(acc["A"]) == len(acc["error"]) == 4
        assert acc["A"] == sorted(acc["A"], reverse=True) and all(a >= 0 for a in acc["a"])


def test_where_prop2_holds_the_readouts_decode_as_the_endpoint(models):
    """This random student's margins are far too thin for Prop. 2 to hold (L·e is several times m).
    A bias of 200 on one token's logit widens every margin by about 200 and leaves L (a bound on
    the weights' slopes) and the head-space errors (under 10 here) as they were, so the condition
    holds at every observation, and there it certifies the decode: each readout reads as the
    endpoint."""
    steady = copy.deepcopy(models.student)
    with torch.no_grad():
        steady.vocab_head.bias[models.frozen.tokenizer.convert_tokens_to_ids("7")] += 200.0
    certain = dataclasses.replace(models, student=steady)
    plan = Plan.make(16, [4, 8], observe_every=2, uniform=5)
    rows = measure_batch(certain, PROMPTS, 3, plan, SAMPLE, batch_size=2, precision="fp32")
    lip = head_lipschitz(certain)
    assert lip == pytest.approx(head_lipschitz(models))
    assert all(r["prop2"]["error"][str(n)] > 0 and prop2(r, n, lip) for r in rows for n in plan.nfes)
    # every token in place, as the check of the random student above expects of exact readouts
    assert all(r["nfe"][str(n)]["exact"] and r["nfe"][str(n)]["stable"] == 1.0 for r in rows for n in plan.nfes)
    assert all(r["endpoint"]["text"] and set(r["endpoint"]["text"]) == {"7"} for r in rows)


def test_importing_the_analysis_leaves_sampling_generate_the_function():
    # the function's module is sampling/generation.py: no submodule shares the export's name
    code = ("import types, elfreg.sampling.generation, elfreg.analysis.measure\nfrom elfreg.sampling import generate\n"
            "assert not isinstance(generate, types.ModuleType), generate")
    subprocess.run([sys.executable, "-c", code], check=True)
