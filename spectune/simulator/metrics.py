"""Serving metrics of one run, from the per-request arrays and the iteration log.

TTFT = first token - arrival; TPOT = (finish - first token) / (output - 1) over requests with more
than one output token; e2e = finish - arrival. Throughput counts output tokens over the run's
span (first arrival to last finish). Goodput counts only the output tokens of requests that meet
the SLO (TTFT and TPOT bounds; no bound: every request). Mean accepted length is the tokens a
verify emits per sequence (accepted draft tokens + the bonus token); verify waste is the share
of verified draft tokens that were rejected. Mean in system is the time average of requests
present (from the iteration log), which Little's law ties to throughput x mean e2e.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from spectune.simulator.iterations import IterationLog
from spectune.simulator.requests import Requests


@dataclass(frozen=True)
class Latency:
    """Percentiles of one latency, seconds."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, x: np.ndarray) -> Latency:
        x = x[np.isfinite(x)]
        if not x.size:
            return cls(float("nan"), float("nan"), float("nan"), float("nan"))
        p = np.percentile(x, [50, 90, 99])
        return cls(float(x.mean()), float(p[0]), float(p[1]), float(p[2]))


@dataclass(frozen=True)
class Metrics:
    requests: int
    output_tokens: int
    duration_s: float
    throughput_tok_s: float
    request_rate_s: float  # finished requests per second over the span
    goodput_tok_s: float
    goodput_req_s: float
    slo_attainment: float  # fraction of requests meeting the SLO
    ttft: Latency
    tpot: Latency
    e2e: Latency
    token_latency_s: float  # decode seconds per output token over all requests (sum / sum)
    mean_accepted: float  # tokens per verify per sequence (accepted + bonus); 1 with spec off
    verify_waste: float  # rejected draft tokens / verified draft tokens
    mean_in_system: float  # time-average requests present (Little's L)
    preemptions: int
    time_breakdown_s: dict[str, float]  # summed over iterations (and replicas)
    busy_fraction: float  # iteration time / (span x replicas)

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def compute_metrics(
    reqs: Requests,
    log: IterationLog,
    replicas: int,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
) -> Metrics:
    done = np.isfinite(reqs.finish_s)
    n = int(done.sum())
    arrival = reqs.arrival_s[done]
    finish = reqs.finish_s[done]
    first = reqs.first_token_s[done]
    out = reqs.out[done]
    span = float(finish.max() - arrival.min()) if n else 0.0
    ttft = first - arrival
    e2e = finish - arrival
    multi = out > 1
    tpot = np.full(n, np.nan)
    tpot[multi] = (finish[multi] - first[multi]) / (out[multi] - 1)
    ok = np.ones(n, dtype=bool)
    if slo_ttft_s is not None:
        ok &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        ok &= ~(tpot > slo_tpot_s)  # single-token requests have no TPOT and pass
    tokens = int(out.sum())
    dec_tokens = int((out[multi] - 1).sum())
    it = log.arrays()
    inv = 1.0 / span if span > 0 else 0.0
    spec = log.spec_verifies
    draft_tokens = log.spec_tree_tokens - spec  # roots are not drafts
    return Metrics(
        requests=n,
        output_tokens=tokens,
        duration_s=span,
        throughput_tok_s=tokens * inv,
        request_rate_s=n * inv,
        goodput_tok_s=float(out[ok].sum()) * inv,
        goodput_req_s=float(ok.sum()) * inv,
        slo_attainment=float(ok.mean()) if n else 0.0,
        ttft=Latency.of(ttft),
        tpot=Latency.of(tpot),
        e2e=Latency.of(e2e),
        token_latency_s=float((finish[multi] - first[multi]).sum() / dec_tokens)
        if dec_tokens
        else float("nan"),
        mean_accepted=(log.spec_accepted + spec) / spec if spec else 1.0,
        verify_waste=(draft_tokens - log.spec_accepted) / draft_tokens if draft_tokens else 0.0,
        mean_in_system=float((it["in_system"] * it["dt_s"]).sum()) * inv,
        preemptions=int(reqs.preemptions.sum()),
        time_breakdown_s={
            k: float(it[f"{k}_s"].sum()) for k in ("draft", "forward", "extend", "overhead")
        },
        busy_fraction=float(it["dt_s"].sum()) * inv / replicas,
    )


WARMUP_FRACTION = 0.1
"""Share of an open-loop run's requests (by arrival) treated as warm-up by steady_metrics."""


@dataclass(frozen=True)
class SteadyMetrics:
    """An open-loop run measured over its steady window [start_s, end_s): from the arrival of
    the first request past the warm-up (WARMUP_FRACTION of the requests) to the last arrival,
    so neither the empty server at the start nor the drain after the last arrival (few
    requests left, which flatters speculation) counts. Latencies are over the requests that
    arrive in the window; throughput counts the output tokens the iterations starting in the
    window emitted."""

    start_s: float
    end_s: float
    requests: int  # requests arriving in the window
    throughput_tok_s: float
    offered_tok_s: float  # output tokens of the window's requests / window length
    goodput_tok_s: float  # throughput x the share of those tokens whose requests meet the SLO
    ttft: Latency
    tpot: Latency
    token_latency_s: float  # decode seconds per output token of the window's requests


def steady_metrics(
    reqs: Requests,
    log: IterationLog,
    slo_ttft_s: float | None = None,
    slo_tpot_s: float | None = None,
    warmup_fraction: float = WARMUP_FRACTION,
) -> SteadyMetrics:
    """SteadyMetrics of a finished open-loop run; the iteration log must have been kept
    (SimConfig.keep_iterations). A run whose window is empty (one request, a trace whose
    requests all arrive at once) is measured from its first arrival to its last finish."""
    arrival = np.sort(reqs.arrival_s)
    n = arrival.size
    start = float(arrival[min(n - 1, int(np.ceil(warmup_fraction * n)))]) if n else 0.0
    end = float(arrival[-1]) if n else 0.0
    if not end > start:
        start = float(arrival[0]) if n else 0.0
        end = float(np.nanmax(reqs.finish_s)) if n else 0.0
    span = end - start
    inside = (reqs.arrival_s >= start) & (reqs.arrival_s <= end) & np.isfinite(reqs.finish_s)
    first, finish, out = reqs.first_token_s[inside], reqs.finish_s[inside], reqs.out[inside]
    ttft = first - reqs.arrival_s[inside]
    multi = out > 1
    tpot = np.full(out.size, np.nan)
    tpot[multi] = (finish[multi] - first[multi]) / (out[multi] - 1)
    ok = np.ones(out.size, dtype=bool)
    if slo_ttft_s is not None:
        ok &= ttft <= slo_ttft_s
    if slo_tpot_s is not None:
        ok &= ~(tpot > slo_tpot_s)
    it = log.arrays()
    emitting = (it["start_s"] >= start) & (it["start_s"] < end)
    inv = 1.0 / span if span > 0 else 0.0
    throughput = float(it["emitted_tokens"][emitting].sum()) * inv
    tokens = float(out.sum())
    dec = float((out[multi] - 1).sum())
    return SteadyMetrics(
        start_s=start,
        end_s=end,
        requests=int(inside.sum()),
        throughput_tok_s=throughput,
        offered_tok_s=float(reqs.output[inside].sum()) * inv,
        goodput_tok_s=throughput * (float(out[ok].sum()) / tokens if tokens else 0.0),
        ttft=Latency.of(ttft),
        tpot=Latency.of(tpot),
        token_latency_s=float((finish[multi] - first[multi]).sum()) / dec if dec else float("nan"),
    )
