"""What every engine-output parser shares: the observation type, a bounded line reader and the
format interface.

An `EngineObservation` is one thing an engine (or its benchmark client) reported: one logging
interval of a server, one Prometheus scrape, or one benchmark run. Every field is optional but
the provenance (engine, format, file, line); a field is None when the format does not report it,
never a guessed value. Units are in the field names.

Reading is streaming: `iter_lines` reads a file line by line through a fixed-size buffer, so a
parser holds at most one line (at most `max_line_bytes`) plus its own bounded state, whatever
the file's size. A longer line is cut at the bound and marked `overlong`; a parser that needs
such a line raises SpecError naming the file and line, any other parser skips it.
"""

from __future__ import annotations

import math
import re
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from spectune.specs import SpecError
from spectune.specs.io import help_field

LOG_LINE_BYTES = 256 * 1024
"""Longest log line kept whole (an SGLang `server_args=` line is ~10 KB; decode lines ~300 B)."""

JSON_DOC_BYTES = 64 * 1024 * 1024
"""Largest benchmark-result JSON document read (a result saved with per-request details)."""


@dataclass(frozen=True)
class StatedConfig:
    """What a file states about the run it came from (a launch-config log line, a benchmark's
    server_info). Every field is None where the file does not say."""

    target_model: str | None = help_field(None, help="target model path or name")
    draft_model: str | None = help_field(None, help="drafter model path or name")
    method: str | None = help_field(
        None, help="speculative method as the engine names it (EAGLE3, eagle3, ngram, ...)"
    )
    num_steps: int | None = help_field(
        None, help="draft steps per iteration (SGLang speculative_num_steps; vLLM num_spec_tokens)"
    )
    topk: int | None = help_field(None, help="branching per draft step (SGLang eagle_topk)")
    num_draft_tokens: int | None = help_field(
        None, help="tokens verified per request per iteration, root included (SGLang)"
    )
    tp: int | None = help_field(None, help="tensor-parallel degree")
    engine_version: str | None = help_field(None, help="engine version the file states")

    @property
    def empty(self) -> bool:
        return all(v is None for v in self.__dict__.values())


NO_CONFIG = StatedConfig()


@dataclass(frozen=True)
class EngineObservation:
    """One report of an engine: a logging interval, a metrics scrape or a benchmark run."""

    engine: str = help_field(help="engine: 'sglang' or 'vllm'")
    format: str = help_field(help="format id (engine_logs.FORMATS), e.g. 'vllm-log'")
    variant: str = help_field(
        help="which printed form of the format: the engine version it was taken from, e.g. '0.11.0'"
    )
    file: str = help_field(help="file the observation was read from")
    line: int = help_field(help="1-based line of the record in the file")
    kind: str = help_field(
        help="'interval' (a server's logging interval), 'counters' (cumulative counters since "
        "server start) or 'benchmark' (one benchmark run)"
    )
    time: str | None = help_field(None, help="timestamp as the file prints it")
    process: str | None = help_field(
        None, help="which rank or process printed it, as printed ('TP0', 'DP1 TP8', 'pid=42')"
    )
    batch: int | None = help_field(
        None, help="requests decoded together: running requests, or a one-batch run's batch size"
    )
    queued: int | None = help_field(None, help="requests waiting to be scheduled")
    concurrency: int | None = help_field(
        None, help="most requests a serving benchmark kept in flight (--max-concurrency)"
    )
    mean_concurrency: float | None = help_field(
        None, help="mean requests in flight a serving benchmark measured"
    )
    gen_tokens_per_s: float | None = help_field(
        None, help="output tokens per second over the interval or run, all requests together"
    )
    accept_length: float | None = help_field(
        None,
        help="mean tokens a request gains per verify step, the bonus token included (>= 1)",
    )
    accept_rate: float | None = help_field(
        None,
        help="fraction 0..1 as the engine defines it (vLLM: accepted / drafted tokens; SGLang: "
        "see the variant's notes); prefer accept_length",
    )
    per_position_accept: tuple[float, ...] = help_field(
        (), help="P(draft position i accepted) per draft, unconditional, position 0 first"
    )
    drafts: int | None = help_field(None, help="drafts verified (one per request per step)")
    draft_tokens: int | None = help_field(None, help="draft tokens proposed")
    accepted_tokens: int | None = help_field(None, help="draft tokens accepted (bonus excluded)")
    emitted_tokens: int | None = help_field(None, help="tokens emitted, bonus included (vLLM v0)")
    accepted_tokens_per_s: float | None = help_field(None, help="accepted draft tokens per s")
    drafted_tokens_per_s: float | None = help_field(None, help="proposed draft tokens per s")
    input_len_tokens: int | None = help_field(None, help="prompt tokens per request (one-batch)")
    output_len_tokens: int | None = help_field(None, help="output tokens per request (one-batch)")
    completed: int | None = help_field(None, help="requests a serving benchmark completed")
    duration_s: float | None = help_field(None, help="benchmark wall time, s")
    latency_s: float | None = help_field(
        None, help="one-batch run: time to generate the whole batch (prefill included), s"
    )
    decode_step_s: float | None = help_field(None, help="median time of one decode step, s")
    mean_ttft_ms: float | None = help_field(None, help="mean time to first token, ms")
    mean_tpot_ms: float | None = help_field(None, help="mean time per output token, ms")
    mean_itl_ms: float | None = help_field(None, help="mean inter-token latency, ms")
    cuda_graph: bool | None = help_field(None, help="whether the interval ran under CUDA graphs")
    config: StatedConfig = help_field(NO_CONFIG, help="what the file states about the run")  # noqa: RUF009 (frozen)
    extra: tuple[tuple[str, str], ...] = help_field(
        (), help="other printed fields, (name, text) pairs"
    )

    @property
    def speculative(self) -> bool:
        """True when the observation carries speculative-decoding figures."""
        return (
            self.accept_length is not None
            or self.drafts is not None
            or self.draft_tokens is not None
            or bool(self.per_position_accept)
        )

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"


@dataclass(frozen=True)
class Line:
    """One line of a file: 1-based number, text without the newline, and whether it was cut."""

    number: int
    text: str
    overlong: bool = False
    ended: bool = True  # False: the file ended inside this line (no newline after it)


def iter_lines(path: Path, max_line_bytes: int = LOG_LINE_BYTES) -> Iterator[Line]:
    """The lines of `path`, each at most `max_line_bytes` (longer ones cut and marked), decoded
    as UTF-8 with undecodable bytes replaced. Memory: one buffer of `max_line_bytes`."""
    try:
        f = path.open("rb")
    except OSError as e:
        raise SpecError(f"{path}: cannot read: {e.strerror or e}") from e
    with f:
        n = 0
        while True:
            raw = f.readline(max_line_bytes + 1)
            if not raw:
                return
            n += 1
            overlong = len(raw) > max_line_bytes
            ended = raw.endswith(b"\n")
            while not ended and overlong:  # skip the rest of the line, a buffer at a time
                more = f.readline(max_line_bytes)
                if not more:
                    break
                ended = more.endswith(b"\n")
            text = raw[:max_line_bytes].decode("utf-8", "replace").rstrip("\r\n")
            yield Line(n, text, overlong, ended)


def finite(value: float, what: str, where: str) -> float:
    """`value` if finite, else SpecError naming the field and place."""
    if not math.isfinite(value):
        raise SpecError(f"{where}: {what} is not a finite number ({value!r})")
    return value


class EngineFormat(ABC):
    """One engine output format: its id, engine, the source it is taken from, and how to
    recognise it. Text formats (`TextFormat`) read lines, JSON formats (`JsonFormat`) read
    documents; the reader in engine_logs/__init__.py feeds them."""

    format_id: ClassVar[str]
    engine: ClassVar[str]
    source: ClassVar[str]  # engine file, version and function that writes the format


class TextFormat(EngineFormat):
    """A line-oriented format (server logs, Prometheus text)."""

    max_line_bytes: ClassVar[int] = LOG_LINE_BYTES

    @abstractmethod
    def sniff_line(self, text: str) -> bool:
        """True when a line with this text could only come from this format."""

    @abstractmethod
    def parse_lines(self, name: str, lines: Iterable[Line]) -> Iterator[EngineObservation]:
        """The observations in `lines` of file `name`, in file order; SpecError naming file and
        line for a record of this format that cannot be read (malformed or truncated)."""


class JsonFormat(EngineFormat):
    """A benchmark-result format: one JSON object per line (JSONL), or one indented document."""

    @abstractmethod
    def sniff_keys(self, keys: frozenset[str]) -> bool:
        """True when a JSON object with these top-level keys is this format."""

    @abstractmethod
    def parse_doc(self, name: str, line: int, doc: dict[str, Any]) -> Iterator[EngineObservation]:
        """The observations of one result document that starts at `line` of file `name`."""


def parse_number(text: str, what: str, where: str, *, integer: bool = False) -> float:
    """A printed number ('12', '3.50', 'nan' -> nan); SpecError naming the field and place."""
    try:
        v = float(int(text)) if integer else float(text)
    except ValueError:
        raise SpecError(f"{where}: {what} is not a number: {text[:40]!r}") from None
    return v


def json_number(
    doc: dict[str, Any], key: str, where: str, *, integer: bool = False, required: bool = False
) -> float | None:
    """doc[key] as a finite number, None when absent or null (SpecError when required), or when
    the engine wrote its 'not available' value (a negative accept length, NaN)."""
    v = doc.get(key)
    if v is None:
        if required:
            raise SpecError(f"{where}: field {key!r} is missing")
        return None
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SpecError(f"{where}: field {key!r} must be a number, got {type(v).__name__}")
    if integer and float(v) != int(v):
        raise SpecError(f"{where}: field {key!r} must be an integer, got {v!r}")
    if not math.isfinite(v):
        if required:
            raise SpecError(f"{where}: field {key!r} is not finite ({v!r})")
        return None
    return float(v)


def opt_int(v: float | None) -> int | None:
    return None if v is None else int(v)


_REPR_VALUE = r"""\s*[=:]\s*('(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*"|[-+\w./]+)"""


def repr_field(text: str, key: str) -> str | None:
    """The value of `key` in a printed Python repr (`key=value` of a dataclass, `'key': value`
    of a dict); quotes removed; None when absent or printed as None."""
    m = re.search(r"(?<![\w.])['\"]?" + re.escape(key) + r"['\"]?" + _REPR_VALUE, text)
    if m is None:
        return None
    v = m.group(1)
    if v[:1] in "'\"":
        return v[1:-1]
    return None if v == "None" else v


def repr_int(text: str, key: str) -> int | None:
    """`repr_field` as an int; None when absent or not an integer."""
    v = repr_field(text, key)
    try:
        return None if v is None else int(v)
    except ValueError:
        return None
