"""The ``scout`` console script: one subcommand per public module in :mod:`scout.commands`."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

import scout.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="scout",
        description="Name the rank, GPU or host at fault in a distributed training job.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_info in sorted(pkgutil.iter_modules(scout.commands.__path__), key=lambda m: m.name):
        if module_info.name.startswith("_"):
            continue  # shared helpers of the commands, not a command
        module = importlib.import_module(f"scout.commands.{module_info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
