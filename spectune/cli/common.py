"""Argument helpers shared by the subcommands."""

from __future__ import annotations

import argparse

from spectune.specs.errors import SpecError


def int_list(text: str) -> list[int]:
    """Parse '1,8,64' into [1, 8, 64] (positive integers)."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers like 1,8,64, got {text!r}"
        ) from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(
            f"expected non-negative integers like 1,8,64, got {text!r}"
        )
    return values


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
