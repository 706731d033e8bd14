"""Shared fixtures: a character-level tokenizer and tiny random Qwen3 encoder/teacher saved to
disk, loaded through the same ``from_pretrained`` path as hub models. Nothing is downloaded: the
Hub is offline and only loopback addresses can be reached (network_guard), and benchmark rows
come from the slices in ``fixtures/`` (fixtures/README.md)."""

from __future__ import annotations

import getpass
import os
import string
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch

from elfreg.compiling import use_capability_cache
from elfreg.config import Config
from elfreg.paths import data_dir
from network_guard import OFFLINE_ENV, refuse_the_network

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

# Before anything imports the Hub libraries (they read it once): the tokenizers and transformers
# imports of this module are inside its functions for that reason.
os.environ.update(OFFLINE_ENV)
refuse_the_network()

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# The whole benchmarks, where the caller has them (its $ELFREG_DATA_DIR, else the user cache's
# data/), for the tests marked full_data; every other test reads the slices.
FULL_DATA = data_dir()
os.environ["ELFREG_DATA_DIR"] = str(FIXTURES)
# One Inductor kernel cache per CPU capability (elfreg.compiling), a temporary one of the suite's own,
# unless the caller chose a folder.
use_capability_cache(Path(tempfile.gettempdir()) / f"elfreg-tests-inductor-{getpass.getuser()}")

CHARS = list(string.ascii_letters + string.digits + " .,?+-=#\n")
SPECIALS = ["<eos>"]


def make_char_tokenizer(folder: Path) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    core.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<eos>", pad_token="<eos>")
    tok.save_pretrained(folder)
    return tok


def make_tiny_lm(folder: Path, vocab: int, width: int, layers: int, seed: int) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                      num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                      head_dim=width // 4, max_position_embeddings=256, tie_word_embeddings=False)
    Qwen3ForCausalLM(cfg).save_pretrained(folder)


@pytest.fixture(scope="session")
def tiny_assets(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny_assets")
    tok = make_char_tokenizer(root / "encoder")
    make_tiny_lm(root / "encoder", len(tok), width=32, layers=3, seed=0)
    make_tiny_lm(root / "teacher", len(tok), width=48, layers=4, seed=1)
    return {"encoder": root / "encoder", "teacher": root / "teacher"}


def tiny_config(assets: dict[str, Path], tmp: Path, **sections) -> Config:
    data = {
        "text": {"encoder": str(assets["encoder"]), "encoder_layer": 2, "teacher": str(assets["teacher"]),
                 "repa_layer": 2, "reg_layer": 3, "canvas_len": 24, "prompt_cap": 10},
        "model": {"width": 32, "depth": 2, "heads": 2, "repa_block": 1, "projector_hidden": 32,
                  "time_freq_dim": 16},
        # the tests' recipe: AdamW on a cosine schedule, set here rather than left to the defaults
        # (ELF's recipe: Muon, constant after 5,000 warmup steps, EMA 0.9999)
        "train": {"steps": 4, "batch_size": 4, "warmup_steps": 1, "out_dir": str(tmp / "run"),
                  "ckpt_every": 2, "log_every": 1, "progress": False, "lr": 1e-3, "optimizer": "adamw",
                  "schedule": "cosine", "ema_decay": 0.999},
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values)
    return Config.from_dict(data)


@pytest.fixture
def tiny_cfg(tiny_assets, tmp_path):
    return lambda **sections: tiny_config(tiny_assets, tmp_path, **sections)


@pytest.fixture(autouse=True)
def _full_data(request, monkeypatch):
    """``@pytest.mark.full_data("gsm8k/train.jsonl", ...)``: the test reads the whole benchmarks
    (the data directory is :data:`FULL_DATA` for it) and skips, naming the first file missing,
    where the caller has no full copy."""
    marker = request.node.get_closest_marker("full_data")
    if marker is None:
        return
    missing = [name for name in marker.args if not (FULL_DATA / name).is_file()]
    if missing or FULL_DATA.resolve() == FIXTURES:
        where = FULL_DATA / (missing[0] if missing else marker.args[0])
        pytest.skip(f"needs the whole benchmark, not the slice of tests/fixtures: {where} not found "
                    "(set ELFREG_DATA_DIR to the full copies)")
    monkeypatch.setenv("ELFREG_DATA_DIR", str(FULL_DATA))


@pytest.fixture(autouse=True, scope="session")
def _one_thread():
    # Tiny models run fastest on one thread, and CI machines may be shared.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(autouse=True)
def _autograd_left_on():
    """The test that leaves gradients off in the process fails itself, not every training test
    after it (all tests share one process, and torch keeps the mode per thread)."""
    yield
    if not torch.is_grad_enabled():
        torch.set_grad_enabled(True)
        pytest.fail("the test left torch's autograd mode off")


def torchrun(args: list[str], nproc: int = 2, timeout: float = 240, script: Path | None = None,
             env: dict[str, str] | None = None):
    """Run ``elfreg ARGS`` (or ``python SCRIPT ARGS``) under torchrun with ``nproc`` CPU ranks
    (gloo, one thread each); returns the finished process (stdout and stderr as text). A failed
    rank waits up to 120 s for the others to fail (ELFREG_RANK_FAILURE_GRACE_S): on a shared 2-core
    machine a slower rank can take well over the default 10 s to reach the same failure."""
    import os
    import subprocess
    import sys

    elfreg = str(Path(sys.executable).parent / "elfreg")
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    launch += [str(script)] if script is not None else ["--no-python", elfreg]
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "ELFREG_RANK_FAILURE_GRACE_S": "120", **(env or {})}
    return subprocess.run(launch + args, capture_output=True, text=True, timeout=timeout, env=full_env)


@pytest.fixture(scope="session")
def served_checkpoint(tiny_assets, tmp_path_factory):
    """The serving tests' checkpoint: the cheapest real one of the toy task (the tiny test LMs,
    toy arithmetic, 4 steps; sampler default 8 NFE)."""
    from elfreg.train.loop import train

    root = tmp_path_factory.mktemp("serve")
    cfg = tiny_config(tiny_assets, root, text={"canvas_len": 64, "prompt_cap": 48},
                      data={"source": "toy-arith", "toy_count": 32}, train={"steps": 4, "ckpt_every": 4},
                      sample={"nfe": 8})
    train(cfg)
    return cfg.train.out_dir


@pytest.fixture(scope="module")
def running(served_checkpoint):
    """The serving tests' server: ``served_checkpoint`` on a loopback port, one per test module."""
    pytest.importorskip("uvicorn", reason="elfreg serve needs the serve extra")
    pytest.importorskip("openai", reason="the serving tests speak through the openai client (dev extra)")
    from serve_http import Running

    r = Running(served_checkpoint, max_batch=8, max_queue=32)
    yield r
    r.stop()
