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
    "elfreg.train.distill",
    "elfreg.train.export",
    "elfreg.train.plan",
    "elfreg.sampling.cli",
    "elfreg.eval.cli",
    "elfreg.data.cli",
    "elfreg.analysis.cli",
    "elfreg.toy.demo",
    "elfreg.toy.ar_baseline",
    "elfreg.toy.study.cli",
    "elfreg.interop.cli",
    "elfreg.serve.cli",
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
    if getattr(args, "no_progress", False):
        from .progress import silence_library_bars

        silence_library_bars()  # the libraries' bars too, in child processes as well
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
        from .distributed import wait_for_the_other_ranks_to_fail

        text, status = describe(err)
        if text.startswith("config error:"):
            line = text
        elif status == 130:  # stopped at a safe point by a signal: not an error, and resumable
            line = f"elfreg {args.command}: {text}"
        else:
            line = f"elfreg {args.command}: error: {text}"
        _one_line(line)
        wait_for_the_other_ranks_to_fail(warn=_one_line)
        return status


def _one_line(line: str) -> None:
    """``line`` on stderr, after the rank prefix, in one write: the ranks of a torchrun job share
    stderr, and print() may issue a text and its newline as two writes that another rank's line
    lands between."""
    from .distributed import rank_prefix

    sys.stderr.write(rank_prefix() + line + "\n")
    sys.stderr.flush()



if __name__ == "__main__":
    raise SystemExit(main())
