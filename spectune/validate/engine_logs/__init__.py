"""Reading what serving engines produce: server logs, Prometheus metrics and benchmark results.

A serving engineer's ground truth is what the engine printed. This package turns each format
into typed `EngineObservation`s (base.py) that a fit of engine overheads, and `spectune check`,
can read. One module per format family, each citing the engine source (file, version, function)
its format is taken from:

    sglang_log       SGLang server log: `Decode batch` lines, `server_args=` launch line
    vllm_log         vLLM server log: stats line + `SpecDecoding metrics` / `Speculative metrics`
    vllm_prometheus  vLLM /metrics text: spec-decode counters
    sglang_bench     sglang.bench_serving, bench_one_batch, bench_one_batch_server JSONL
    vllm_bench       vllm bench serve JSON, vllm bench latency JSON
    aggregate        one observation per configuration and batch size of a long stream

Everything streams: text files line by line through a bounded buffer (base.iter_lines), JSON
results one line (JSONL) or one document at a time, at most `base.JSON_DOC_BYTES` each. Errors
are SpecErrors naming the file and line: an unknown format, a truncated or malformed record, a
file without speculative records (when they are required), files from different engines.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from spectune.specs import SpecError
from spectune.validate.engine_logs.base import (
    JSON_DOC_BYTES,
    LOG_LINE_BYTES,
    EngineFormat,
    EngineObservation,
    JsonFormat,
    Line,
    StatedConfig,
    TextFormat,
    iter_lines,
)
from spectune.validate.engine_logs.sglang_bench import (
    SGLangBenchOneBatch,
    SGLangBenchOneBatchServer,
    SGLangBenchServing,
)
from spectune.validate.engine_logs.sglang_log import SGLangDecodeLog
from spectune.validate.engine_logs.vllm_bench import VLLMBenchLatency, VLLMBenchServe
from spectune.validate.engine_logs.vllm_log import VLLMLog
from spectune.validate.engine_logs.vllm_prometheus import VLLMPrometheus

TEXT_FORMATS: tuple[TextFormat, ...] = (SGLangDecodeLog(), VLLMLog(), VLLMPrometheus())
JSON_FORMATS: tuple[JsonFormat, ...] = (
    SGLangBenchServing(),
    SGLangBenchOneBatch(),
    SGLangBenchOneBatchServer(),
    VLLMBenchServe(),
    VLLMBenchLatency(),
)
FORMATS: dict[str, EngineFormat] = {f.format_id: f for f in (*TEXT_FORMATS, *JSON_FORMATS)}


def _first_content(path: Path) -> Line | None:
    for ln in iter_lines(path, LOG_LINE_BYTES):
        if ln.text.strip():
            return ln
    return None


def _load_json(text: str, where: str, ended: bool = True) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        cut = not ended or e.pos >= len(text.rstrip()) or e.msg.startswith("Unterminated")
        hint = " (the file ends inside it: truncated?)" if cut else ""
        raise SpecError(f"{where}: not valid JSON: {e.msg} at column {e.colno}{hint}") from None
    except (RecursionError, ValueError) as e:
        raise SpecError(f"{where}: not valid JSON: {type(e).__name__}") from None


def _iter_json_docs(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line, object) for each JSON object of a JSONL file, or the one object of an indented
    JSON file (read whole, at most JSON_DOC_BYTES)."""
    name = str(path)
    first = _first_content(path)
    if first is None:
        return
    if first.text.strip() == "{" or (
        not first.overlong and first.text.lstrip().startswith("{") and _is_partial(first.text)
    ):
        size = path.stat().st_size
        if size > JSON_DOC_BYTES:
            raise SpecError(f"{name}: JSON document larger than {JSON_DOC_BYTES} bytes")
        doc = _load_json(path.read_bytes().decode("utf-8", "replace"), f"{name}:{first.number}")
        if not isinstance(doc, dict):
            raise SpecError(f"{name}:{first.number}: expected a JSON object")
        yield first.number, doc
        return
    for ln in iter_lines(path, JSON_DOC_BYTES):
        if not ln.text.strip():
            continue
        where = f"{name}:{ln.number}"
        if ln.overlong:
            raise SpecError(f"{where}: JSON line longer than {JSON_DOC_BYTES} bytes")
        doc = _load_json(ln.text, where, ln.ended)
        if not isinstance(doc, dict):
            raise SpecError(f"{where}: expected a JSON object, got {type(doc).__name__}")
        yield ln.number, doc


def _is_partial(text: str) -> bool:
    """True when a line opening with '{' is not a whole JSON value (an indented document)."""
    try:
        json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError):
        return True
    return False


def detect_format(path: str | os.PathLike[str]) -> EngineFormat:
    """The format of a file: JSON results by their first object's keys, text by the first line
    that only one format prints. SpecError naming the file when none matches."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(f"{p}: no such file")
    first = _first_content(p)
    if first is None:
        raise SpecError(f"{p}: empty file")
    if first.text.lstrip().startswith("{"):
        for _, doc in _iter_json_docs(p):
            keys = frozenset(doc)
            for f in JSON_FORMATS:
                if f.sniff_keys(keys):
                    return f
            shown = ", ".join(sorted(keys)[:12])
            raise SpecError(
                f"{p}:{first.number}: unknown benchmark-result JSON (keys: {shown}); known: "
                + ", ".join(f.format_id for f in JSON_FORMATS)
            )
    for ln in iter_lines(p, LOG_LINE_BYTES):
        for tf in TEXT_FORMATS:
            if tf.sniff_line(ln.text):
                return tf
    raise SpecError(
        f"{p}: unknown format: no line of an SGLang decode log, a vLLM log or vLLM /metrics, "
        f"and not a benchmark-result JSON; known: {', '.join(FORMATS)}"
    )


def _single_engine(lines: Iterable[Line], fmt: TextFormat, name: str) -> Iterator[Line]:
    """`lines`, raising SpecError at the first line another engine's format would print."""
    others = [f for f in TEXT_FORMATS if f.engine != fmt.engine]
    for ln in lines:
        for f in others:
            if f.sniff_line(ln.text):
                raise SpecError(
                    f"{name}:{ln.number}: a {f.engine} line in a {fmt.engine} file "
                    f"({fmt.format_id}): one file, one engine"
                )
        yield ln


def parse_file(
    path: str | os.PathLike[str], fmt: EngineFormat | None = None
) -> Iterator[EngineObservation]:
    """The observations of one file, streamed, in the given or the detected format."""
    p = Path(path)
    fmt = fmt or detect_format(p)
    name = str(p)
    if isinstance(fmt, TextFormat):
        yield from fmt.parse_lines(
            name, _single_engine(iter_lines(p, fmt.max_line_bytes), fmt, name)
        )
        return
    assert isinstance(fmt, JsonFormat)
    for line, doc in _iter_json_docs(p):
        if not fmt.sniff_keys(frozenset(doc)):
            other = next((f for f in JSON_FORMATS if f.sniff_keys(frozenset(doc))), None)
            what = f"a {other.format_id} result" if other else "an unknown result"
            raise SpecError(f"{name}:{line}: {what} in a {fmt.format_id} file")
        yield from fmt.parse_doc(name, line, doc)


def iter_observations(
    paths: Sequence[str | os.PathLike[str]], *, require_speculative: bool = True
) -> Iterator[EngineObservation]:
    """The observations of several files of one engine, streamed file by file.

    Formats are detected first: files of different engines are a SpecError before anything is
    read. With `require_speculative`, a file without a speculative record is a SpecError when
    its end is reached (benchmarks of plain decoding, the baseline, pass False)."""
    if not paths:
        raise SpecError("no engine output files given")
    formats = [(Path(p), detect_format(p)) for p in paths]
    engines = {f.engine for _, f in formats}
    if len(engines) > 1:
        listing = ", ".join(f"{p} ({f.engine}, {f.format_id})" for p, f in formats)
        raise SpecError(f"files of different engines in one set: {listing}")
    for p, fmt in formats:
        seen = spec = 0
        for obs in parse_file(p, fmt):
            seen += 1
            spec += obs.speculative
            yield obs
        if seen == 0:
            raise SpecError(f"{p}: no {fmt.format_id} records")
        if require_speculative and spec == 0:
            raise SpecError(
                f"{p}: {seen} {fmt.format_id} records, none with speculative-decoding figures "
                "(was speculation on? for a no-speculation baseline pass require_speculative=False)"
            )


def read_observations(
    paths: Sequence[str | os.PathLike[str]], *, require_speculative: bool = True
) -> list[EngineObservation]:
    """`iter_observations` as a list."""
    return list(iter_observations(paths, require_speculative=require_speculative))


__all__ = [
    "FORMATS",
    "JSON_FORMATS",
    "TEXT_FORMATS",
    "EngineFormat",
    "EngineObservation",
    "StatedConfig",
    "detect_format",
    "iter_observations",
    "parse_file",
    "read_observations",
]
