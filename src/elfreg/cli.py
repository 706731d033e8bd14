"""The ``elfreg`` command. Each room registers its own subcommands; this module only wires them."""

from __future__ import annotations

import argparse
import importlib
import sys

# Modules that expose ``register(subparsers)``; each adds subcommands whose handler is stored
# as ``func`` in the parsed namespace. Imported lazily so ``elfreg --help`` stays fast.
_COMMAND_MODULES = [
    "elfreg.model.params_cli",
    "elfreg.train.cli",
    "elfreg.sampling.cli",
    "elfreg.eval.cli",
    "elfreg.toy.demo",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="elfreg", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in _COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
