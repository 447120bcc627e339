"""Simulated serving under load for the Load page: one simulator run per request rate, each
with its speculation-off twin on the same arrivals and lengths (the simulator's baseline).

No UI here; `sweep` returns plain rows the page plots and the tests compare with
`spectune.simulator.simulate` called directly. Each run simulates a Scenario (the sidebar's or a
planned table's) as `spectune simulate` does (simulator.scoring.scenario_sim_config).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from spectune.dashboards.data import acceptance_for, resolve
from spectune.simulator import Gamma, Poisson, SimConfig, SimResult, Trace, simulate
from spectune.simulator.scoring import scenario_sim_config
from spectune.specs import PolicyTable, Scenario, SpecError, TreePolicy

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
    slo_tpot_ms: float | None = None  # None: the scenario's

    def __post_init__(self) -> None:
        if self.requests < 1:
            raise SpecError(f"requests must be >= 1, got {self.requests}")


def sim_config(
    scenario: Scenario,
    policy: PolicySource,
    arrivals: Any,
    settings: LoadSettings,
    pool_cache: dict[Any, Any] | None = None,
    trace: str = "",
) -> SimConfig:
    """The SimConfig of one load level (what `simulate` runs, speculation off included).
    `pool_cache` shares the step-outcome pools between levels (same seed: same pools);
    `trace`: an uploaded acceptance trace's key (dashboards.data.register_trace)."""
    cfg = replace(
        scenario_sim_config(resolve(scenario), arrivals),
        policy=policy,
        requests=settings.requests,
        seed=settings.seed,
        tree_pool=settings.tree_pool,
        baseline=True,
        pool_cache=pool_cache,
        acceptance=acceptance_for(scenario, trace) if trace else None,
    )
    if settings.slo_tpot_ms is not None:
        cfg = replace(cfg, slo_tpot_s=settings.slo_tpot_ms / 1e3)
    return cfg


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
    trace: str = "",
) -> list[dict[str, Any]]:
    """One row per request rate (ascending), speculation on and off."""
    if not qps:
        raise SpecError("pick at least one request rate")
    rows = []
    pools: dict[Any, Any] = {}
    for q in sorted({float(x) for x in qps}):
        arrivals = arrivals_for(q, settings.burstiness)
        cfg = sim_config(scenario, policy, arrivals, settings, pools, trace)
        rows.append(row_of(f"qps {q:g}", q, simulate(cfg)))
    return rows


def replay(
    scenario: Scenario,
    policy: PolicySource,
    arrivals: Trace,
    settings: LoadSettings,
    trace: str = "",
) -> dict[str, Any]:
    """One run replaying a recorded arrival trace (its own rate)."""
    res = simulate(sim_config(scenario, policy, arrivals, settings, trace=trace))
    t = arrivals.arrival_s
    span = float(t[-1] - t[0]) if len(t) > 1 else 0.0
    rate = (len(t) - 1) / span if span > 0 else float("nan")
    return row_of(f"trace {arrivals.source}", rate, res)
