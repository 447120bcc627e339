"""Simulated serving under load for the Load page: one simulator run per request rate, each
with its speculation-off twin on the same arrivals and lengths (the simulator's baseline).

No UI here; `sweep` returns plain rows the page plots and the tests compare with
`spectune.simulator.simulate` called directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spectune.dashboards.data import Scenario, acceptance_for
from spectune.simulator import Gamma, Poisson, SimConfig, SimResult, Trace, simulate
from spectune.specs import PolicyTable, SpecError, TreePolicy

PolicySource = PolicyTable | TreePolicy | None

# (column, label) of the latency percentiles the page plots, seconds.
LATENCY_COLUMNS = (
    ("ttft_p50_s", "TTFT p50"),
    ("ttft_p99_s", "TTFT p99"),
    ("tpot_p50_s", "TPOT p50"),
    ("tpot_p99_s", "TPOT p99"),
)


@dataclass(frozen=True)
class LoadSettings:
    """How each load level is simulated (the rest is SimConfig's defaults)."""

    requests: int = 200
    seed: int = 0
    burstiness: float = 1.0  # cv of inter-arrival times; 1 = Poisson
    tree_pool: int = 256
    slo_tpot_ms: float | None = None

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise SpecError(f"requests must be >= 1, got {self.requests}")


def sim_config(
    scenario: Scenario,
    policy: PolicySource,
    arrivals: Any,
    settings: LoadSettings,
    pool_cache: dict[Any, Any] | None = None,
) -> SimConfig:
    """The SimConfig of one load level (what `simulate` runs, speculation off included).
    `pool_cache` shares the step-outcome pools between levels (same seed: same pools)."""
    return SimConfig(
        hardware=scenario.hardware,
        target=scenario.target,
        drafter=scenario.drafter,
        arrivals=arrivals,
        policy=policy,
        workload=scenario.workload,
        requests=settings.requests,
        tp=scenario.tp,
        seed=settings.seed,
        tree_pool=settings.tree_pool,
        slo_tpot_s=None if settings.slo_tpot_ms is None else settings.slo_tpot_ms / 1e3,
        baseline=True,
        pool_cache=pool_cache,
        acceptance=acceptance_for(scenario) if scenario.trace else None,
    )


def arrivals_for(qps: float, burstiness: float) -> Poisson | Gamma:
    return Poisson(qps) if burstiness == 1.0 else Gamma(qps, burstiness)


def row_of(label: str, qps: float, res: SimResult) -> dict[str, Any]:
    """One load level as the page shows it: speculation on, then off (prefix 'off_')."""
    row: dict[str, Any] = {"load": label, "qps": qps}
    for prefix, run in (("", res.spec), ("off_", res.off)):
        if run is None:
            continue
        m = run.metrics
        row.update(
            {
                f"{prefix}throughput_tok_s": m.throughput_tok_s,
                f"{prefix}goodput_tok_s": m.goodput_tok_s,
                f"{prefix}ttft_p50_s": m.ttft.p50,
                f"{prefix}ttft_p99_s": m.ttft.p99,
                f"{prefix}tpot_p50_s": m.tpot.p50,
                f"{prefix}tpot_p99_s": m.tpot.p99,
                f"{prefix}mean_accepted": m.mean_accepted,
            }
        )
    row["speedup_vs_off"] = res.speedup_vs_off
    row["throughput_ratio_vs_off"] = res.throughput_ratio_vs_off
    return row


def sweep(
    scenario: Scenario,
    policy: PolicySource,
    qps: Sequence[float],
    settings: LoadSettings,
) -> list[dict[str, Any]]:
    """One row per request rate (ascending), speculation on and off."""
    if not qps:
        raise SpecError("pick at least one request rate")
    rows = []
    pools: dict[Any, Any] = {}
    for q in sorted({float(x) for x in qps}):
        cfg = sim_config(scenario, policy, arrivals_for(q, settings.burstiness), settings, pools)
        rows.append(row_of(f"qps {q:g}", q, simulate(cfg)))
    return rows


def replay(
    scenario: Scenario, policy: PolicySource, trace: Trace, settings: LoadSettings
) -> dict[str, Any]:
    """One run replaying a recorded arrival trace (its own rate)."""
    res = simulate(sim_config(scenario, policy, trace, settings))
    span = float(trace.arrival_s[-1] - trace.arrival_s[0]) if len(trace.arrival_s) > 1 else 0.0
    rate = (len(trace.arrival_s) - 1) / span if span > 0 else float("nan")
    return row_of(f"trace {trace.source}", rate, res)
