"""vLLM server logs: the periodic stats line, the spec-decoding metrics line after it, and the
engine's launch line.

vLLM's logging format is `{prefix}(%(vllm_process_name)s pid=%(process)d) %(levelname)s
%(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s` in 0.33.0 (vllm/logger.py `_FORMAT`; older
versions print `%(levelname)s %(asctime)s [file:line] %(message)s`), so the parser looks for the
messages anywhere in a line. Every log interval (5 s by default) the stat logger prints:

1. the stats line: 0.6.6.post1 v0 `LoggingStatLogger.log` (vllm/engine/metrics.py)
   `Avg prompt throughput: X tokens/s, Avg generation throughput: G tokens/s, Running: R reqs,
   Swapped: S reqs, Pending: P reqs, ...`; V1 `LoggingStatLogger.log` (vllm/v1/metrics/loggers.py,
   0.8.5 to 0.33.0) `Engine 000: Avg prompt throughput: X tokens/s, Avg generation throughput:
   G tokens/s, Running: R reqs, Waiting: W reqs, ...`;
2. when speculating, in the same call, the spec line:
   - 0.6.6.post1 (v0), `LoggingStatLogger._format_spec_decode_metrics_str`: `Speculative metrics:
     Draft acceptance rate: 0.xxx, System efficiency: 0.xxx, Number of speculative tokens: k,
     Number of accepted tokens: A, Number of draft tokens: D, Number of emitted tokens: E.`
     (counts cumulative since start; emitted includes bonus tokens);
   - 0.8.5 to 0.10.1, `SpecDecodingLogging.log` (vllm/v1/spec_decode/metrics.py):
     `SpecDecoding metrics: Draft acceptance rate: P%, Mean acceptance length: L, Accepted: A
     tokens, Drafted: D tokens, Per-position acceptance rate: r0, r1, ...` (per interval); in
     0.8.5 L = accepted / drafts (no bonus token), from 0.9.0 L = 1 + accepted / drafts;
   - 0.11.0 to 0.33.0, the same function: `SpecDecoding metrics: Mean acceptance length: L,
     Accepted throughput: a tokens/s, Drafted throughput: d tokens/s, Accepted: A tokens,
     Drafted: D tokens, Per-position acceptance rate: r0, ..., Avg Draft acceptance rate: P%`.
   Mean acceptance length is 1 + accepted / drafts (bonus included; observations of 0.8.x lines
   are corrected to it); per-position rate i is drafts whose position i was accepted / drafts.

The launch line `Initializing a V1 LLM engine (vX.Y.Z) with config: model='...',
speculative_config=SpeculativeConfig(method='eagle3', model='...', num_spec_tokens=3), ...,
tensor_parallel_size=1, ...` (vllm/v1/engine/core.py `EngineCore.__init__`, VllmConfig.__str__;
v0: `Initializing an LLM engine (v0.6.6.post1) with config: ...`, vllm/engine/llm_engine.py,
SpeculativeConfig(draft_model='...', num_spec_tokens=k)) gives version and configuration.

A stats line and the spec line that follows it from the same process become one observation;
a stats line without one (speculation off, or no drafts in that interval) is an observation of
its own.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import replace

from spectune.specs import SpecError
from spectune.validate.engine_logs.base import (
    NO_CONFIG,
    EngineObservation,
    Line,
    StatedConfig,
    TextFormat,
    finite,
    parse_number,
    repr_field,
    repr_int,
)

_F = r"[-+]?(?:\d+(?:\.\d*)?|nan|inf)"  # a number as %.Nf prints it
_INIT = re.compile(r"Initializing an? (?:V1 )?LLM engine \(v(?P<version>[^)\s]+)\) with config: ")
_STATS = re.compile(
    r"(?:Engine (?P<engine>\d+): )?Avg prompt throughput: " + _F + r" tokens/s, "
    r"Avg generation throughput: (?P<gen>" + _F + r") tokens/s, "
    r"Running: (?P<running>\d+) reqs, (?:Swapped: \d+ reqs, Pending|Waiting): (?P<waiting>\d+) reqs"
)
_V11 = re.compile(
    r"SpecDecoding metrics: Mean acceptance length: (?P<len>" + _F + r"), "
    r"Accepted throughput: (?P<acc_tps>" + _F + r") tokens/s, "
    r"Drafted throughput: (?P<draft_tps>" + _F + r") tokens/s, "
    r"Accepted: (?P<acc>\d+) tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?P<pos>[-+\d.naif, ]*?), "
    r"Avg Draft acceptance rate: (?P<rate>" + _F + r")%\s*$"
)
_V08 = re.compile(
    r"SpecDecoding metrics: Draft acceptance rate: (?P<rate>" + _F + r")%, "
    r"Mean acceptance length: (?P<len>" + _F + r"), "
    r"Accepted: (?P<acc>\d+) tokens, Drafted: (?P<drafted>\d+) tokens, "
    r"Per-position acceptance rate: (?P<pos>[-+\d.naif, ]*?)\s*$"
)
_V0 = re.compile(
    r"Speculative metrics: Draft acceptance rate: (?P<rate>" + _F + r"), "
    r"System efficiency: (?P<eff>" + _F + r"), "
    r"Number of speculative tokens: (?P<k>\d+), Number of accepted tokens: (?P<acc>\d+), "
    r"Number of draft tokens: (?P<drafted>\d+), Number of emitted tokens: (?P<emitted>\d+)\."
)
_PID = re.compile(r"pid=(\d+)")
_TIME = re.compile(r"\b(\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)\b")
_SPEC_MARKERS = ("SpecDecoding metrics:", "Speculative metrics:")
_MAX_PENDING = 1024  # processes whose stats line waits for its spec line


def _config(text: str, version: str) -> StatedConfig:
    spec = text[text.index("speculative_config=") :] if "speculative_config=" in text else ""
    spec_cfg = spec[: spec.find(")") + 1] if spec.startswith("speculative_config=Spec") else ""
    return StatedConfig(
        target_model=repr_field(text, "model"),
        draft_model=repr_field(spec_cfg, "model") or repr_field(spec_cfg, "draft_model"),
        method=repr_field(spec_cfg, "method") or (None if not spec_cfg else "draft_model"),
        num_steps=repr_int(spec_cfg, "num_spec_tokens"),
        tp=repr_int(text, "tensor_parallel_size"),
        engine_version=version,
    )


def _v08_variant(
    length: float, per_pos: tuple[float, ...], config: StatedConfig, where: str
) -> str:
    """'0.8.5' or '0.9.0' for the `Draft acceptance rate: P%, Mean acceptance length: L` form:
    0.8.x printed L = accepted / drafts, 0.9.0 to 0.10.x print 1 + accepted / drafts. The
    per-position rates sum to accepted / drafts, which tells the two apart; else the stated
    version does."""
    if per_pos and math.isfinite(length):
        s = sum(per_pos)
        return "0.8.5" if abs(length - s) < abs(length - 1.0 - s) else "0.9.0"
    v = config.engine_version
    if v is not None:
        parts = re.findall(r"\d+", v)[:2]
        if len(parts) == 2:
            return "0.8.5" if (int(parts[0]), int(parts[1])) < (0, 9) else "0.9.0"
    raise SpecError(
        f"{where}: a vLLM 0.8 to 0.10 spec line without per-position rates or a launch line "
        "stating the version: its mean acceptance length is ambiguous (0.8.x left out the bonus token)"
    )


class VLLMLog(TextFormat):
    """vLLM server log: one observation per logging interval."""

    format_id = "vllm-log"
    engine = "vllm"
    source = (
        "vllm 0.6.6.post1 vllm/engine/metrics.py LoggingStatLogger.log, "
        "_format_spec_decode_metrics_str; 0.8.5, 0.10.1, 0.11.0, 0.33.0 "
        "vllm/v1/spec_decode/metrics.py SpecDecodingLogging.log and vllm/v1/metrics/loggers.py "
        "LoggingStatLogger.log; launch line vllm/v1/engine/core.py EngineCore.__init__"
    )

    def sniff_line(self, text: str) -> bool:
        return (
            any(m in text for m in _SPEC_MARKERS)
            or "Avg generation throughput:" in text
            or _INIT.search(text) is not None
        )

    def parse_lines(self, name: str, lines: Iterable[Line]) -> Iterator[EngineObservation]:
        config = NO_CONFIG
        pending: dict[str, EngineObservation] = {}  # process -> stats waiting for a spec line
        for ln in lines:
            t = ln.text
            init = _INIT.search(t)
            if init is not None:
                if not ln.overlong:
                    config = _config(t[init.end() :], init.group("version"))
                continue
            where = f"{name}:{ln.number}"
            is_spec = any(m in t for m in _SPEC_MARKERS)
            if not is_spec and "Avg generation throughput:" not in t:
                continue
            if ln.overlong:
                raise SpecError(f"{where}: metrics line longer than {self.max_line_bytes} bytes")
            pid = _PID.search(t[:200])
            process = f"pid={pid.group(1)}" if pid else ""
            if not is_spec:
                if process in pending:
                    yield pending.pop(process)
                elif len(pending) >= _MAX_PENDING:
                    yield pending.pop(next(iter(pending)))
                pending[process] = self._stats(name, ln, config, process)
                continue
            spec = self._spec(name, ln, config, process)
            stats = pending.pop(process, None)
            if stats is not None:
                spec = replace(
                    spec,
                    batch=stats.batch,
                    queued=stats.queued,
                    gen_tokens_per_s=stats.gen_tokens_per_s,
                    extra=stats.extra,
                )
            yield spec
        yield from pending.values()

    def _stats(self, name: str, ln: Line, config: StatedConfig, process: str) -> EngineObservation:
        where = f"{name}:{ln.number}"
        m = _STATS.search(ln.text)
        if m is None:
            tail = "" if ln.ended else " (the file ends inside this line: truncated?)"
            raise SpecError(f"{where}: unreadable vLLM stats line{tail}")
        gen = finite(parse_number(m.group("gen"), "generation throughput", where), "gen", where)
        time = _TIME.search(ln.text[: m.start()])
        engine_idx = m.group("engine")
        return EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant="v0" if engine_idx is None and "Pending:" in ln.text else "v1",
            file=name,
            line=ln.number,
            kind="interval",
            time=time.group(1) if time else None,
            process=" ".join(p for p in (process, engine_idx and f"Engine {engine_idx}") if p)
            or None,
            batch=int(m.group("running")),
            queued=int(m.group("waiting")),
            gen_tokens_per_s=gen,
            config=config,
        )

    def _spec(self, name: str, ln: Line, config: StatedConfig, process: str) -> EngineObservation:
        where = f"{name}:{ln.number}"
        t = ln.text
        time = _TIME.search(t)
        common = dict(
            engine=self.engine,
            format=self.format_id,
            file=name,
            line=ln.number,
            time=time.group(1) if time else None,
            process=process or None,
        )
        if (m := _V11.search(t)) is not None or (m := _V08.search(t)) is not None:
            drafted, accepted = int(m.group("drafted")), int(m.group("acc"))
            length = parse_number(m.group("len"), "mean acceptance length", where)
            rate = parse_number(m.group("rate"), "draft acceptance rate", where)
            pos = tuple(
                finite(parse_number(p.strip(), "per-position rate", where), "rate", where)
                for p in m.group("pos").split(",")
                if p.strip()
            )
            new = "acc_tps" in m.groupdict()
            variant = "0.11.0" if new else _v08_variant(length, pos, config, where)
            if variant == "0.8.5":
                length += 1.0  # 0.8.x printed accepted / drafts, without the bonus token
            return EngineObservation(
                **common,  # type: ignore[arg-type]
                variant=variant,
                kind="interval",
                accept_length=length if math.isfinite(length) else None,
                accept_rate=rate / 100.0 if rate == rate else None,
                per_position_accept=pos,
                draft_tokens=drafted,
                accepted_tokens=accepted,
                accepted_tokens_per_s=float(m.group("acc_tps")) if new else None,
                drafted_tokens_per_s=float(m.group("draft_tps")) if new else None,
                config=config,
            )
        if (m := _V0.search(t)) is not None:
            k, drafted = int(m.group("k")), int(m.group("drafted"))
            emitted = int(m.group("emitted"))
            rate = parse_number(m.group("rate"), "draft acceptance rate", where)
            steps = drafted / k if k > 0 else 0.0
            return EngineObservation(
                **common,  # type: ignore[arg-type]
                variant="0.6.6",
                kind="counters",
                accept_length=emitted / steps if steps > 0 else None,
                accept_rate=rate if rate == rate else None,
                drafts=int(steps) if k > 0 else None,
                draft_tokens=drafted,
                accepted_tokens=int(m.group("acc")),
                emitted_tokens=emitted,
                config=replace(config, num_steps=config.num_steps or k or None),
            )
        tail = "" if ln.ended else " (the file ends inside this line: truncated?)"
        raise SpecError(f"{where}: unreadable vLLM speculative-decoding line{tail}")
