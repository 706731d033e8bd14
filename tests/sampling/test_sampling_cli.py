import json
import shutil

import pytest

from elfreg.cli import main
from elfreg.config import SampleConfig
from elfreg.data.examples import Example
from elfreg.sampling import generate, load_checkpoint
from elfreg.train.loop import train

EXAMPLES = [Example(f"add {a} {b}", f"{a}+{b}={a + b}") for a, b in [(1, 2), (3, 4), (5, 6), (7, 1)]]


@pytest.fixture(scope="module")
def run_dir(tiny_assets, tmp_path_factory):
    """A tiny ELF-REG checkpoint (REPA + REG) trained for a few steps, whose teacher is then deleted."""
    from conftest import tiny_config

    root = tmp_path_factory.mktemp("sampling_ckpt")
    assets = {name: root / name for name in ("encoder", "teacher")}
    for name, folder in assets.items():
        shutil.copytree(tiny_assets[name], folder)
    cfg = tiny_config(assets, root, train={"steps": 3, "ckpt_every": 3}, sample={"nfe": 6, "sc_cfg": 2.0})
    result = train(cfg, EXAMPLES)
    shutil.rmtree(assets["teacher"])
    return result.run_dir


@pytest.fixture
def no_teacher(monkeypatch):
    from elfreg.text import frozen as frozen_mod

    def boom(*a, **k):
        raise AssertionError("the teacher must not be used for sampling")

    monkeypatch.setattr(frozen_mod.FrozenTeacher, "__init__", boom)


def test_generate_from_checkpoint_without_teacher(run_dir, no_teacher):
    prompts = ["add 1 2", "add 13 7"]
    models = load_checkpoint(str(run_dir))
    sample = models.config.sample.replace(nfe=5, sampler="early-stop")
    out = generate(models, prompts, sample, samples=3, seed=4, progress=False)
    assert [(r.prompt_index, r.sample_index) for r in out] == [(i, j) for i in range(2) for j in range(3)]
    assert all(isinstance(r.text, str) and r.nfe == 5 for r in out)
    assert load_checkpoint(run_dir) is models  # kept in memory
    again = generate(models, prompts, sample, samples=3, seed=4, progress=False)
    assert [r.tokens for r in again] == [r.tokens for r in out]
    results = generate(models, prompts, progress=False)
    # defaults from the checkpoint config: nfe 6 (set above), sampler early-stop, w = 2
    assert models.config.sample == SampleConfig(nfe=6, sc_cfg=2.0)
    assert all(r.nfe == 6 and r.sampler == "early-stop" for r in results)


def test_cli_prints_answers_and_writes_jsonl(run_dir, no_teacher, tmp_path, capsys):
    out = tmp_path / "answers"
    argv = ["sample", "--checkpoint", str(run_dir), "--prompt", "add 1 2", "--prompt", "add 5 6",
            "--nfe", "7", "--sampler", "adaptive", "--samples", "2", "--seed", "3", "--sc-cfg", "2.5",
            "--adaptive-patience", "100", "--out", str(out), "--trajectories", "--no-progress"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    settings = json.loads((out / "settings.json").read_text())
    assert settings["sample"]["nfe"] == 7 and settings["sample"]["sc_cfg"] == 2.5 and settings["seed"] == 3
    assert settings["weights"] == "ema" and settings["samples"] == 2 and "commit" in settings["code"]
    assert [(r["prompt_index"], r["sample_index"], r["seed"]) for r in rows] == [(0, 0, 3), (0, 1, 4), (1, 0, 3),
                                                                                  (1, 1, 4)]
    assert all(r["nfe"] == 7 and r["nfe_budget"] == 7 and r["sampler"] == "adaptive" for r in rows)
    assert rows[0]["prompt"] == "add 1 2" and rows[3]["prompt"] == "add 5 6"
    assert "prompt 0: add 1 2" in printed and "prompt 1: add 5 6" in printed
    for r in rows:
        assert f"sample {r['sample_index']} (seed {r['seed']}, 7 NFE): {r['text']}" in printed
    assert len(list((out / "trajectories").glob("*.safetensors"))) == 4
    # a folder that holds samples is never overwritten; a file is not a folder
    before = (out / "samples.jsonl").read_bytes()
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("already holds samples.jsonl; give another folder or remove it")
    assert (out / "samples.jsonl").read_bytes() == before
    assert main([*argv[:-4], "--out", str(out / "samples.jsonl"), "--no-progress"]) == 2
    assert "is a file; --out names a folder" in capsys.readouterr().err
    # the same settings through the Python API give the same answers
    sample = SampleConfig(nfe=7, sampler="adaptive", sc_cfg=2.5, adaptive_patience=100)
    api = generate(load_checkpoint(run_dir), ["add 1 2", "add 5 6"], sample, samples=2, seed=3, progress=False)
    assert [r.text for r in api] == [r["text"] for r in rows]


def test_a_question_is_written_into_a_prompt_as_training_wrote_prompts(run_dir, no_teacher, tmp_path, capsys):
    """``--question Q`` on a toy-task checkpoint samples the prompt the toy data source wrote in
    training (Q and a newline; read whole, ``Q`` alone would leave the encoder a text it never saw
    end that way): the same answers as ``--prompt "Q\\n"``, listed first."""
    out = tmp_path / "q"
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "add 1 2\n", "--question", "add 1 2",
                 "--nfe", "5", "--out", str(out), "--no-progress"]) == 0
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["add 1 2\n", "add 1 2\n"] and rows[0]["text"] == rows[1]["text"]
    capsys.readouterr()


def test_cli_reports_usage_errors(run_dir, tmp_path, capsys):
    assert main(["sample", "--checkpoint", str(run_dir)]) == 2
    assert "give at least one --question, --prompt or a --prompts-file" in capsys.readouterr().err
    assert main(["sample", "--checkpoint", str(tmp_path / "missing"), "--prompt", "x", "--no-progress"]) == 2
    assert "no intact checkpoint found at" in capsys.readouterr().err
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "add 2 2"}) + "\n")
    assert main(["sample", "--checkpoint", str(run_dir), "--prompts-file", str(prompts), "--nfe", "3",
                 "--no-progress"]) == 0
    assert "prompt 0: add 2 2" in capsys.readouterr().out
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "x", "--trajectories", "--no-progress"]) == 2
    assert "--trajectories needs --out DIR" in capsys.readouterr().err
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "x", "--nfe", "1", "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == "config error: sample.nfe: must be an integer >= 2, got 1"


@pytest.mark.parametrize("flag, kept", [([], True), (["--host-memory", "release"], False)])
def test_cli_keeps_freed_memory_for_its_calls_unless_told_not_to(run_dir, no_teacher, monkeypatch, capsys,
                                                                  flag, kept):
    from elfreg import host_memory

    calls = []
    monkeypatch.setattr(host_memory, "keep_freed_memory", lambda: calls.append(1) or True)
    assert main(["sample", "--checkpoint", str(run_dir), "--prompt", "add 1 2", "--nfe", "3", "--no-progress",
                 *flag]) == 0
    assert calls == ([1] if kept else [])
    assert capsys.readouterr().out.strip()  # the answer is still printed
