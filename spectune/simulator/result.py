"""What a simulated load level returns: per-run metrics, request arrays and iteration logs, the
speculation-off baseline beside them, and the flat record the CLI prints."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from spectune.simulator.arrivals import ClosedLoop, Trace
from spectune.simulator.config import SimConfig
from spectune.simulator.iterations import IterationLog
from spectune.simulator.metrics import Metrics
from spectune.simulator.requests import Requests


@dataclass
class RunResult:
    """One run (speculation as configured, or off)."""

    metrics: Metrics
    requests: Requests
    log: IterationLog | None
    wall_s: float


@dataclass
class SimResult:
    """A load level: the speculative run, the speculation-off baseline, and their ratios."""

    config: SimConfig
    spec: RunResult
    off: RunResult | None
    max_batch: int
    kv_tokens: int
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def metrics(self) -> Metrics:
        return self.spec.metrics

    @property
    def speedup_vs_off(self) -> float:
        """Decode speedup: seconds per output token off / on (sum over requests of decode time
        over the tokens after the first), the per-token latency a user sees."""
        if self.off is None:
            return float("nan")
        return self.off.metrics.token_latency_s / self.spec.metrics.token_latency_s

    @property
    def throughput_ratio_vs_off(self) -> float:
        if self.off is None:
            return float("nan")
        return self.spec.metrics.throughput_tok_s / self.off.metrics.throughput_tok_s

    def summary(self) -> dict[str, Any]:
        """The flat record `spectune simulate --json` prints per load level."""
        m = self.spec.metrics
        arr = self.config.arrivals
        d: dict[str, Any] = {}
        if isinstance(arr, ClosedLoop):
            d["concurrency"] = arr.concurrency
        elif isinstance(arr, Trace):
            d["trace"] = arr.source
        else:
            d["qps"] = arr.qps
        d.update(
            throughput_tok_s=m.throughput_tok_s,
            goodput_tok_s=m.goodput_tok_s,
            ttft_p50_s=m.ttft.p50,
            ttft_p99_s=m.ttft.p99,
            tpot_p50_s=m.tpot.p50,
            tpot_p99_s=m.tpot.p99,
            e2e_p50_s=m.e2e.p50,
            e2e_p99_s=m.e2e.p99,
            mean_accepted=m.mean_accepted,
            verify_waste=m.verify_waste,
            speedup_vs_off=self.speedup_vs_off,
            throughput_ratio_vs_off=self.throughput_ratio_vs_off,
            requests=m.requests,
            max_batch=self.max_batch,
            preemptions=m.preemptions,
        )
        if self.off is not None:
            o = self.off.metrics
            d["off"] = {
                "throughput_tok_s": o.throughput_tok_s,
                "ttft_p50_s": o.ttft.p50,
                "tpot_p50_s": o.tpot.p50,
                "tpot_p99_s": o.tpot.p99,
                "e2e_p50_s": o.e2e.p50,
            }
        return d
