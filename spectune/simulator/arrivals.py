"""Request arrival processes: open-loop Poisson and bursty Gamma, closed-loop fixed concurrency,
and replay of a recorded trace (CSV or JSONL: arrival time, prompt tokens, output tokens).

Open-loop processes produce all arrival times up front (one numpy draw), so the spec and the
speculation-off runs see the same arrivals (common random numbers).
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from spectune.specs.errors import SpecError

MAX_TRACE_BYTES = 512 * 1024 * 1024


@dataclass(frozen=True)
class Poisson:
    """Exponential inter-arrival times at a mean rate."""

    qps: float

    def __post_init__(self) -> None:
        if not self.qps > 0:
            raise SpecError(f"request rate must be > 0 requests/s, got {self.qps}")

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
        if not self.qps > 0:
            raise SpecError(f"request rate must be > 0 requests/s, got {self.qps}")
        if not self.cv > 0:
            raise SpecError(f"burstiness (cv of inter-arrival times) must be > 0, got {self.cv}")

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
        if self.concurrency < 1:
            raise SpecError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.think_s < 0:
            raise SpecError(f"think time must be >= 0 s, got {self.think_s}")


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


def _number(v: object, where: str, integer: bool) -> float:
    if isinstance(v, bool) or v is None or v == "":
        raise SpecError(f"{where}: expected a number, got {v!r}")
    try:
        x = float(v)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise SpecError(f"{where}: expected a number, got {v!r}") from None
    if not np.isfinite(x):
        raise SpecError(f"{where}: expected a finite number, got {v!r}")
    if integer and not float(x).is_integer():
        raise SpecError(f"{where}: expected a whole number of tokens, got {v!r}")
    return x


def load_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a CSV (header row) or JSONL (one object per line) trace, optionally gzipped.
    Columns: arrival time in seconds, prompt tokens, output tokens (common aliases accepted).
    Errors name the file, line and field."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such trace file")
    if p.stat().st_size > MAX_TRACE_BYTES:
        raise SpecError(f"{p}: larger than {MAX_TRACE_BYTES} bytes; split the trace")
    name = p.name.lower()
    raw = p.read_bytes()
    if name.endswith(".gz"):
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise SpecError(f"{p}: not a valid gzip file: {e}") from None
        name = name[:-3]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SpecError(f"{p}: not UTF-8 text ({e}); expected CSV or JSONL") from None
    rows: list[tuple[float, float, float]] = []
    if name.endswith(".csv"):
        reader = csv.reader(io.StringIO(text))
        header = next(reader, None)
        if not header:
            raise SpecError(f"{p}: empty CSV; expected a header row and one row per request")
        cols = [_column(header, k, str(p)) for k in _COLUMNS]
        idx = [header.index(c) for c in cols]
        for lineno, row in enumerate(reader, start=2):
            if not row or all(not c.strip() for c in row):
                continue
            if len(row) != len(header):
                raise SpecError(f"{p}:{lineno}: {len(row)} fields, the header has {len(header)}")
            rows.append(
                tuple(  # type: ignore[arg-type]
                    _number(row[i], f"{p}:{lineno}: {c}", integer=k != "arrival_s")
                    for i, c, k in zip(idx, cols, _COLUMNS, strict=True)
                )
            )
    elif name.endswith((".jsonl", ".ndjson")):
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise SpecError(f"{p}:{lineno}: not valid JSON: {e}") from None
            if not isinstance(obj, dict):
                raise SpecError(f"{p}:{lineno}: expected a JSON object per line")
            keys = [str(k) for k in obj]
            cols = [_column(keys, k, f"{p}:{lineno}") for k in _COLUMNS]
            rows.append(
                tuple(  # type: ignore[arg-type]
                    _number(obj[c], f"{p}:{lineno}: {c}", integer=k != "arrival_s")
                    for c, k in zip(cols, _COLUMNS, strict=True)
                )
            )
    else:
        raise SpecError(f"{p}: unsupported trace type; use .csv or .jsonl (optionally .gz)")
    if not rows:
        raise SpecError(f"{p}: the trace has no requests")
    a = np.array(rows, dtype=np.float64)
    if (a[:, 0] < 0).any():
        i = int(np.flatnonzero(a[:, 0] < 0)[0])
        raise SpecError(f"{p}: request {i + 1}: arrival time must be >= 0 s")
    for j, what in ((1, "prompt"), (2, "output")):
        if (a[:, j] < 1).any():
            i = int(np.flatnonzero(a[:, j] < 1)[0])
            raise SpecError(f"{p}: request {i + 1}: {what} tokens must be >= 1, got {a[i, j]:g}")
    order = np.argsort(a[:, 0], kind="stable")
    a = a[order]
    return Trace(
        arrival_s=a[:, 0] - a[0, 0],
        prompt_tokens=a[:, 1].astype(np.int64),
        output_tokens=a[:, 2].astype(np.int64),
        source=str(p),
    )
