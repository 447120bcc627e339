"""The `spectune` command line: one module per subcommand under spectune.cli.

Each command module defines `register(subparsers)` that adds its parser and sets `func`
(a callable taking the parsed args and returning an exit code). Bad input anywhere raises
SpecError, which becomes a one-line message on stderr and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from spectune import __version__
from spectune.specs.errors import SpecError

# Subcommand modules, in the order `spectune --help` lists them.
COMMAND_MODULES = (
    "plan",
    "worker",
    "simulate",
    "cost",
    "tree",
    "export",
    "execute",
    "calibrate",
    "check",
    "fit_workload",
    "record_traces",
    "dashboard",
    "presets",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spectune",
        description="Tune speculative-decoding draft trees per batch size for a GPU, models and workload.",
    )
    parser.add_argument("--version", action="version", version=f"spectune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        modname = f"spectune.cli.{name}"
        try:
            module = importlib.import_module(modname)
        except ModuleNotFoundError as e:
            if e.name == modname:  # command not built yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except SpecError as e:
        print(f"spectune {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
