"""The lm-eval adapter: an offline end-to-end lm-eval run on a local task, generations equal to
``generate``'s, stop strings, and the one-line failures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from elfreg.config import ConfigError
from elfreg.data.examples import Example
from elfreg.interop.lm_eval_adapter import ElfregLM, UnsupportedRequest, cut_at_stops, parse_model_args
from elfreg.sampling import generate, load_checkpoint
from elfreg.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "interop" / "fixtures"
TASK = "elfreg_tiny_add"
ROWS = [json.loads(line) for line in (FIXTURES / "tiny_add.jsonl").read_text().splitlines()]
OFFLINE = {"HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _lm_eval_missing() -> str | None:
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        return "lm-eval is not installed (pip install -e '.[dev,lm-eval]')"
    return None


needs_lm_eval = pytest.mark.skipif(_lm_eval_missing() is not None, reason=str(_lm_eval_missing()))


@pytest.fixture(scope="module")
def run_dir(tiny_assets, tmp_path_factory):
    """A tiny ELF-REG checkpoint trained for three steps on the task's own kind of rows."""
    from conftest import tiny_config

    root = tmp_path_factory.mktemp("lm_eval_ckpt")
    cfg = tiny_config(tiny_assets, root, train={"steps": 3, "ckpt_every": 3}, sample={"nfe": 6, "sc_cfg": 2.0})
    return train(cfg, [Example(r["question"], r["answer"]) for r in ROWS]).run_dir


def _requests(prompts: list[str], gen_kwargs: dict) -> list[SimpleNamespace]:
    return [SimpleNamespace(args=(p, dict(gen_kwargs))) for p in prompts]


def _reference(run_dir: Path, prompts: list[str], seed: int, **sample) -> list[str]:
    models = load_checkpoint(run_dir)
    return [r.text for r in generate(models, prompts, models.config.sample.replace(**sample), seed=seed,
                                     progress=False)]


def test_generations_equal_generate_and_stops_cut(run_dir):
    prompts = [r["question"] for r in ROWS]
    lm = ElfregLM(checkpoint=str(run_dir), nfe=5, seed=3, batch_size=2, sampler="early-stop")
    expected = _reference(run_dir, prompts, seed=3, nfe=5, sampler="early-stop")
    assert lm.generate_until(_requests(prompts, {"until": [], "max_gen_toks": 10_000})) == expected
    assert any(expected), "the tiny checkpoint produced only empty answers; the stop checks below need text"
    text = next(t for t in expected if len(t) >= 2)
    stop = text[1]  # a character the answer really contains after its first one
    cut = lm.generate_until(_requests(prompts, {"until": ["never-there", stop]}))
    assert cut == [cut_at_stops(t, [stop]) for t in expected]
    assert cut[expected.index(text)] == text[: text.index(stop)] and len(cut[expected.index(text)]) < len(text)
    assert lm.generate_until(_requests(prompts, {"until": stop})) == cut  # a single string works too
    assert cut_at_stops("a+b=c#d", ["=", "+"]) == "a"  # the earliest stop wins, whatever its order


def test_loglikelihood_fails_with_one_line(run_dir):
    lm = ElfregLM(checkpoint=str(run_dir))
    for call in (lm.loglikelihood, lm.loglikelihood_rolling):
        with pytest.raises(UnsupportedRequest) as err:
            call(_requests(["add 1 2"], {}))
        message = str(err.value)
        assert "\n" not in message and "generative tasks only" in message and "generate_until" in message


def test_unknown_or_bad_model_args_fail_with_one_line(run_dir):
    with pytest.raises(ConfigError, match=r"^config error: model_args: unknown key\(s\) w \(known: checkpoint") as err:
        ElfregLM.create_from_arg_string(f"checkpoint={run_dir},w=3")
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=r"model_args\.nfe: expected int"):
        ElfregLM.create_from_arg_string(f"checkpoint={run_dir},nfe=many")
    with pytest.raises(ConfigError, match=r"sample\.nfe: must be an integer >= 2"):
        ElfregLM.create_from_arg_string(f"checkpoint={run_dir},nfe=1")
    with pytest.raises(ConfigError, match="model_args.checkpoint: required"):
        ElfregLM(nfe=4)
    assert parse_model_args("checkpoint=a/b, nfe=8,sc_cfg=2.5,reg=false,sampler=full-span") == {
        "checkpoint": "a/b", "nfe": 8, "sc_cfg": 2.5, "reg": False, "sampler": "full-span"}


@needs_lm_eval
def test_lm_eval_run_offline_end_to_end(run_dir, tmp_path):
    """``elfreg lm-eval`` in a fresh process with the Hub switched off: the local JSONL task is
    read by the datasets json builder, exact match is computed over the limit, and the logged
    answers are generate's, cut at the task's stop string."""
    out = tmp_path / "out"
    env = {**os.environ, **OFFLINE, "HF_DATASETS_CACHE": str(tmp_path / "hf"), "OMP_NUM_THREADS": "1"}
    elfreg = str(Path(sys.executable).parent / "elfreg")
    cmd = [elfreg, "lm-eval", "--checkpoint", str(run_dir), "--tasks", TASK, "--include-path", str(FIXTURES),
           "--limit", "4", "--model-args", "nfe=5,seed=3,batch_size=3", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["n-samples"][TASK]["effective"] == 4
    score = results["results"][TASK]["exact_match,none"]
    samples = [json.loads(line) for line in (out / f"samples_{TASK}.jsonl").read_text().splitlines()]
    assert sorted(s["doc_id"] for s in samples) == [0, 1, 2, 3]
    samples.sort(key=lambda s: s["doc_id"])
    expected = [cut_at_stops(t, ["#"]) for t in _reference(run_dir, [r["question"] for r in ROWS[:4]], seed=3, nfe=5)]
    assert [s["resps"][0][0] for s in samples] == expected
    assert score == pytest.approx(sum(e == r["answer"] for e, r in zip(expected, ROWS, strict=False)) / 4)


@needs_lm_eval
def test_registered_name_and_bad_args_through_the_command(run_dir, tmp_path, monkeypatch, capsys):
    """``model="elfreg"`` resolves in lm-eval's registry once the adapter is imported, and the
    command turns an unknown model_args key into one line before loading anything."""
    from lm_eval.api.registry import get_model

    from elfreg.cli import main

    assert get_model("elfreg") is ElfregLM
    assert main(["lm-eval", "--checkpoint", str(run_dir), "--tasks", TASK, "--include-path", str(FIXTURES),
                 "--model-args", "w=3"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("config error: model_args: unknown key(s) w") and "\n" not in err
    for key, value in OFFLINE.items():
        monkeypatch.setenv(key, value)
    assert main(["lm-eval", "--checkpoint", str(run_dir), "--tasks", "no_such_task"]) == 2
    assert "unknown lm-eval task(s) no_such_task" in capsys.readouterr().err


def test_without_lm_eval_the_command_fails_with_one_line(run_dir, monkeypatch, capsys):
    """Without the extra the module still imports (the class works on plain requests, as above)
    and ``elfreg lm-eval`` says what to install."""
    from elfreg.cli import main
    from elfreg.interop import lm_eval_adapter

    monkeypatch.setattr(lm_eval_adapter, "_registry", None)
    assert main(["lm-eval", "--checkpoint", str(run_dir), "--tasks", TASK]) == 1
    err = capsys.readouterr().err.strip()
    assert err == "elfreg lm-eval: error: lm-eval is not installed: pip install 'elfreg[lm-eval]' (lm-eval==0.4.13)"
