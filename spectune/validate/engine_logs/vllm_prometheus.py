"""vLLM's Prometheus `/metrics` text: the spec-decoding counters of one scrape.

Metric definitions read:
- V1 (0.8.5 to 0.33.0), vllm/v1/spec_decode/metrics.py `SpecDecodingProm.__init__`: counters
  `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
  `vllm:spec_decode_num_accepted_tokens`, and `vllm:spec_decode_num_accepted_tokens_per_pos`
  with a `position` label; prometheus_client exposes each counter as `<name>_total` (plus
  `<name>_created`). Labels `model_name` and `engine` (vllm/v1/metrics/loggers.py
  `PrometheusStatLogger`), where the gauge `vllm:num_requests_running` and the counter
  `vllm:generation_tokens` are defined too.
- v0 (0.6.6.post1), vllm/engine/metrics.py `Metrics.__init__`: gauges
  `vllm:spec_decode_draft_acceptance_rate`, `vllm:spec_decode_efficiency` and counters
  `vllm:spec_decode_num_accepted_tokens_total`, `..._num_draft_tokens_total`,
  `..._num_emitted_tokens_total` (no draft count: accept length is left None).

Counters are cumulative since server start: one scrape gives one observation per `engine` label
(kind 'counters'); two scrapes around a benchmark give its interval by difference (what `vllm
bench serve` does, vllm/benchmarks/serve.py `fetch_spec_decode_metrics`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from spectune.specs import SpecError
from spectune.validate.engine_logs.base import EngineObservation, Line, StatedConfig, TextFormat

_SAMPLE = re.compile(
    r"^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?\s*$"
)
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*,?')
_SPEC = "vllm:spec_decode_"
_WANTED = (
    _SPEC + "num_drafts_total",
    _SPEC + "num_draft_tokens_total",
    _SPEC + "num_accepted_tokens_total",
    _SPEC + "num_accepted_tokens_per_pos_total",
    _SPEC + "num_emitted_tokens_total",
    _SPEC + "draft_acceptance_rate",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
)
_MAX_GROUPS = 4096  # distinct engine label values kept
_MAX_POSITIONS = 1024


@dataclass
class _Group:
    line: int
    model: str | None
    values: dict[str, float] = field(default_factory=dict)
    per_pos: dict[int, float] = field(default_factory=dict)


def _labels(text: str, where: str) -> dict[str, str]:
    out: dict[str, str] = {}
    pos = 0
    while pos < len(text):
        m = _LABEL.match(text, pos)
        if m is None:
            raise SpecError(f"{where}: unreadable metric labels {{{text[:80]}}}")
        out[m.group(1)] = m.group(2)
        pos = m.end()
    return out


class VLLMPrometheus(TextFormat):
    """A vLLM /metrics scrape: one observation per engine label that has spec counters."""

    format_id = "vllm-prometheus"
    engine = "vllm"
    source = (
        "vllm 0.8.5 to 0.33.0 vllm/v1/spec_decode/metrics.py SpecDecodingProm.__init__ and "
        "vllm/v1/metrics/loggers.py PrometheusStatLogger; 0.6.6.post1 vllm/engine/metrics.py "
        "Metrics.__init__"
    )
    max_line_bytes = 64 * 1024

    def sniff_line(self, text: str) -> bool:
        return text.startswith(("vllm:", "# HELP vllm:", "# TYPE vllm:"))

    def parse_lines(self, name: str, lines: Iterable[Line]) -> Iterator[EngineObservation]:
        groups: dict[str, _Group] = {}
        for ln in lines:
            t = ln.text.strip()
            if not t.startswith(_WANTED):
                continue
            where = f"{name}:{ln.number}"
            m = _SAMPLE.match(t) if not ln.overlong else None
            if m is None or m.group("name") not in _WANTED:
                if m is None and t.split("{")[0].split()[0] in _WANTED:
                    tail = "" if ln.ended else " (the file ends inside this line: truncated?)"
                    raise SpecError(f"{where}: unreadable metric sample{tail}")
                continue
            labels = _labels(m.group("labels") or "", where)
            try:
                value = float(m.group("value"))
            except ValueError:
                raise SpecError(f"{where}: metric value {m.group('value')[:40]!r}") from None
            if not math.isfinite(value) or value < 0:
                if m.group("name").endswith("acceptance_rate"):
                    continue  # the v0 gauge is NaN before the first draft
                raise SpecError(f"{where}: metric value {value!r} is not a finite count")
            key = labels.get("engine", "")
            g = groups.get(key)
            if g is None:
                if len(groups) >= _MAX_GROUPS:
                    raise SpecError(f"{where}: more than {_MAX_GROUPS} engine label values")
                g = groups[key] = _Group(ln.number, labels.get("model_name"))
            metric = m.group("name")
            if metric.endswith("_per_pos_total"):
                try:
                    p = int(labels.get("position", ""))
                except ValueError:
                    raise SpecError(f"{where}: per-position counter without a position") from None
                if not 0 <= p < _MAX_POSITIONS:
                    raise SpecError(f"{where}: position {p} out of range")
                g.per_pos[p] = g.per_pos.get(p, 0.0) + value
            else:
                g.values[metric] = g.values.get(metric, 0.0) + value
        for key, g in groups.items():
            obs = self._observation(name, key, g)
            if obs is not None:
                yield obs

    def _observation(self, name: str, key: str, g: _Group) -> EngineObservation | None:
        v = g.values
        drafts = v.get(_SPEC + "num_drafts_total")
        drafted = v.get(_SPEC + "num_draft_tokens_total")
        accepted = v.get(_SPEC + "num_accepted_tokens_total")
        emitted = v.get(_SPEC + "num_emitted_tokens_total")
        if drafted is None and drafts is None:
            return None
        per_pos: tuple[float, ...] = ()
        if drafts and g.per_pos:
            per_pos = tuple(g.per_pos.get(i, 0.0) / drafts for i in range(max(g.per_pos) + 1))
        running = v.get("vllm:num_requests_running")
        waiting = v.get("vllm:num_requests_waiting")
        return EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant="v0" if emitted is not None else "v1",
            file=name,
            line=g.line,
            kind="counters",
            process=f"engine={key}" if key else None,
            batch=None if running is None else int(running),
            queued=None if waiting is None else int(waiting),
            accept_length=1.0 + accepted / drafts if drafts and accepted is not None else None,
            accept_rate=(
                accepted / drafted
                if drafted and accepted is not None
                else v.get(_SPEC + "draft_acceptance_rate")
            ),
            per_position_accept=per_pos,
            drafts=None if drafts is None else int(drafts),
            draft_tokens=None if drafted is None else int(drafted),
            accepted_tokens=None if accepted is None else int(accepted),
            emitted_tokens=None if emitted is None else int(emitted),
            config=StatedConfig(target_model=g.model),
        )
