"""Recorded speculative-decoding steps (`spectune.trace/v1`): read, validate and write them.

A trace is what a real drafter proposed and what the real target chose, one decoding step of one
request per line, so that any tree built from a recorded candidate pool can be replayed exactly
(planner.acceptance.TraceReplay) and presets can be fitted from real behaviour. The full format
is documented in docs/trace-format.md; in short, JSON Lines (optionally gzip, `.jsonl.gz`):

line 1, the header:
    {"schema": "spectune.trace/v1", "model": str, "drafter": str, "prompt_set": str,
     "max_depth": int, "max_topk": int, "temperature": float, "notes": str}
every further line, one step (a candidate pool in parents-array form, node 0 = the root = the
last verified token):
    {"request": str, "step": int, "context_len": int,
     "parents": [int], "tokens": [int], "logprobs": [float],
     "source": ["root" | "model" | "retrieval"], "match_len": [int], "target": [int]}
target[i] is the target's next token after the path root..i (its greedy choice at T=0, its
sample at T>0). Replay: from the root, step to the child whose token equals target[current];
the accepted path is that walk, the bonus token is target[last].

Errors name the file, the line and the field.
"""

from __future__ import annotations

import gzip
import io
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np

from spectune.specs.errors import SpecError
from spectune.specs.io import MAX_ABS_INT, TRACE_LIMITS, iter_lines, loads_json
from spectune.specs.tree import SOURCE_MODEL, SOURCE_NAMES, SOURCE_RETRIEVAL, SOURCE_ROOT, DraftTree

TRACE_SCHEMA = "spectune.trace/v1"
_SOURCE_CODES = {name: code for code, name in SOURCE_NAMES.items()}
_HEADER_FIELDS = ("model", "drafter", "prompt_set", "max_depth", "max_topk", "temperature", "notes")
_STEP_FIELDS = (
    "request",
    "step",
    "context_len",
    "parents",
    "tokens",
    "logprobs",
    "source",
    "match_len",
    "target",
)


@dataclass(frozen=True)
class TraceHeader:
    """What a trace records: which models, which prompts, how wide and deep the pools are."""

    model: str
    drafter: str
    prompt_set: str
    max_depth: int
    max_topk: int
    temperature: float = 0.0
    notes: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": TRACE_SCHEMA,
            "model": self.model,
            "drafter": self.drafter,
            "prompt_set": self.prompt_set,
            "max_depth": self.max_depth,
            "max_topk": self.max_topk,
            "temperature": self.temperature,
            "notes": self.notes,
        }


@dataclass(frozen=True, eq=False)
class TraceStep:
    """One decoding step of one request: the drafter's candidate pool and the target's choices.

    pool:      DraftTree of the P recorded candidates (parents, tokens, logprobs, source)
    match_len: int32[P]  suffix-match length that proposed a retrieval node; 0 elsewhere
    target:    int64[P]  the target's next token after the path root..i
    """

    request: str
    step: int
    context_len: int
    pool: DraftTree
    match_len: np.ndarray
    target: np.ndarray

    def accepted_path(self) -> np.ndarray:
        """int32[k]: pool indices of the accepted walk, root first (exact replay of the pool)."""
        return replay_path(self.pool, self.target)

    def to_dict(self) -> dict[str, Any]:
        d = self.pool.to_dict()
        return {
            "request": self.request,
            "step": self.step,
            "context_len": self.context_len,
            "parents": d["parents"],
            "tokens": d["tokens"],
            "logprobs": d["logprobs"],
            "source": d["source"],
            "match_len": self.match_len.tolist(),
            "target": self.target.tolist(),
        }


def replay_path(tree: DraftTree, target: np.ndarray) -> np.ndarray:
    """int32[k]: from the root, step to the child whose token equals target[current] (target is
    indexed like the tree's nodes); stops where no child matches. Root first."""
    path = [0]
    first, nxt, tokens = tree.first_child, tree.next_sibling, tree.tokens
    node = 0
    while True:
        want = target[node]
        child = int(first[node])
        while child >= 0 and tokens[child] != want:
            child = int(nxt[child])
        if child < 0:
            return np.asarray(path, dtype=np.int32)
        path.append(child)
        node = child


# ---- reading --------------------------------------------------------------------------------
def _open_text(path: Path, mode: str) -> IO[str]:
    if path.name.endswith(".gz"):
        return io.TextIOWrapper(gzip.GzipFile(path, mode + "b"), encoding="utf-8")
    return open(path, mode, encoding="utf-8")


MAX_INDEX = 2**31 - 1  # match lengths are int32


def _int(v: Any, where: str, hi: int = MAX_ABS_INT) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise SpecError(f"{where}: expected an integer, got {v!r:.40}")
    if abs(v) > hi:
        raise SpecError(f"{where}: integer out of range (|x| <= {hi}), got {v!r:.40}")
    return v


def _list(v: Any, where: str, n: int | None) -> list[Any]:
    if not isinstance(v, list):
        raise SpecError(f"{where}: expected a list, got {type(v).__name__}")
    if n is not None and len(v) != n:
        raise SpecError(
            f"{where}: expected {n} entries (one per node, like 'parents'), got {len(v)}"
        )
    return v


def parse_header(obj: Any, where: str) -> TraceHeader:
    """Validate the header object of a trace (line 1)."""
    if not isinstance(obj, Mapping):
        raise SpecError(f"{where}: the header must be a JSON object")
    if obj.get("schema") != TRACE_SCHEMA:
        raise SpecError(
            f"{where}: field 'schema' must be {TRACE_SCHEMA!r}, got {obj.get('schema')!r} "
            "(line 1 of a trace is its header)"
        )
    unknown = set(obj) - {"schema", *_HEADER_FIELDS}
    if unknown:
        raise SpecError(f"{where}: unknown header field {sorted(unknown)[0]!r}")
    for key in ("model", "drafter", "prompt_set", "max_depth", "max_topk"):
        if key not in obj:
            raise SpecError(f"{where}: missing header field {key!r}")
    for key in ("model", "drafter", "prompt_set", "notes"):
        if key in obj and not isinstance(obj[key], str):
            raise SpecError(f"{where}: field {key!r} must be a string, got {obj[key]!r}")
    depth = _int(obj["max_depth"], f"{where}: field 'max_depth'")
    topk = _int(obj["max_topk"], f"{where}: field 'max_topk'")
    if depth < 1 or topk < 1:
        raise SpecError(f"{where}: fields 'max_depth' and 'max_topk' must be >= 1")
    temp = obj.get("temperature", 0.0)
    if isinstance(temp, bool) or not isinstance(temp, int | float) or temp < 0:
        raise SpecError(f"{where}: field 'temperature' must be a number >= 0, got {temp!r}")
    return TraceHeader(
        model=obj["model"],
        drafter=obj["drafter"],
        prompt_set=obj["prompt_set"],
        max_depth=depth,
        max_topk=topk,
        temperature=float(temp),
        notes=obj.get("notes", ""),
    )


def parse_step(obj: Any, where: str) -> TraceStep:
    """Validate one step object; errors name `where` (file:line) and the field."""
    if not isinstance(obj, Mapping):
        raise SpecError(f"{where}: a step must be a JSON object")
    unknown = set(obj) - set(_STEP_FIELDS)
    if unknown:
        raise SpecError(
            f"{where}: unknown field {sorted(unknown)[0]!r}; fields: {', '.join(_STEP_FIELDS)}"
        )
    for key in _STEP_FIELDS:
        if key not in obj:
            raise SpecError(f"{where}: missing field {key!r}")
    if not isinstance(obj["request"], str):
        raise SpecError(f"{where}: field 'request' must be a string")
    step = _int(obj["step"], f"{where}: field 'step'")
    ctx = _int(obj["context_len"], f"{where}: field 'context_len'")
    if step < 0 or ctx < 0:
        raise SpecError(f"{where}: fields 'step' and 'context_len' must be >= 0")
    parents = _list(obj["parents"], f"{where}: field 'parents'", None)
    n = len(parents)
    if n == 0:
        raise SpecError(f"{where}: field 'parents' must hold at least the root")
    cols: dict[str, list[Any]] = {}
    for key in ("tokens", "logprobs", "source", "match_len", "target"):
        cols[key] = _list(obj[key], f"{where}: field {key!r}", n)
    for key in ("parents", "tokens", "match_len", "target"):
        vals = parents if key == "parents" else cols[key]
        hi = MAX_INDEX if key == "match_len" else MAX_ABS_INT
        for i, v in enumerate(vals):
            _int(v, f"{where}: field {key!r}[{i}]", hi)
    for i, v in enumerate(cols["logprobs"]):
        if isinstance(v, bool) or not isinstance(v, int | float) or v != v or v > 1e-9:
            raise SpecError(f"{where}: field 'logprobs'[{i}] must be a number <= 0, got {v!r}")
    codes = []
    for i, s in enumerate(cols["source"]):
        if not isinstance(s, str) or s not in _SOURCE_CODES:
            raise SpecError(
                f"{where}: field 'source'[{i}] must be 'root', 'model' or 'retrieval', got {s!r}"
            )
        codes.append(_SOURCE_CODES[s])
    match = np.asarray(cols["match_len"], dtype=np.int32)
    if (match < 0).any():
        raise SpecError(f"{where}: field 'match_len' must be >= 0")
    bad = [i for i, c in enumerate(codes) if c != SOURCE_RETRIEVAL and match[i] != 0]
    if bad:
        raise SpecError(f"{where}: field 'match_len'[{bad[0]}] must be 0 for a non-retrieval node")
    try:
        pool = DraftTree(
            parents=np.asarray(parents, dtype=np.int64),
            tokens=np.asarray(cols["tokens"], dtype=np.int64),
            logprobs=np.asarray(cols["logprobs"], dtype=np.float64),
            source=np.asarray(codes, dtype=np.int8),
        )
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from e
    # Replay needs a child to be identified by its token: siblings must carry distinct tokens.
    key = pool.parents.astype(np.int64)[1:] * (1 << 40) + pool.tokens[1:]
    if np.unique(key).size != key.size:
        raise SpecError(f"{where}: two children of one node carry the same token (dedup the pool)")
    return TraceStep(
        request=obj["request"],
        step=step,
        context_len=ctx,
        pool=pool,
        match_len=match,
        target=np.asarray(cols["target"], dtype=np.int64),
    )


def iter_trace(path: str | os.PathLike[str]) -> tuple[TraceHeader, Iterator[TraceStep]]:
    """The header, and a lazy iterator over the steps of a trace file (.jsonl or .jsonl.gz).
    The file is streamed within TRACE_LIMITS (decompressed bytes, line length, values per
    line); every problem is a SpecError naming file:line and the field."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such trace file")
    lines = iter_lines(p, TRACE_LIMITS)
    first = next(lines, None)
    if first is None:
        raise SpecError(f"{p}: empty file; line 1 of a trace is its header")
    header = parse_header(_loads(first[1], f"{p}:1"), f"{p}:1")

    def steps() -> Iterator[TraceStep]:
        for lineno, line in lines:
            if not line.strip():
                continue
            yield parse_step(_loads(line, f"{p}:{lineno}"), f"{p}:{lineno}")

    return header, steps()


def read_trace(path: str | os.PathLike[str]) -> tuple[TraceHeader, list[TraceStep]]:
    """The header and every step of a trace file."""
    header, steps = iter_trace(path)
    return header, list(steps)


def _loads(line: str, where: str) -> Any:
    if not line.strip():
        raise SpecError(f"{where}: empty line where the trace header was expected")
    return loads_json(line, where, TRACE_LIMITS)


# ---- writing --------------------------------------------------------------------------------
class TraceWriter:
    """Append steps to a trace file; write the header first. Use as a context manager.

    Every step is validated as it is written, so a recorder fails at the bad step rather than
    leaving a trace that fails later on reading.
    """

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader) -> None:
        self.path = Path(path)
        self.header = header
        self._fh: IO[str] | None = None
        self.steps_written = 0

    def __enter__(self) -> TraceWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = _open_text(self.path, "w")
        parse_header(self.header.to_dict(), str(self.path))
        self._fh.write(json.dumps(self.header.to_dict()) + "\n")
        return self

    def write(self, step: TraceStep | Mapping[str, Any]) -> None:
        """Append one step (a TraceStep or a mapping with the step fields)."""
        if self._fh is None:
            raise RuntimeError("TraceWriter must be used inside a `with` block")
        obj = step.to_dict() if isinstance(step, TraceStep) else dict(step)
        parse_step(obj, f"{self.path}: step {self.steps_written}")
        self._fh.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self.steps_written += 1

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def write_trace(
    path: str | os.PathLike[str],
    header: TraceHeader,
    steps: Iterable[TraceStep | Mapping[str, Any]],
) -> int:
    """Write a whole trace; returns the number of steps written."""
    with TraceWriter(path, header) as w:
        for s in steps:
            w.write(s)
        return w.steps_written


def make_step(
    request: str,
    step: int,
    context_len: int,
    pool: DraftTree,
    target: Any,
    match_len: Any = None,
) -> TraceStep:
    """A TraceStep from a pool tree and the target's tokens (match_len defaults to zeros)."""
    n = pool.num_nodes
    m = np.zeros(n, dtype=np.int32) if match_len is None else np.asarray(match_len, dtype=np.int32)
    t = np.asarray(target, dtype=np.int64)
    if m.shape != (n,) or t.shape != (n,):
        raise SpecError(f"match_len and target must have shape ({n},) like the pool")
    return TraceStep(request, step, context_len, pool, m, t)


__all__ = [
    "SOURCE_MODEL",
    "SOURCE_RETRIEVAL",
    "SOURCE_ROOT",
    "TRACE_SCHEMA",
    "TraceHeader",
    "TraceStep",
    "TraceWriter",
    "iter_trace",
    "make_step",
    "parse_header",
    "parse_step",
    "read_trace",
    "replay_path",
    "write_trace",
]
