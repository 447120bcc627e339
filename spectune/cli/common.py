"""Argument helpers shared by the subcommands: every numeric option has a range, every list a
length, and every output path is checked before the work starts.

A range type (`int_range`, `float_range`, `ints`, `floats`, `seed`) rejects non-numbers, NaN,
infinities and values outside [lo, hi] while argparse parses, so the message names the option:
`spectune plan: error: argument --trials: must be an integer in 1..100000, got '0'`.
`check_out_path` tells a bad --out (a folder, a missing or read-only parent, a read-only file)
before a long computation rather than after it, and creates nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from spectune.specs.engine import EngineProfile
from spectune.specs.errors import SpecError
from spectune.specs.scenario import Scenario

STORAGE_ENV = "SPECTUNE_STORAGE"
"""The environment variable carrying an Optuna storage URL: `--storage`'s default, and how
`spectune plan --workers` hands the URL (a password in it) to its workers, never on a command
line where `ps` shows it."""
MAX_SEED = 2**32 - 1
"""Seeds go to numpy and Optuna: 0..2**32-1."""
MAX_LIST_ITEMS = 64
"""Values one list option may hold (e.g. --batch 1,8,64)."""
MAX_FLOAT = 1e30
"""Magnitude bound of an option without a narrower range (as in documents: specs.io)."""
MAX_NAME_BYTES = 255
"""Longest file name most file systems take."""


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer in lo..hi."""

    def parse(text: str) -> int:
        try:
            value = int(text.strip()) if len(text) <= 40 else None
        except ValueError:
            value = None
        if value is None or not lo <= value <= hi:
            raise argparse.ArgumentTypeError(
                f"must be an integer in {_fmt(lo)}..{_fmt(hi)}, got {text[:40]!r}"
            )
        return value

    parse.__name__ = "integer"
    return parse


def float_range(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], float]:
    """An argparse type: a finite number in [lo, hi] ((lo, hi] with lo_open)."""
    span = f"{'(' if lo_open else '['}{_fmt(lo)}, {_fmt(hi)}]"

    def parse(text: str) -> float:
        try:
            value = float(text) if len(text) <= 40 else math.nan
        except ValueError:
            value = math.nan
        ok = math.isfinite(value) and (lo < value if lo_open else lo <= value) and value <= hi
        if not ok:
            raise argparse.ArgumentTypeError(
                f"must be a finite number in {span}, got {text[:40]!r}"
            )
        return value

    parse.__name__ = "number"
    return parse


def seed(text: str) -> int:
    """An argparse type: a random seed in 0..2**32-1."""
    return int_range(0, MAX_SEED)(text)


def _split(text: str, what: str) -> list[str]:
    parts = [v.strip() for v in text.split(",") if v.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected comma-separated {what}, got {text[:40]!r}")
    if len(parts) > MAX_LIST_ITEMS:
        raise argparse.ArgumentTypeError(f"at most {MAX_LIST_ITEMS} values, got {len(parts)}")
    return parts


def ints(lo: int, hi: int, *, name: str = "integers") -> Callable[[str], list[int]]:
    """An argparse type: '1,8,64' -> [1, 8, 64], each in lo..hi, at most MAX_LIST_ITEMS."""
    one = int_range(lo, hi)

    def parse(text: str) -> list[int]:
        out = []
        for part in _split(text, name):
            try:
                out.append(one(part))
            except argparse.ArgumentTypeError:
                raise argparse.ArgumentTypeError(
                    f"expected comma-separated integers in {lo}..{hi}, got {text[:60]!r}"
                ) from None
        return out

    parse.__name__ = "integer list"
    return parse


def floats(lo: float, hi: float, *, lo_open: bool = False) -> Callable[[str], list[float]]:
    """An argparse type: '0.6,0.2,0.1' -> floats, each finite in [lo, hi] ((lo, hi] with
    lo_open), at most MAX_LIST_ITEMS."""
    one = float_range(lo, hi, lo_open=lo_open)

    def parse(text: str) -> list[float]:
        out = []
        for part in _split(text, "numbers"):
            try:
                out.append(one(part))
            except argparse.ArgumentTypeError as e:
                raise argparse.ArgumentTypeError(f"{e} (in {text[:60]!r})") from None
        return out

    parse.__name__ = "number list"
    return parse


int_list = ints(0, 2**31 - 1)
"""'1,8,64' -> [1, 8, 64]: non-negative integers (prefer `ints(lo, hi)` with the option's range)."""
float_list = floats(-MAX_FLOAT, MAX_FLOAT)
"""'0.6,0.2,0.1' -> finite floats (prefer `floats(lo, hi)` with the option's range)."""


def json_text(obj: Any) -> str:
    """`obj` as strict JSON for --json output: NaN and infinities (an undefined statistic,
    e.g. TPOT of one-token outputs) become null, numpy scalars plain numbers."""

    def clean(x: Any) -> Any:
        if isinstance(x, dict):
            return {k: clean(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return [clean(v) for v in x]
        if isinstance(x, bool | int | str) or x is None:
            return x
        f = float(x)
        return f if math.isfinite(f) else None

    return json.dumps(clean(obj), allow_nan=False)


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
    "a (drafter, target) pair without an acceptance preset of its own, a T=1 preset extrapolated "
    "to the target's size, or a workload fitted for another pair, is an error instead of a "
    "warning"
)


INTERMEDIATE_HELP = (
    "intermediate model of hierarchical drafting (arXiv 2505.22179): it verifies the drafter's "
    "trees round after round and hands the target a chain; same tokenizer and vocabulary as "
    "the target. Preset or spec file (default: none, no hierarchical policies)"
)


def add_intermediate(p: argparse.ArgumentParser, *, default_help: str = "") -> None:
    """--intermediate MODEL and --intermediate-drafter MODEL: what every command that takes
    --drafter takes to name hierarchical drafting's intermediate stage (Scenario.intermediate).
    `default_help`: where the default comes from instead (a policy file's scenario)."""
    p.add_argument(
        "--intermediate",
        default=None,
        metavar="MODEL",
        help=INTERMEDIATE_HELP + (f"; {default_help}" if default_help else ""),
    )
    p.add_argument(
        "--intermediate-drafter",
        default=None,
        metavar="MODEL",
        help="the model growing the trees the intermediate verifies, e.g. the intermediate's "
        "own EAGLE head (default: --drafter)",
    )


def add_strict(p: argparse.ArgumentParser) -> None:
    """--strict: the option every command whose answer depends on acceptance takes."""
    p.add_argument("--strict", action="store_true", help=STRICT_HELP)


def check_out_path(
    path: str | os.PathLike[str], option: str = "--out", *, folder: bool = False
) -> Path:
    """`path` as a Path once it is known that the command can write it there: not empty, not a
    folder (a file where `folder`), short enough names, and a file can be created in its
    folder (or in the nearest existing ancestor, which the writer will create folders in):
    probed by creating and removing a temp file, so a read-only or virtual file system fails
    here, before the work. Leaves nothing behind; SpecError names the option."""
    text = os.fspath(path)
    if not text.strip():
        raise SpecError(f"{option}: empty path")
    p = Path(text)
    where = f"{option} {text}"
    if any(len(part.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES for part in p.parts):
        raise SpecError(f"{where}: a name in the path is longer than {MAX_NAME_BYTES} bytes")
    if p.exists() or p.is_symlink():
        if folder and not p.is_dir():
            raise SpecError(f"{where}: exists and is not a folder")
        if not folder and p.is_dir():
            raise SpecError(f"{where}: is a folder; name a file")
        if not folder and not p.is_file():
            raise SpecError(f"{where}: exists and is not a regular file")
        if not folder and not os.access(p, os.W_OK):
            raise SpecError(f"{where}: the file is not writable")
    parent = p.absolute() if folder and p.is_dir() else p.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise SpecError(f"{where}: {parent} is not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".spectune-probe-", dir=parent)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecError(f"{where}: cannot write in {parent} ({e.strerror or e})") from None
    return p


def engine_option(name: str) -> EngineProfile:
    """The engine profile --engine names (a preset or a profile file), loaded before any other
    work; a SpecError names the option."""
    from spectune.specs.engine import load_engine

    try:
        return load_engine(name)
    except SpecError as e:
        raise SpecError(f"--engine {name}: {e}") from None
