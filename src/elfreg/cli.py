"""The ``elfreg`` command. Each room registers its own subcommands; this module wires them and
turns every failure into one line.

Expected failures (a bad config value, a missing or unreadable file, a full disk, a read-only
folder, a folder in use, a broken checkpoint, a missing device) print exactly one line on stderr
naming the thing at fault and exit non-zero: 2 for bad input, 1 for a failed run, 130 when
interrupted. ``--debug`` (or ``ELFREG_DEBUG=1``) shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import os
import sys
import warnings

# Modules that expose ``register(subparsers)``; each adds subcommands whose handler is stored
# as ``func`` in the parsed namespace. Imported lazily so ``elfreg --help`` stays fast.
_COMMAND_MODULES = [
    "elfreg.model.params_cli",
    "elfreg.train.cli",
    "elfreg.train.export",
    "elfreg.train.plan",
    "elfreg.sampling.cli",
    "elfreg.eval.cli",
    "elfreg.data.cli",
    "elfreg.analysis.cli",
    "elfreg.toy.demo",
    "elfreg.study.cli",
    "elfreg.interop.cli",
]
DEBUG_ENV = "ELFREG_DEBUG"


class Parser(argparse.ArgumentParser):
    """argparse with its errors in two lines: what is wrong (naming the flag and what it allows)
    and where the help is, instead of the whole usage. Subcommands' parsers are of this class too."""

    def error(self, message: str):  # noqa: D102 - argparse's contract: print and exit 2
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\nsee '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = Parser(prog="elfreg", description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", action="version", version=f"elfreg {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    for command in sub.choices.values():
        command.add_argument("--debug", action="store_true", help=f"show tracebacks (also {DEBUG_ENV}=1)")
    return parser


def describe(err: BaseException) -> tuple[str, int]:
    """(one line naming what failed, exit status) for an exception."""
    from .config import ConfigError

    if isinstance(err, ConfigError):
        return " ".join(str(err).split()), 2
    if isinstance(err, UnicodeDecodeError):
        return f"not UTF-8 text ({err.reason} at byte {err.start})", 2
    if isinstance(err, OSError) and err.errno is not None:
        reasons = {errno.ENOSPC: "disk full", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
                   errno.EROFS: "read-only file system", errno.ENOENT: "no such file or directory",
                   errno.EISDIR: "is a directory, not a file", errno.ENOTDIR: "not a directory"}
        text = err.strerror or reasons.get(err.errno, os.strerror(err.errno))
        if err.strerror and err.strerror == os.strerror(err.errno):
            text = reasons.get(err.errno, text)  # the standard wording, said plainly
        if err.filename is not None and str(err.filename) not in text:
            text = f"{text}: {err.filename}"
        return text, 2 if err.errno in (errno.ENOENT, errno.EISDIR, errno.ENOTDIR) else 1
    text = " ".join(str(err).split()) or type(err).__name__
    deliberate = isinstance(err, ValueError | FileExistsError) or type(err).__module__.startswith("elfreg")
    if not deliberate:  # not a failure elfreg anticipated: say what it was and where to look
        text = f"{type(err).__name__}: {text} (run with --debug for the traceback)"
    return text, getattr(err, "exit_status", 2 if isinstance(err, ValueError) else 1)


def _one_line_warnings(message, category, filename, lineno, line=None) -> str:
    return f"warning: {' '.join(str(message).split())}\n"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = args.debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    if not debug:
        warnings.formatwarning = _one_line_warnings
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # per-file loading bars would bury the one line that matters
        hf_logging.set_verbosity_error()
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        _one_line(f"elfreg {args.command}: interrupted")
        return 130
    except BrokenPipeError:
        # the reader went away (`elfreg ... | head`): not an error of ours; stop quietly, and keep
        # the interpreter's final flush of stdout from raising again
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except Exception as err:  # noqa: BLE001 - the one place failures become one line
        if debug:
            raise
        text, status = describe(err)
        line = text if text.startswith("config error:") else f"elfreg {args.command}: error: {text}"
        _one_line(line)
        _wait_for_the_other_ranks_to_fail()
        return status


def _one_line(line: str) -> None:
    """``line`` on stderr, after the rank prefix, in one write: the ranks of a torchrun job share
    stderr, and print() may issue a text and its newline as two writes that another rank's line
    lands between."""
    sys.stderr.write(rank_prefix() + line + "\n")
    sys.stderr.flush()


GRACE_ENV = "ELFREG_RANK_FAILURE_GRACE_S"
DEFAULT_GRACE_S = 10.0


def rank_failure_grace_s() -> float:
    """How long a failed rank waits for the others to fail (:func:`_wait_for_the_other_ranks_to_fail`):
    ``$ELFREG_RANK_FAILURE_GRACE_S`` seconds, else 10. A slow shared machine may need more; a test
    of a rank failing alone, less."""
    raw = os.environ.get(GRACE_ENV, "")
    if not raw:
        return DEFAULT_GRACE_S
    try:
        grace = float(raw)
    except ValueError:
        grace = -1.0
    if not grace >= 0:  # also refuses nan
        raise ValueError(f"{GRACE_ENV}={raw!r}: must be a number of seconds >= 0")
    return grace


def _failure_store(timeout_s: float):
    """(torchrun's store, this restart's failed-rank counter key), or None outside a torchrun job
    of two or more ranks (or where its store cannot be reached)."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world < 2 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    import datetime

    import torch.distributed as dist

    try:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                              timeout=datetime.timedelta(seconds=max(timeout_s, 1.0)))
    except (KeyError, ValueError, RuntimeError):
        return None
    return store, f"elfreg/failed-ranks/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"


def failed_ranks() -> int:
    """How many ranks of this torchrun job have failed so far (0 outside one); a readiness signal
    for tools and tests that must act after another rank's failure."""
    found = _failure_store(DEFAULT_GRACE_S)
    if found is None:
        return 0
    store, key = found
    return int(store.add(key, 0))


def _wait_for_the_other_ranks_to_fail() -> None:
    """Under torchrun, hold this rank's exit until every rank has failed or the grace
    (:func:`rank_failure_grace_s`) has passed.

    torchrun stops the remaining ranks as soon as one exits non-zero; a failure every rank meets
    (a bad config value, a missing file) would otherwise reach the user as the line of whichever
    rank got there first, and the slower ranks would be killed before saying theirs. The ranks
    count their failures in torchrun's own store, which exists before (and without) a process
    group. A failure of one rank alone costs the grace before torchrun stops the rest."""
    import time

    try:
        grace_s = rank_failure_grace_s()
    except ValueError as err:
        _one_line(f"warning: {err}; waiting {DEFAULT_GRACE_S:g} s")
        grace_s = DEFAULT_GRACE_S
    found = _failure_store(grace_s)
    if found is None:  # no store to reach: exit at once
        return
    store, key = found
    world = int(os.environ["WORLD_SIZE"])
    try:
        deadline = time.monotonic() + grace_s
        failed = store.add(key, 1)
        while failed < world and time.monotonic() < deadline:
            time.sleep(0.05)
            failed = store.add(key, 0)
    except RuntimeError:  # the store went away (torchrun is stopping the job): exit at once
        return


def rank_prefix() -> str:
    """``"rank R/N: "`` in a process that torchrun started with N > 1 (``RANK``/``WORLD_SIZE``),
    so each rank's one line says which rank failed; empty otherwise."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE", "1")
    if rank is None or world in ("", "1"):
        return ""
    return f"rank {rank}/{world}: "


if __name__ == "__main__":
    raise SystemExit(main())
