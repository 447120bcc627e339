"""The `spectune` command line: one module per subcommand under spectune.cli.

Each command module defines `register(subparsers)` that adds its parser and sets `func`
(a callable taking the parsed args and returning an exit code). Bad input anywhere raises
SpecError, which becomes a one-line message on stderr and exit code 2; so do argparse's own
errors (a bad option or an out-of-range value) and a file the system refuses (OSError, with its
path). Every message is one line and has its secrets masked (specs.errors.mask_secrets).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import textwrap
import warnings
from collections.abc import Callable, Sequence
from typing import NoReturn

from spectune import __version__
from spectune.specs.errors import SpecError, mask_secrets

# Subcommand modules, in the order `spectune --help` lists them.
COMMAND_MODULES = (
    "plan",
    "worker",
    "simulate",
    "capacity",
    "cost",
    "tree",
    "export",
    "execute",
    "calibrate",
    "check",
    "fit_workload",
    "fit_engine",
    "record_traces",
    "dashboard",
    "presets",
)


MAX_MESSAGE_CHARS = 1000


def one_line(message: str) -> str:
    """A message as one line, secrets masked, at most MAX_MESSAGE_CHARS characters."""
    text = " ".join(mask_secrets(message).split())
    return text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 3] + "..."


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors on one line (usage is one --help away), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="spectune",
        description="Tune speculative-decoding draft trees per batch size for a GPU, models and workload.",
    )
    parser.add_argument("--version", action="version", version=f"spectune {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        modname = f"spectune.cli.{name}"
        try:
            module = importlib.import_module(modname)
        except ImportError as e:
            # An optional dependency of this one command is missing (e.g. optuna on a GPU image
            # that only runs `execute`): the other commands still work, and this one says why.
            _register_unavailable(sub, name, e)
            continue
        before = set(sub.choices)
        module.register(sub)
        for command in set(sub.choices) - before:
            finish_help(sub.choices[command], module.__doc__)
    return parser


def finish_help(p: argparse.ArgumentParser, doc: str | None) -> None:
    """Every subcommand's --help: its module docstring as the description (kept as written)
    unless it set its own, and each option's default shown (HelpFormatter)."""
    if not p.description:
        p.description = doc
    elif "\n" not in p.description:  # a one-line description of its own: wrapped
        p.description = textwrap.fill(p.description, 92)
    p.formatter_class = HelpFormatter


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written, and '(default X)' after each option's help that has a default
    and does not state it itself (flags, None and suppressed defaults have none to show)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        silent = (
            (not action.option_strings and action.nargs != "?")
            or default is None
            or default is argparse.SUPPRESS
            or isinstance(default, bool)
            or default in ("", [], ())
            or "default" in text
        )
        if silent:
            return action.help
        if isinstance(default, list | tuple):
            shown = ",".join(str(v) for v in default)
        else:
            shown = f"{default:g}" if isinstance(default, float) else str(default)
        return f"{text} (default {shown.replace('%', '%%')})"


def _register_unavailable(sub: argparse._SubParsersAction, name: str, error: ImportError) -> None:
    command = name.replace("_", "-")
    missing = error.name or str(error)
    p = sub.add_parser(command, help=f"(unavailable here: cannot import {missing})", add_help=False)
    p.add_argument("rest", nargs=argparse.REMAINDER)

    def explain(_args: argparse.Namespace) -> int:
        raise SpecError(
            f"this command needs {missing!r}, which is not installed ({error}); "
            "install spectune with its extras, e.g. pip install 'spectune[gpu,dashboard]'"
        )

    p.set_defaults(func=explain)


def _route_warnings(args: argparse.Namespace) -> None:
    """Spec warnings (a pair without its own acceptance preset, an HF config format the cost
    model cannot price) print as one 'spectune CMD: warning: ...' line each; with --strict, a
    PairWarning is an error (it is a SpecError, so it exits 2 like one)."""
    from spectune.specs.compat import PairWarning
    from spectune.specs.hf_config import HFConfigWarning

    def show(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: object = None,
        line: str | None = None,
    ) -> None:
        print(f"spectune {args.command}: warning: {one_line(str(message))}", file=sys.stderr)

    warnings.showwarning = show
    for category in (PairWarning, HFConfigWarning):
        warnings.simplefilter("default", category)
    if getattr(args, "strict", False):
        warnings.simplefilter("error", PairWarning)


def _warning_line(command: str) -> Callable[..., str]:
    """warnings.formatwarning for the CLI: one masked line naming the command."""

    def fmt(message: Warning | str, *_rest: object, **_kw: object) -> str:
        return f"spectune {command}: warning: {one_line(str(message))}\n"

    return fmt


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a bad argument (already reported)
        return e.code if isinstance(e.code, int) else 2

    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    formatwarning = warnings.formatwarning
    warnings.formatwarning = _warning_line(args.command)
    try:
        with warnings.catch_warnings():
            _route_warnings(args)
            return int(args.func(args) or 0)
    except SpecError as e:
        print(f"spectune {args.command}: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader went away (`| head`): nothing more to say
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except OSError as e:  # the system refused a file: name it
        where = f"{e.filename}: " if e.filename else ""
        what = e.strerror or str(e)
        print(f"spectune {args.command}: error: {one_line(where + what)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        warnings.formatwarning = formatwarning
