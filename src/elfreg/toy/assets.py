"""Build (or reuse) the toy assets: tokenizer, frozen encoder LM and frozen teacher LM.

Layout of one build, under ``<cache>/toy_assets/<quick|full>-<hash>/``::

    settings.json      every setting that went into the build (the hash is taken over it)
    report.json        vocabulary size, pretraining time / loss / size of each LM, and each LM's
                       digit readout per layer (:mod:`elfreg.toy.readout`)
    tokenizer/         tokenizer.json + tokenizer_config.json
    encoder/           config.json + model.safetensors + tokenizer files (a hub-style folder)
    teacher/           idem

A build is written whole or not at all (:func:`elfreg.folders.written_whole`: a temporary
sibling renamed into place when complete), so a killed build never leaves a folder that a later
call would reuse; a later build (of any settings) removes temporary folders left by dead
processes. A build stopped by SIGTERM or SIGINT stops its builder processes and removes its own
temporary folder before the signal takes its course (:mod:`elfreg.toy.builders`). Nothing is
written outside the cache.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from elfreg.device import resolve_precision
from elfreg.folders import TEMPORARY_PREFIX, written_whole
from elfreg.paths import cache_dir as default_cache_dir
from elfreg.progress import library_bars
from elfreg.text.tokenizer import load_tokenizer
from elfreg.toy.builders import LMJob, Progress, Say, duration, run_here, run_side_by_side, signals_stop_the_build
from elfreg.toy.corpus import ToyTaskConfig, lm_text, train_examples
from elfreg.toy.lm import ToyLMConfig, lm_loss, pretrain_lm
from elfreg.toy.readout import digit_readout, readout_problems
from elfreg.toy.tokenizer import DEFAULT_VOCAB_SIZE, save_tokenizer, train_tokenizer

FORMAT_VERSION = 2
"""Bump when the build procedure changes in a way that should invalidate old caches
(2: the report holds each LM's digit readout)."""

DEFAULT_ENCODER = ToyLMConfig(hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2,
                              intermediate_size=384, steps=1600, batch_size=16, lr=3e-3,
                              prompt_loss_weight=0.1, tie_embeddings=False)
"""About 0.8M parameters; ~1.5-2 min on 2 unloaded CPU cores (fp32). Untied embeddings: the
student reads layer 2, which tied builds kept the current token in by the luck of the seed
(``ToyLMConfig.tie_embeddings``)."""
DEFAULT_TEACHER = ToyLMConfig(hidden_size=192, num_layers=2, num_heads=6, num_kv_heads=2,
                              intermediate_size=512, steps=2000, batch_size=16, lr=3e-3,
                              prompt_loss_weight=0.1, seed=1)
"""About 0.95M parameters, wider than the encoder; ~3 min on 2 unloaded CPU cores (fp32)."""
QUICK_ENCODER = replace(DEFAULT_ENCODER, steps=200)
QUICK_TEACHER = replace(DEFAULT_TEACHER, steps=150)
CORPUS_SIZE = 20_000
QUICK_CORPUS_SIZE = 3_000


@dataclass(frozen=True)
class ToyAssets:
    """Folders of one toy-asset build (each LM folder also holds its tokenizer)."""

    root: Path
    tokenizer_dir: Path
    encoder_dir: Path
    teacher_dir: Path
    reused: bool
    """True when the call found a finished build and did no work."""

    @property
    def report(self) -> dict:
        """The build report (times, losses, sizes)."""
        return json.loads((self.root / "report.json").read_text())


def asset_settings(task_config: ToyTaskConfig, quick: bool, encoder: ToyLMConfig, teacher: ToyLMConfig,
                   vocab_size: int, corpus_size: int) -> dict:
    """Everything that determines a build (precision resolved); its hash names the cache folder."""
    return {"format_version": FORMAT_VERSION, "quick": quick, "task": task_config.to_dict(),
            "encoder": resolved_precision(encoder).to_dict(), "teacher": resolved_precision(teacher).to_dict(),
            "vocab_size": vocab_size,
            "corpus_size": corpus_size}


def settings_hash(settings: dict) -> str:
    """Short stable hash of a settings dict."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]


def _usable_cpus() -> int:
    """CPUs this process may run on (its affinity where the OS tells it, else the machine's)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale_tmp(base: Path) -> None:
    """Remove the temporary folders of builds (of any settings) whose process is gone: the process
    id is the tag's first part (``.tmp-<name>-<pid>-<random>``, :func:`~elfreg.folders.written_whole`)."""
    for tmp in base.glob(f"{TEMPORARY_PREFIX}*-*-*"):
        try:
            pid = int(tmp.name.rsplit("-", 2)[1])
        except ValueError:
            continue
        if not _pid_alive(pid):
            shutil.rmtree(tmp, ignore_errors=True)


def _assets(root: Path, reused: bool) -> ToyAssets:
    return ToyAssets(root=root, tokenizer_dir=root / "tokenizer", encoder_dir=root / "encoder",
                     teacher_dir=root / "teacher", reused=reused)


def resolved_precision(cfg: ToyLMConfig) -> ToyLMConfig:
    """``cfg`` with ``auto`` precision replaced by what it resolves to here. The cache key holds
    the resolved value: a bf16 build and an fp32 build are different models."""
    return replace(cfg, precision=resolve_precision("cpu", cfg.precision))


def _is_complete(root: Path) -> bool:
    return all((root / p).exists() for p in ("settings.json", "report.json", "tokenizer/tokenizer.json",
                                             "encoder/config.json", "teacher/config.json"))


def build_toy_assets(cache_dir: str | os.PathLike | None = None, task_config: ToyTaskConfig | None = None,
                     quick: bool = False, encoder: ToyLMConfig | None = None,
                     teacher: ToyLMConfig | None = None, vocab_size: int = DEFAULT_VOCAB_SIZE,
                     corpus_size: int | None = None, progress: bool = True,
                     num_threads: int | None = None, side_by_side: bool | None = None,
                     say: Say | None = None, every: float = 30.0) -> ToyAssets:
    """Build the toy tokenizer, encoder LM and teacher LM, or reuse an identical earlier build.

    ``quick`` picks the CI-sized defaults (a few seconds per LM) for ``encoder`` / ``teacher`` /
    ``corpus_size`` left as ``None``. The LMs are pretrained on the train split only (both arith
    levels and code, mixed by ``task_config``); the tokenizer is trained on the same corpus.
    The cache folder defaults to :func:`elfreg.paths.cache_dir`.

    ``side_by_side`` pretrains the two LMs at once in two child processes, each on
    ``num_threads`` torch threads (default 1); it defaults to on when this process may use two or
    more CPUs. Two small LMs on one thread each finish sooner than one after the other on two
    threads (a thread beyond the first speeds these LMs up far less than twice). Otherwise they
    train here one after the other on ``num_threads`` threads (default: torch's current
    setting). Neither choice is part of the cache key: the built weights are the same either way
    (tested), as for any thread count.

    ``say`` (one line at a time) is told what is built and where, each LM's steps every
    ``every`` seconds with the time left (unless ``progress``, the LMs' progress bars for a
    terminal, shows them), and how long the build took; a reused build says nothing.
    """
    task_config = task_config or ToyTaskConfig()
    encoder = resolved_precision(encoder or (QUICK_ENCODER if quick else DEFAULT_ENCODER))
    teacher = resolved_precision(teacher or (QUICK_TEACHER if quick else DEFAULT_TEACHER))
    corpus_size = corpus_size or (QUICK_CORPUS_SIZE if quick else CORPUS_SIZE)
    settings = asset_settings(task_config, quick, encoder, teacher, vocab_size, corpus_size)
    digest = settings_hash(settings)
    base = Path(default_cache_dir(cache_dir)) / "toy_assets"
    final = base / f"{'quick' if quick else 'full'}-{digest}"
    if _is_complete(final):
        return _assets(final, reused=True)
    base.mkdir(parents=True, exist_ok=True)
    _remove_stale_tmp(base)
    if side_by_side is None:
        side_by_side = _usable_cpus() >= 2
    said = say or (lambda _line: None)
    said(f"building the toy tokenizer and LMs (first use, cached after; {_expected_time(encoder, teacher)}) "
         f"into {final}")
    began = time.monotonic()
    try:
        with signals_stop_the_build(), written_whole(final, tag=f"{os.getpid()}-") as tmp:
            _build_into(tmp, settings, task_config, encoder, teacher, vocab_size, corpus_size, progress, num_threads,
                        side_by_side, say, every)
    except OSError:
        if not _is_complete(final):
            raise
        return _assets(final, reused=True)  # another process finished the same build first
    said(f"built the toy tokenizer and LMs in {duration(time.monotonic() - began)}")
    return _assets(final, reused=False)


def _expected_time(encoder: ToyLMConfig, teacher: ToyLMConfig) -> str:
    """How long a build of these LMs takes, where it was measured."""
    if (encoder, teacher) == tuple(resolved_precision(c) for c in (DEFAULT_ENCODER, DEFAULT_TEACHER)):
        return "about 3 minutes on 2 free CPU cores"
    if (encoder, teacher) == tuple(resolved_precision(c) for c in (QUICK_ENCODER, QUICK_TEACHER)):
        return "well under a minute"
    return "the steps of each LM are reported as it trains"


def _build_into(root: Path, settings: dict, task_config: ToyTaskConfig, encoder: ToyLMConfig,
                teacher: ToyLMConfig, vocab_size: int, corpus_size: int, progress: bool,
                num_threads: int | None, side_by_side: bool, say: Say | None, every: float) -> None:
    (root / "settings.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    examples = train_examples(task_config, corpus_size)
    t0 = time.perf_counter()
    save_tokenizer(train_tokenizer([lm_text(e) for e in examples], vocab_size), root / "tokenizer")
    report: dict = {"vocab_size": len(load_tokenizer(str(root / "tokenizer"))),
                    "tokenizer_seconds": round(time.perf_counter() - t0, 2), "corpus_size": corpus_size}
    jobs = [LMJob(name, cfg.steps, (root, name, cfg, task_config, examples, progress, position))
            for position, (name, cfg) in enumerate((("encoder", encoder), ("teacher", teacher)))]
    t0 = time.perf_counter()
    # the steps are said every `every` seconds where no progress bars show them
    with Progress(jobs, None if progress else say, every, multiprocessing.get_context("spawn")) as told:
        if side_by_side:
            reports = run_side_by_side(_build_lm, jobs, num_threads or 1, told)
        else:
            reports = run_here(_build_lm, jobs, num_threads, told)
    report.update({"encoder": reports[0], "teacher": reports[1],
                   "lm_seconds": round(time.perf_counter() - t0, 2), "lms_side_by_side": side_by_side})
    (root / "report.json").write_text(json.dumps(report, indent=2) + "\n")


def _build_lm(root: Path, name: str, cfg: ToyLMConfig, task_config: ToyTaskConfig, examples: list[dict],
              progress: bool, position: int, num_threads: int | None,
              before_step: Callable[[], int] | None = None) -> dict:
    """Pretrain one LM into ``root / name`` and return its report entry (also run in a child
    process, so it takes only picklable arguments and reads the tokenizer from ``root``), all of
    it on ``num_threads`` torch threads (None: the caller's). ``before_step`` is asked before
    every step how many threads to use from then on (it also counts the steps:
    :mod:`elfreg.toy.builders`)."""
    previous = torch.get_num_threads()
    if num_threads:
        torch.set_num_threads(num_threads)
    try:
        tokenizer = load_tokenizer(str(root / "tokenizer"))
        model, stats = pretrain_lm(cfg, tokenizer, examples, progress=progress, desc=f"toy {name}",
                                   position=position, threads_now=before_step)
        with library_bars(progress):
            model.save_pretrained(root / name)
        save_tokenizer(tokenizer, root / name)
        texts = [lm_text(e) for e in examples[:64]]
        return {**stats.__dict__, "train_loss_eval": round(lm_loss(model, tokenizer, texts), 4),
                "digit_readout": digit_readout(model, tokenizer, readout_problems(cfg=task_config.arith))}
    finally:
        torch.set_num_threads(previous)
