"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any, TextIO

from spectune.specs.errors import SpecError
from spectune.specs.io import parse_int_list
from spectune.specs.scenario import Scenario


def int_list(text: str) -> list[int]:
    """Parse '1,8,64' into [1, 8, 64] (non-negative integers) for argparse."""
    try:
        return parse_int_list(text, "list")
    except SpecError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("list: ")) from None


def float_list(text: str) -> list[float]:
    """Parse '0.6,0.2,0.1' into floats."""
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated numbers, got {text!r}"
        ) from None
    if not values:
        raise argparse.ArgumentTypeError(f"expected at least one number, got {text!r}")
    return values


def positive(value: int, name: str) -> int:
    if value <= 0:
        raise SpecError(f"--{name} must be positive, got {value}")
    return value


def scenario_with_flags(
    base: Scenario, flags: Mapping[str, Any], source: str | None, out: TextIO | None = None
) -> Scenario:
    """`base` with the scenario fields the user passed as flags (`flags` holds only those).
    When the base is a policy file's scenario (`source` names the file), each flag that
    changes it prints one line naming the field, the file's value and the new value."""
    scenario = base.replace(**flags)
    if source is not None:
        for name, old, new in base.changes(scenario):
            print(
                f"note: --{name.replace('_', '-')} overrides {source}'s scenario: "
                f"{name} {old} -> {new}",
                file=out or sys.stderr,
            )
    return scenario


STRICT_HELP = (
    "a (drafter, target) pair without an acceptance preset of its own, or a workload fitted for "
    "another pair, is an error instead of a warning"
)


def add_strict(p: argparse.ArgumentParser) -> None:
    """--strict: the option every command whose answer depends on acceptance takes."""
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)
