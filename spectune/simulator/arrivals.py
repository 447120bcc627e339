"""Request arrival processes: open-loop Poisson and bursty Gamma, closed-loop fixed concurrency,
and replay of a recorded trace (CSV or JSONL: arrival time, prompt tokens, output tokens).

Open-loop processes produce all arrival times up front (one numpy draw), so the spec and the
speculation-off runs see the same arrivals (common random numbers).
"""

from __future__ import annotations

import csv
import os
from array import array
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spectune.specs.errors import SpecError
from spectune.specs.io import TRACE_LIMITS, iter_lines, loads_json

MAX_TRACE_REQUESTS = 1_000_000
"""Requests one trace may hold (24 bytes each while read: memory stays bounded)."""
MAX_TOKENS = 10_000_000
"""Prompt or output tokens of one request (beyond any model's context)."""
MAX_VALUE = 1e15
"""Largest arrival time, s, or token count a trace cell may hold before the checks above."""


MAX_QPS = 1e6
"""Largest request rate, requests/s (far past any one server)."""
MAX_CV = 100.0
"""Largest cv of inter-arrival times."""
MAX_CONCURRENCY = 100_000
MAX_THINK_S = 86_400.0


def _check_rate(qps: float) -> None:
    if not 0 < qps <= MAX_QPS:
        raise SpecError(f"request rate must be in (0, {MAX_QPS:g}] requests/s, got {qps}")


@dataclass(frozen=True)
class Poisson:
    """Exponential inter-arrival times at a mean rate."""

    qps: float

    def __post_init__(self) -> None:
        _check_rate(self.qps)

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """float64[n] arrival times, s, from 0."""
        return np.cumsum(rng.exponential(1.0 / self.qps, size=n))


@dataclass(frozen=True)
class Gamma:
    """Gamma inter-arrival times: the same mean rate as Poisson, burstier when cv > 1
    (shape k = 1 / cv^2, scale = cv^2 / qps)."""

    qps: float
    cv: float = 2.0

    def __post_init__(self) -> None:
        _check_rate(self.qps)
        if not 0 < self.cv <= MAX_CV:
            raise SpecError(
                f"burstiness (cv of inter-arrival times) must be in (0, {MAX_CV:g}], got {self.cv}"
            )

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        shape = 1.0 / self.cv**2
        return np.cumsum(rng.gamma(shape, 1.0 / (shape * self.qps), size=n))


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` clients, each sending its next request `think_s` after the previous one
    finished; all start at t = 0."""

    concurrency: int
    think_s: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise SpecError(f"concurrency must be in 1..{MAX_CONCURRENCY}, got {self.concurrency}")
        if not 0 <= self.think_s <= MAX_THINK_S:
            raise SpecError(f"think time must be in [0, {MAX_THINK_S:g}] s, got {self.think_s}")


@dataclass(frozen=True)
class Trace:
    """A recorded request trace, sorted by arrival time.

    arrival_s:     float64[R]  seconds from the start of the trace
    prompt_tokens: int64[R]
    output_tokens: int64[R]
    """

    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str = "trace"

    def __len__(self) -> int:
        return int(self.arrival_s.size)


ArrivalProcess = Poisson | Gamma | ClosedLoop | Trace

_COLUMNS = {
    "arrival_s": ("arrival_s", "arrival_time", "timestamp", "time", "arrival"),
    "prompt_tokens": ("prompt_tokens", "input_tokens", "prompt_len", "input_len", "context_tokens"),
    "output_tokens": ("output_tokens", "generated_tokens", "output_len", "response_tokens"),
}


def _column(names: list[str], key: str, where: str) -> str:
    low = {n.strip().lower(): n for n in names}
    for alias in _COLUMNS[key]:
        if alias in low:
            return low[alias]
    raise SpecError(
        f"{where}: no {key} column; expected one of {', '.join(_COLUMNS[key])}, "
        f"found {', '.join(names) or 'none'}"
    )


def _number(v: object, where: str) -> float:
    """One cell as a float; SpecError naming `where` for anything float() does not take."""
    if isinstance(v, bool) or v is None or v == "":
        raise SpecError(f"{where}: expected a number, got {v!r:.40}")
    try:
        return float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        raise SpecError(f"{where}: expected a number, got {v!r:.40}") from None


def _csv_rows(p: Path, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[int, list[Any]]]:
    """(line number, [arrival, prompt, output]) per CSV row; the header row picks the columns."""
    at = [0]

    def texts() -> Iterator[str]:
        for lineno, line in lines:
            at[0] = lineno
            yield line

    reader = csv.reader(texts())
    try:
        header = next(reader, None)
        if not header:
            raise SpecError(f"{p}: empty CSV; expected a header row and one row per request")
        cols = [_column(header, k, str(p)) for k in _COLUMNS]
        idx = [header.index(c) for c in cols]
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise SpecError(f"{p}:{at[0]}: {len(row)} fields, the header has {len(header)}")
            yield at[0], [row[i] for i in idx]
    except csv.Error as e:
        raise SpecError(f"{p}:{at[0]}: not valid CSV: {e}") from None


def _jsonl_rows(p: Path, lines: Iterator[tuple[int, str]]) -> Iterator[tuple[int, list[Any]]]:
    """(line number, [arrival, prompt, output]) per JSON object line."""
    for lineno, line in lines:
        if not line.strip():
            continue
        where = f"{p}:{lineno}"
        obj = loads_json(line, where, TRACE_LIMITS)
        if not isinstance(obj, dict):
            raise SpecError(f"{where}: expected a JSON object per line")
        cols = [_column(list(obj), k, where) for k in _COLUMNS]
        row = [obj[c] for c in cols]
        for c, v in zip(cols, row, strict=True):
            if isinstance(v, bool) or not isinstance(v, int | float | str):
                raise SpecError(f"{where}: {c}: expected a number, got {v!r:.40}")
        yield lineno, row


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a CSV (header row) or JSONL (one object per line) trace, optionally gzipped.
    Columns: arrival time in seconds, prompt tokens, output tokens (common aliases accepted).
    The file is streamed within TRACE_LIMITS (decompressed bytes, line length) and holds at
    most MAX_TRACE_REQUESTS requests, kept as 32 bytes each while read. Errors name the file,
    the line and the column."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such trace file")
    name = p.name.lower().removesuffix(".gz")
    lines = iter_lines(p, TRACE_LIMITS)
    if name.endswith(".csv"):
        rows = _csv_rows(p, lines)
    elif name.endswith((".jsonl", ".ndjson")):
        rows = _jsonl_rows(p, lines)
    else:
        raise SpecError(f"{p}: unsupported trace type; use .csv or .jsonl (optionally .gz)")
    values = array("d")  # arrival, prompt, output per request
    linenos = array("q")
    for lineno, row in rows:
        if len(linenos) >= MAX_TRACE_REQUESTS:
            raise SpecError(f"{p}: more than {MAX_TRACE_REQUESTS} requests; split the trace")
        try:
            values.extend([float(v) for v in row])
        except (TypeError, ValueError, OverflowError):
            for v, k in zip(row, _COLUMNS, strict=True):
                _number(v, f"{p}:{lineno}: {k}")
            raise
        linenos.append(lineno)
    if not linenos:
        raise SpecError(f"{p}: the trace has no requests")
    a = np.frombuffer(values, dtype=np.float64).reshape(-1, 3)
    cols = list(_COLUMNS)
    lo = np.array([0.0, 1.0, 1.0])
    hi = np.array([MAX_VALUE, MAX_TOKENS, MAX_TOKENS])
    checks = (
        (~np.isfinite(a), "expected a finite number"),
        (a < lo, "must be >= 0 s (arrival) or >= 1 token"),
        (a > hi, f"must be <= {MAX_VALUE:g} s (arrival) or <= {MAX_TOKENS} tokens"),
        (
            np.c_[np.zeros(len(a), bool), a[:, 1:] != np.floor(a[:, 1:])],
            "expected a whole number of tokens",
        ),
    )
    for bad, what in checks:
        if bad.any():
            i, j = np.argwhere(bad)[0]
            raise SpecError(f"{p}:{linenos[i]}: {cols[j]}: {what}, got {a[i, j]!r}")
    order = np.argsort(a[:, 0], kind="stable")
    a = a[order]
    return Trace(
        arrival_s=a[:, 0] - a[0, 0],
        prompt_tokens=a[:, 1].astype(np.int64),
        output_tokens=a[:, 2].astype(np.int64),
        source=str(p),
    )
