"""The largest request rate a server sustains within its latency SLOs, found by bisection over
simulated runs.

A rate `qps` meets the SLOs when, over one simulated run of `requests` Poisson arrivals at that
rate (engine.simulate with the given SimConfig, speculation off or on as its policy says, no
baseline), the chosen percentile of time to first token is at most `slo_ttft_s` and that of
time per output token at most `slo_tpot_s`. Past capacity, queues grow over the run and TTFT
with them, so a run long enough to fill the queue fails the TTFT bound.

The search brackets the answer by doubling from `start_qps` (or halving when that already
fails), then bisects the bracket until it is narrower than `rel_tol` of its upper end. Latency
grows with load but a finite run is noisy, so the answer is the largest rate seen to meet the
SLOs below the smallest rate seen to fail them. Every run uses the same seed (common random
numbers): on and off runs at one rate see the same arrival pattern, scaled.

A finite run cannot tell an overloaded server by its latencies alone: far past capacity the
requests arrive almost at once and the run measures how fast a burst drains. So the search
first measures the saturated completion rate (a closed-loop run with as many clients as the
replicas run sequences: the most requests/s the server finishes) and never probes above it: a
rate the saturated server does not complete is not sustainable, whatever its latencies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from spectune.simulator.arrivals import MAX_QPS, ClosedLoop, Poisson
from spectune.simulator.config import MAX_REQUESTS, SimConfig
from spectune.simulator.engine import SimResult, simulate
from spectune.specs.errors import SpecError

PERCENTILES = ("p50", "p90", "p99")
MIN_QPS = 1e-3
"""Below this rate the search stops and reports 0 (no rate meets the SLOs)."""
MAX_PROBES = 40


@dataclass(frozen=True)
class Probe:
    """One simulated rate: its TTFT and TPOT at the percentile (s) and whether both meet."""

    qps: float
    ttft_s: float
    tpot_s: float
    meets: bool
    throughput_tok_s: float


@dataclass(frozen=True)
class SloCapacity:
    """The largest rate found to meet the SLOs (0: none, down to MIN_QPS), the smallest seen
    to fail (inf: none up to the search's ceiling), every probe in order, and the saturated
    completion rate that bounds the search (requests/s)."""

    max_qps: float
    fail_qps: float
    probes: tuple[Probe, ...]
    saturated_qps: float = math.inf

    @property
    def best(self) -> Probe | None:
        """The probe at max_qps (None when no rate met the SLOs)."""
        hits = [p for p in self.probes if p.meets and p.qps == self.max_qps]
        return hits[0] if hits else None


def probe(
    config: SimConfig, qps: float, slo_ttft_s: float, slo_tpot_s: float, percentile: str
) -> tuple[Probe, SimResult]:
    """One simulated run at `qps` (Poisson arrivals, no speculation-off baseline)."""
    res = simulate(replace(config, arrivals=Poisson(qps), baseline=False))
    m = res.spec.metrics
    ttft = float(getattr(m.ttft, percentile))
    tpot = float(getattr(m.tpot, percentile))
    tpot_ok = math.isnan(tpot) or tpot <= slo_tpot_s  # NaN: one-token outputs, no TPOT
    meets = math.isfinite(ttft) and ttft <= slo_ttft_s and tpot_ok
    return Probe(qps, ttft, tpot, meets, float(m.throughput_tok_s)), res


def max_rate(
    config: SimConfig,
    *,
    slo_ttft_s: float,
    slo_tpot_s: float,
    percentile: str = "p90",
    start_qps: float = 1.0,
    max_qps: float = MAX_QPS,
    rel_tol: float = 0.02,
    progress: Callable[[Probe], None] | None = None,
) -> SloCapacity:
    """The largest Poisson request rate (requests/s) whose simulated run meets both SLOs at
    `percentile`, by doubling then bisection (module docstring); `progress(probe)` after each
    run."""
    if percentile not in PERCENTILES:
        raise SpecError(f"percentile must be one of {PERCENTILES}, got {percentile!r}")
    if not (slo_ttft_s > 0 and slo_tpot_s > 0 and 0 < rel_tol < 1):
        raise SpecError("SLOs must be > 0 and the tolerance in (0, 1)")
    probes: list[Probe] = []
    ok, bad = 0.0, math.inf

    def run(qps: float) -> bool:
        nonlocal ok, bad
        p, _ = probe(config, qps, slo_ttft_s, slo_tpot_s, percentile)
        probes.append(p)
        if progress is not None:
            progress(p)
        if p.meets:
            ok = max(ok, qps)
        else:
            bad = min(bad, qps)
        return p.meets

    saturated = saturated_rate(config)
    max_qps = min(max_qps, saturated)
    qps = min(max(start_qps, MIN_QPS), max_qps)
    if run(qps):
        while bad == math.inf and qps < max_qps and len(probes) < MAX_PROBES:
            qps = min(qps * 2, max_qps)
            run(qps)
    else:
        while ok == 0.0 and qps > MIN_QPS and len(probes) < MAX_PROBES:
            qps = max(qps / 2, MIN_QPS)
            run(qps)
    while ok > 0 and bad < math.inf and bad - ok > rel_tol * bad and len(probes) < MAX_PROBES:
        run(math.sqrt(ok * bad) if bad / ok > 4 else (ok + bad) / 2)
    return SloCapacity(ok, bad, tuple(probes), saturated)


def saturated_rate(config: SimConfig) -> float:
    """Requests/s the server completes when saturated: a closed-loop run whose clients fill
    every replica's batch (its max batch, from the KV cache unless set), each client sending
    at least 4 requests so that the full batch, not its ramp-up, dominates the run."""
    first = simulate(replace(config, arrivals=ClosedLoop(1), baseline=False, requests=1))
    clients = first.max_batch * config.replicas
    requests = min(max(config.requests, 4 * clients), MAX_REQUESTS)
    res = simulate(replace(config, arrivals=ClosedLoop(clients), baseline=False, requests=requests))
    return float(res.spec.metrics.request_rate_s)


__all__ = ["MIN_QPS", "PERCENTILES", "Probe", "SloCapacity", "max_rate", "probe"]
