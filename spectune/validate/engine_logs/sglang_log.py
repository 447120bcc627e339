"""SGLang server logs: the scheduler's periodic decode-batch line, and the launch line that states
the server arguments.

Every `decode_log_interval` decode iterations (default 40) the scheduler logs one line through
Python logging with SGLang's format `[%(asctime)s{ DPn}{ TPn}...] %(message)s` (configure_logger,
sglang/srt/utils.py in 0.4.x, sglang/srt/utils/common.py in 0.5.23). The message, per version:

- 0.4.3, `Scheduler.log_decode_stats` (sglang/srt/managers/scheduler.py):
  `Decode batch. #running-req: R, #token: T, token usage: U, accept len: A, gen throughput
  (token/s): G, #queue-req: Q`  ("accept len" only when speculating)
- 0.4.6.post5 `Scheduler.log_decode_stats`, 0.5.1 `SchedulerMetricsMixin.log_decode_stats`
  (sglang/srt/managers/scheduler_metrics_mixin.py): the same plus `cuda graph: True|False, `
  before "gen throughput"; hybrid-SWA models print `#full token`/`#swa token` pairs instead of
  `#token`; PD-decode servers add `pre-allocated usage`, `#retracted-req`
- 0.5.10 `SchedulerMetricsMixin.log_decode_stats` (sglang/srt/observability/
  scheduler_metrics_mixin.py) and 0.5.23 `MetricsReporter.report_decode_stats`
  (sglang/srt/managers/scheduler_components/metrics_reporter.py): `Decode batch[ [iter]], ...`
  (comma, optional iteration), `accept len: A, accept rate: P, ` when speculating, and the graph
  label `cuda graph` / `cpu graph` / `npu graph`.

`accept len` is tokens gained per request per verify step including the bonus token: in every
version above the counter grows by accepted drafts + batch size per step and is divided by
batch size x steps. `accept rate` changed meaning: 0.5.10 divides accepted tokens (bonus
included) by steps x speculative_num_draft_tokens; 0.5.23 divides correct drafts by
steps x (speculative_num_draft_tokens - 1). `gen throughput` is generated tokens over the wall
time since the previous decode line.

The launch line `server_args=ServerArgs(model_path=..., tp_size=..., speculative_algorithm=...,
...)` (0.4.3 sglang/srt/entrypoints/engine.py `_launch_subprocesses`: `logger.info(f"{server_args=}")`;
0.5.23 engine.py `Engine.__init__` logs the resolved dict `server_args={'model_path': ...}`)
gives the stated configuration of the decode lines after it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator

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

_PREFIX = re.compile(
    r"\[(?P<time>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}(?:\.\d+)?)(?P<ranks>(?: [A-Z]+\d+)*)\]\s*$"
)
_HEAD = re.compile(r"Decode batch(?: \[(?P<iter>\d+)\])?[.,] ")
_GRAPH_KEYS = ("cuda graph", "cpu graph", "npu graph")


def _config(text: str) -> StatedConfig:
    steps = repr_int(text, "speculative_num_steps")
    return StatedConfig(
        target_model=repr_field(text, "model_path"),
        draft_model=repr_field(text, "speculative_draft_model_path"),
        method=repr_field(text, "speculative_algorithm"),
        num_steps=steps,
        topk=repr_int(text, "speculative_eagle_topk"),
        num_draft_tokens=repr_int(text, "speculative_num_draft_tokens"),
        tp=repr_int(text, "tp_size"),
    )


class SGLangDecodeLog(TextFormat):
    """SGLang server log: one observation per `Decode batch` line."""

    format_id = "sglang-log"
    engine = "sglang"
    source = (
        "sglang 0.4.3 srt/managers/scheduler.py Scheduler.log_decode_stats; 0.4.6.post5 same; "
        "0.5.1 srt/managers/scheduler_metrics_mixin.py log_decode_stats; 0.5.10 "
        "srt/observability/scheduler_metrics_mixin.py log_decode_stats; 0.5.23 "
        "srt/managers/scheduler_components/metrics_reporter.py MetricsReporter.report_decode_stats"
    )

    def sniff_line(self, text: str) -> bool:
        return "Decode batch" in text and "#running-req:" in text

    def parse_lines(self, name: str, lines: Iterable[Line]) -> Iterator[EngineObservation]:
        config = NO_CONFIG
        for ln in lines:
            t = ln.text
            if "server_args=" in t and ("speculative_algorithm" in t or "model_path" in t):
                if not ln.overlong:
                    config = _config(t[t.index("server_args=") :])
                continue
            if not self.sniff_line(t):
                continue
            where = f"{name}:{ln.number}"
            if ln.overlong:
                raise SpecError(f"{where}: decode line longer than {self.max_line_bytes} bytes")
            yield self._decode_line(name, ln, config)

    def _decode_line(self, name: str, ln: Line, config: StatedConfig) -> EngineObservation:
        where = f"{name}:{ln.number}"
        head = _HEAD.search(ln.text)
        if head is None:
            raise SpecError(f"{where}: 'Decode batch' line without the 'Decode batch. ' head")
        fields: dict[str, str] = {}
        for part in ln.text[head.end() :].split(", "):
            key, sep, value = part.partition(": ")
            if sep:
                fields[key.strip()] = value.strip().rstrip(",")
        truncated = "" if ln.ended else " (the file ends inside this line: truncated?)"
        for key in ("#running-req", "gen throughput (token/s)", "#queue-req"):
            if key not in fields:
                raise SpecError(f"{where}: decode line without {key!r}{truncated}")
        prefix = _PREFIX.search(ln.text[: head.start()])
        graph_key = next((k for k in _GRAPH_KEYS if k in fields), None)
        if "accept rate" in fields:
            variant = "0.5.10"
        elif graph_key is not None:
            variant = "0.4.6"
        else:
            variant = "0.4.3"

        def num(key: str, integer: bool = False) -> float | None:
            if key not in fields:
                return None
            return finite(parse_number(fields[key], key, where, integer=integer), key, where)

        accept = num("accept len")
        if accept is not None and accept < 1.0 and accept != 0.0:
            raise SpecError(f"{where}: 'accept len' {accept} below 1 (it counts the bonus token)")
        graph = None
        if graph_key is not None:
            if fields[graph_key] not in ("True", "False"):
                raise SpecError(f"{where}: {graph_key!r} must be True or False")
            graph = fields[graph_key] == "True"
        known = {"#running-req", "gen throughput (token/s)", "#queue-req", "accept len"}
        known.update(("accept rate", graph_key or ""))
        running = num("#running-req", integer=True)
        queued = num("#queue-req", integer=True)
        gen = num("gen throughput (token/s)")
        rate = num("accept rate")
        return EngineObservation(
            engine=self.engine,
            format=self.format_id,
            variant=variant,
            file=name,
            line=ln.number,
            kind="interval",
            time=prefix.group("time") if prefix else None,
            process=(prefix.group("ranks").strip() or None) if prefix else None,
            batch=None if running is None else int(running),
            queued=None if queued is None else int(queued),
            gen_tokens_per_s=gen,
            # 0.00 is what a speculating server prints for an interval without a verify step
            accept_length=accept if accept else None,
            accept_rate=rate if accept else None,
            cuda_graph=graph,
            config=config,
            extra=tuple((k, v) for k, v in fields.items() if k not in known),
        )
