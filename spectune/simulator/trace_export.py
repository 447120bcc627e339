"""Chrome trace (chrome://tracing, Perfetto) of a run's iterations: one track per replica, one
slice per iteration split into its draft / forward / extend / overhead phases, and a counter of
requests in system. Times in microseconds as the format asks."""

from __future__ import annotations

import os
from typing import Any

from spectune.simulator.iterations import IterationLog
from spectune.specs import write_json_atomic

PHASES = ("draft", "forward", "extend", "overhead")
MAX_EVENTS = 2_000_000


def chrome_trace(log: IterationLog, name: str = "spectune simulate") -> dict[str, Any]:
    it = log.arrays()
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": name}},
    ]
    for r in sorted({int(x) for x in it["replica"]}):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": 0, "tid": r, "args": {"name": f"replica {r}"}}
        )
    n = min(it["start_s"].size, MAX_EVENTS // 6)
    for i in range(n):
        tid = int(it["replica"][i])
        t = it["start_s"][i] * 1e6
        pol = int(it["policy"][i])
        events.append(
            {
                "name": "iteration",
                "ph": "X",
                "pid": 0,
                "tid": tid,
                "ts": t,
                "dur": it["dt_s"][i] * 1e6,
                "args": {
                    "decoding": int(it["decoding"][i]),
                    "prefilling": int(it["prefilling"][i]),
                    "fed_tokens": int(it["fed_tokens"][i]),
                    "emitted_tokens": int(it["emitted_tokens"][i]),
                    "preempted": int(it["preempted"][i]),
                    "policy": log.policies[pol]
                    if pol >= 0
                    else ("off" if it["decoding"][i] else "prefill only"),
                },
            }
        )
        for phase in PHASES:
            d = it[f"{phase}_s"][i] * 1e6
            if d > 0:
                events.append({"name": phase, "ph": "X", "pid": 0, "tid": tid, "ts": t, "dur": d})
                t += d
        events.append(
            {
                "name": f"in system r{tid}",
                "ph": "C",
                "pid": 0,
                "ts": it["start_s"][i] * 1e6,
                "args": {"requests": int(it["in_system"][i])},
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(log: IterationLog, path: str | os.PathLike[str]) -> None:
    write_json_atomic(path, chrome_trace(log))
