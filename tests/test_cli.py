"""The one failure handler of the ``elfreg`` command: every expected failure is one line on
stderr, without a traceback, naming what is at fault, with a non-zero exit status."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from elfreg.cli import main


@pytest.fixture(scope="module")
def setup(tiny_assets, tmp_path_factory):
    from elfreg.data.examples import Example
    from elfreg.train.loop import train

    from conftest import tiny_config

    root = tmp_path_factory.mktemp("cli")
    cfg = tiny_config(tiny_assets, root, train={"steps": 2, "ckpt_every": 2})
    cfg.save(root / "ok.yaml")
    data = root / "data.jsonl"
    data.write_text(json.dumps({"prompt": "add 1 2", "answer": "3"}) + "\n")
    (root / "null.jsonl").write_text(json.dumps({"prompt": "add 1 2", "answer": "3"}) + "\n"
                                     + json.dumps({"prompt": None, "answer": "4"}) + "\n")
    (root / "latin1.yaml").write_bytes("train:\n  out_dir: caf\xe9\n".encode("latin-1"))
    (root / "broken.yaml").write_text("train: [steps: 3\n")
    (root / "plan.yaml").write_text("eval:\n  nfez: [4]\n")
    (root / "a_folder").mkdir()
    run = train(cfg, [Example("add 1 2", "3"), Example("add 2 2", "4")])
    broken = root / "broken_ckpt"
    shutil.copytree(run.checkpoint, broken)
    for name in ("model.safetensors", "ema.safetensors"):
        (broken / name).write_bytes((broken / name).read_bytes()[:40])
    return root


BAD = [  # (argv, what the line must name); every one is bad input: exit status 2 (docs/reliability.md)
    (["train", "--config", "{root}/missing.yaml"], "missing.yaml"),
    (["train", "--config", "{root}/a_folder"], "a_folder"),
    (["train", "--config", "{root}/latin1.yaml"], "latin1.yaml: not UTF-8"),
    (["train", "--config", "{root}/broken.yaml"], "broken.yaml: not valid YAML"),
    (["train", "--config", "{root}/ok.yaml", "train.ckpt_every=0"], "train.ckpt_every"),
    (["train", "--config", "{root}/ok.yaml", "train.log_every=0"], "train.log_every"),
    (["train", "--config", "{root}/ok.yaml", "train.warmup_steps=-10"], "train.warmup_steps"),
    (["train", "--config", "{root}/ok.yaml", "train.lr=fast"], "train.lr"),
    (["train", "--config", "{root}/ok.yaml", "train.out_dir=caf\udce9"], "train.out_dir: the value is not UTF-8"),
    (["train", "--config", "{root}/ok.yaml", "train.out_dir={root}/r1", "text.encoder=/nonexistent/enc"],
     "no such tokenizer or model folder: /nonexistent/enc"),
    (["train", "--config", "{root}/ok.yaml", "train.out_dir={root}/r2", "data.source=jsonl",
      "data.path={root}/missing.jsonl"], "missing.jsonl"),
    (["train", "--config", "{root}/ok.yaml", "train.out_dir={root}/r3", "data.source=jsonl",
      "data.path={root}/null.jsonl"], "null.jsonl:2: field 'prompt' must be a string"),
    (["train", "--config", "{root}/ok.yaml", "train.out_dir={root}/r4", "train.device=cuda"], "cuda"),
    (["train", "--config", "{root}/ok.yaml", "train.out_dir={root}/a_folder/x\x00"],
     "train.out_dir: not a valid value"),
    (["sample", "--checkpoint", "{root}/nowhere", "--prompt", "x"], "nowhere"),
    (["sample", "--checkpoint", "{root}/run", "--prompt", "x", "--nfe", "1"], "sample.nfe"),
    (["sample", "--checkpoint", "{root}/broken_ckpt", "--prompt", "x"], "broken_ckpt/ema.safetensors"),
    (["sample", "--checkpoint", "{root}/broken_ckpt", "--prompt", "x", "--raw-weights"],
     "broken_ckpt/model.safetensors"),
    (["sample", "--checkpoint", "{root}/run", "--prompts-file", "{root}/latin1.yaml"], "latin1.yaml: not UTF-8"),
    (["demo", "--config", "{root}/plan.yaml", "--out", "{root}/d"], "eval.nfez"),
    (["demo", "--quick", "eval.nfes=[1]", "--out", "{root}/d"], "eval.nfes"),
    (["data", "stats"], "give --prepared DIR (a prepared recipe) or --config FILE"),
    # the training data is read before the frozen models load: a missing file is named, not the model
    (["train", "--config", "{root}/ok.yaml", "train.out_dir={root}/r5", "text.encoder=/nonexistent/enc",
      "data.source=jsonl", "data.path={root}/missing.jsonl"], "missing.jsonl"),
    (["train", "--config", "{root}/ok.yaml", "train.device=tpu"], "train.device: must be auto or one of cpu, cuda"),
    (["plan", "--config", "{root}/ok.yaml", "--gpus", "0"], "--gpus must be >= 1, got 0"),
    (["params", "--config", "{root}/missing.yaml"], "missing.yaml"),
]


@pytest.mark.parametrize(("argv", "named"), BAD, ids=[" ".join(a[:2] + a[3:4]) for a, _ in BAD])
def test_bad_input_is_one_line_without_a_traceback(setup, capsys, argv, named):
    if "train.device=cuda" in argv and torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    capsys.readouterr()
    rc = main([a.replace("{root}", str(setup)) for a in argv])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2, err
    assert len(err) == 1 and "Traceback" not in err[0] and "Error:" not in err[0], err  # no exception name
    assert named and named.replace("{root}", str(setup)) in err[0], err


def test_debug_shows_the_traceback(setup, monkeypatch):
    monkeypatch.setenv("ELFREG_DEBUG", "1")
    with pytest.raises(FileNotFoundError):
        main(["train", "--config", str(setup / "missing.yaml")])


def test_a_read_only_output_folder_is_one_line(setup, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], capture_output=True).returncode:
        pytest.skip("mounting a tmpfs is not allowed here")
    try:
        capsys.readouterr()
        rc = main(["train", "--config", str(setup / "ok.yaml"), f"train.out_dir={ro}/run"])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert rc != 0 and len(err) == 1 and "read-only file system" in err[0] and str(ro) in err[0], err
    finally:
        subprocess.run(["umount", str(ro)], check=False)
    assert Path(ro).exists()


def test_a_reader_that_goes_away_ends_the_command_quietly():
    # `elfreg ... | head`: the pipe closes while the command still prints
    script = ("import sys, elfreg.toy.study.cli as c\n"
              "def run(args):\n"
              "    for i in range(200000):\n"
              "        print('row', i)\n"
              "c.run = run\n"
              "from elfreg.cli import main\n"
              "sys.exit(main(['study', '--plan', 'x.yaml']))\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.readline() == b"row 0\n"
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and stderr == ""


@pytest.mark.parametrize("raw, grace", [("", 10.0), ("2.5", 2.5), ("0", 0.0)])
def test_the_rank_failure_grace_comes_from_its_variable(monkeypatch, raw, grace):
    from elfreg.distributed import GRACE_ENV, rank_failure_grace_s

    monkeypatch.setenv(GRACE_ENV, raw)
    assert rank_failure_grace_s() == grace


@pytest.mark.parametrize("raw", ["soon", "-1", "nan"])
def test_a_bad_rank_failure_grace_is_refused_naming_the_variable(monkeypatch, raw):
    from elfreg.distributed import GRACE_ENV, rank_failure_grace_s

    monkeypatch.setenv(GRACE_ENV, raw)
    with pytest.raises(ValueError, match=f"{GRACE_ENV}='{raw}': must be a number of seconds >= 0"):
        rank_failure_grace_s()


def test_an_unanticipated_error_is_one_line_with_its_name_the_debug_pointer_and_status_1(monkeypatch, capsys):
    from elfreg.model import params_cli

    def bug(args):
        raise KeyError("a bug")

    monkeypatch.setattr(params_cli, "run", bug)  # registered afresh by the next build_parser()
    capsys.readouterr()
    assert main(["params", "--preset", "all"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["elfreg params: error: KeyError: 'a bug' (run with --debug for the traceback)"]


def test_a_bad_flag_value_is_two_lines_naming_the_flag_and_the_help(capsys):
    for argv, flag in ((["sample", "--checkpoint", "x", "--nfe", "abc"], "argument --nfe: invalid int value: 'abc'"),
                       (["eval", "--task", "gsm8k", "--nfes", "4,x"], "argument --nfes"),
                       (["sample", "--checkpoint", "x", "--sampler", "ddim"], "argument --sampler: invalid choice")):
        with pytest.raises(SystemExit) as exit_:
            main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert exit_.value.code == 2 and len(err) == 2, err
        assert flag in err[0] and err[1] == f"see 'elfreg {argv[0]} --help'"


def test_version_and_help_on_every_flag(capsys):
    import argparse

    from elfreg import __version__
    from elfreg.cli import build_parser

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"elfreg {__version__}"
    missing = []

    def walk(parser: argparse.ArgumentParser, path: str) -> None:
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif action.dest != "help" and not (action.help or "").strip():
                missing.append(f"{path} {action.option_strings or action.dest}")

    walk(build_parser(), "elfreg")
    assert missing == []


def test_list_flags_and_overrides_are_comma_separated():
    from elfreg.config import Config, EvalConfig
    from elfreg.config.strict import ConfigError, build_dataclass

    tiny = Path(__file__).parents[1] / "configs" / "tiny.yaml"
    assert build_dataclass(EvalConfig, {"nfes": 16}).nfes == [16]
    assert Config.load(tiny, ["eval.nfes=8,32"]).eval.nfes == [8, 32]
    assert Config.load(tiny, ["eval.nfes=[8, 32]"]).eval.nfes == [8, 32]
    both = Config.load(tiny, ["eval.samplers=early-stop,full-span"]).eval.samplers
    assert both == ["early-stop", "full-span"] and type(both[0]) is str
    assert Config.load(tiny, ["eval.samplers=full-span"]).eval.samplers == ["full-span"]
    # text in a YAML file is never split: a list there is a YAML list
    with pytest.raises(ConfigError, match="eval.samplers: expected a list"):
        build_dataclass(Config, {"eval": {"samplers": "early-stop,full-span"}})
