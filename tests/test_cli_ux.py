"""The command line as a new user meets it: complete --help, the deployment at the end of
`spectune plan`, exports as simulate policies, capacity, --csv / --plot, fit-workload's
held-out check, and exit code 2 on bad values of the new options."""

from __future__ import annotations

import argparse

import pytest

from spectune.cli import build_parser

_NO_DEFAULT = (
    argparse._HelpAction,
    argparse._VersionAction,
    argparse._StoreTrueAction,
    argparse._StoreFalseAction,
    argparse._StoreConstAction,
)


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    return dict(sub.choices)  # type: ignore[arg-type]


def _missing_defaults(p: argparse.ArgumentParser) -> list[str]:
    """Options with a default (not None) whose help, as the parser's formatter renders it,
    says nothing of it."""
    formatter = p._get_formatter()
    out = []
    for a in p._actions:
        if isinstance(a, _NO_DEFAULT) or not a.option_strings:
            continue
        if a.default is None or a.default is argparse.SUPPRESS:
            continue
        shown = formatter._expand_help(a) if a.help else ""
        if "default" not in shown:
            out.append(a.option_strings[-1])
    return out


@pytest.mark.parametrize("name", sorted(_subparsers()))
def test_every_subcommand_help_is_complete(name: str) -> None:
    """Each subcommand has a description, a help line, and every option a help text; each
    option with a default says it."""
    p = _subparsers()[name]
    if p.prog.endswith(name) and any(a.dest == "rest" for a in p._actions):
        pytest.skip(f"{name} is unavailable here (optional dependency missing)")
    assert p.description and len(p.description.split()) >= 5, f"{name}: no description"
    for a in p._actions:
        if isinstance(a, argparse._HelpAction):
            continue
        assert a.help, f"{name} {a.option_strings or a.dest}: no help"
    assert not _missing_defaults(p), f"{name}: defaults not shown for {_missing_defaults(p)}"
    text = p.format_help()
    assert "usage:" in text


def test_help_checker_catches_a_missing_default() -> None:
    """The completeness check above can fail: an option with a silent default is found."""
    p = argparse.ArgumentParser(description="a parser for this test only")
    p.add_argument("--x", type=int, default=3, help="some number")
    p.add_argument("--y", type=int, default=3, help="another (default 3)")
    assert _missing_defaults(p) == ["--x"]
    from spectune.cli import finish_help

    finish_help(p, "the module docstring")  # what build_parser does to every subcommand
    assert _missing_defaults(p) == []
    assert "(default 3)" in p.format_help() and p.description == "a parser for this test only"
