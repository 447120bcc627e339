"""Simulated serving under load for the Load page: one simulator run per request rate, each
with its speculation-off twin on the same arrivals and lengths (the simulator's baseline).

No UI here; `sweep` returns plain rows the page plots and the tests compare with
`spectune.simulator.simulate` called directly. Each run simulates a Scenario (the sidebar's or a
planned table's) as `spectune simulate` does (simulator.scoring.scenario_sim_config).

Rows hold steady-state figures (simulator.metrics.steady_metrics): warm-up (the first 10% of
requests) and drain (after the last arrival) are trimmed, since a short run's drain, where few
requests are left, flatters speculation (100 requests at 16 requests/s on Llama-3.1-8B / H100
showed 1.75x throughput over no speculation where 1,000 requests show 1.17x). Latencies are in
ms; COLUMNS gives every column its label and unit.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from spectune.dashboards.data import acceptance_for, resolve
from spectune.simulator import Gamma, Poisson, SimConfig, SimResult, Trace, simulate
from spectune.simulator.metrics import WARMUP_FRACTION, SteadyMetrics, steady_metrics
from spectune.simulator.scoring import scenario_sim_config
from spectune.specs import PolicyTable, Scenario, SpecError, TreePolicy

PolicySource = PolicyTable | TreePolicy | None

# (column, label) of the latency percentiles the page plots, ms.
LATENCY_COLUMNS = (
    ("ttft_p50_ms", "TTFT p50"),
    ("ttft_p99_ms", "TTFT p99"),
    ("tpot_p50_ms", "TPOT p50"),
    ("tpot_p99_ms", "TPOT p99"),
)
THROUGHPUT_LABEL = "served output tok/s, simulated"

# Every column of a row: (label with unit, printf format). Columns with prefix 'off_' are the
# speculation-off run's.
_RUN_COLUMNS = {
    "throughput_tok_s": ("served output tok/s (simulated)", "%.0f"),
    "goodput_tok_s": ("goodput tok/s (SLO met)", "%.0f"),
    "ttft_p50_ms": ("TTFT p50, ms", "%.1f"),
    "ttft_p99_ms": ("TTFT p99, ms", "%.1f"),
    "tpot_p50_ms": ("TPOT p50, ms", "%.2f"),
    "tpot_p99_ms": ("TPOT p99, ms", "%.2f"),
    "mean_accepted": ("accepted tokens per step", "%.2f"),
}
COLUMNS: dict[str, tuple[str, str]] = {
    "load": ("load", "%s"),
    "qps": ("requests/s", "%.3g"),
    "requests": ("requests in steady window", "%d"),
    "offered_tok_s": ("offered tok/s", "%.0f"),
    **_RUN_COLUMNS,
    **{f"off_{k}": (f"{label}, no speculation", fmt) for k, (label, fmt) in _RUN_COLUMNS.items()},
    "speedup_vs_off": ("decode speedup (per-token latency)", "%.2f"),
    "throughput_ratio_vs_off": ("throughput / no speculation", "%.2f"),
}
STEADY_NOTE = (
    f"Steady state: the first {WARMUP_FRACTION:.0%} of requests (warm-up) and everything after "
    "the last arrival (drain) are left out of throughput and latencies. Throughput below the "
    "offered tok/s (the output of the requests that arrived) means the server cannot keep up at that rate (its queue grows)."
)


@dataclass(frozen=True)
class LoadSettings:
    """How each load level is simulated (the rest is SimConfig's defaults)."""

    requests: int = 1000
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
        keep_iterations=True,  # steady_metrics reads the iteration log
        pool_cache=pool_cache,
        acceptance=acceptance_for(scenario, trace) if trace else None,
    )
    if settings.slo_tpot_ms is not None:
        cfg = replace(cfg, slo_tpot_s=settings.slo_tpot_ms / 1e3)
    return cfg


def arrivals_for(qps: float, burstiness: float) -> Poisson | Gamma:
    return Poisson(qps) if burstiness == 1.0 else Gamma(qps, burstiness)


def _steady(res: SimResult, spec: bool) -> SteadyMetrics:
    run = res.spec if spec else res.off
    assert run is not None and run.log is not None
    cfg = res.config
    return steady_metrics(run.requests, run.log, cfg.slo_ttft_s, cfg.slo_tpot_s)


def row_of(label: str, qps: float, res: SimResult) -> dict[str, Any]:
    """One load level as the page shows it (keys of COLUMNS): speculation on, then off (prefix
    'off_'), over the steady window (simulator.metrics.steady_metrics)."""
    on = _steady(res, True)
    row: dict[str, Any] = {"load": label, "qps": qps, "requests": on.requests,
                           "offered_tok_s": on.offered_tok_s}  # fmt: skip
    runs = [("", on, res.spec)]
    if res.off is not None:
        runs.append(("off_", _steady(res, False), res.off))
    for prefix, m, run in runs:
        row.update(
            {
                f"{prefix}throughput_tok_s": m.throughput_tok_s,
                f"{prefix}goodput_tok_s": m.goodput_tok_s,
                f"{prefix}ttft_p50_ms": m.ttft.p50 * 1e3,
                f"{prefix}ttft_p99_ms": m.ttft.p99 * 1e3,
                f"{prefix}tpot_p50_ms": m.tpot.p50 * 1e3,
                f"{prefix}tpot_p99_ms": m.tpot.p99 * 1e3,
                f"{prefix}mean_accepted": run.metrics.mean_accepted,
            }
        )
    off = runs[-1][1] if res.off is not None else None
    row["speedup_vs_off"] = off.token_latency_s / on.token_latency_s if off else float("nan")
    row["throughput_ratio_vs_off"] = (
        on.throughput_tok_s / off.throughput_tok_s if off and off.throughput_tok_s else float("nan")
    )
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
