"""The search's scorer for a Scenario: the planner's closed form, or the simulator's
goodput/throughput objective. It lives in the simulator layer because it composes the two (the
planner never imports the simulator); `spectune plan`, `spectune worker` and the dashboards call
it with the same Scenario, so every worker of a shared study scores the same way.

`scenario_sim_config` is the simulator's side of a scenario: the SimConfig of its GPU, models,
TP and workload, priced by the scenario's (calibrated) cost model. `spectune simulate`, the
dashboards' Load page and the simulation objective start from it.
"""

from __future__ import annotations

from spectune.planner.hierarchical import scenario_hierarchy
from spectune.planner.objective import ClosedFormObjective, scenario_cost_model, scenario_objective
from spectune.planner.search import Scorer
from spectune.simulator.arrivals import ArrivalProcess, ClosedLoop
from spectune.simulator.config import SimConfig
from spectune.simulator.objective import SimObjective, goodput_objective
from spectune.specs import TreePolicy
from spectune.specs.scenario import ResolvedScenario, Scenario


def build_scorer(scenario: Scenario) -> tuple[Scorer, ClosedFormObjective]:
    """The search's scorer for a scenario, and the closed form (accepted lengths, latency).

    closed-form: tokens/s and step latency from the cost model; goodput / throughput: the
    simulator's goodput under the TPOT/TTFT SLO or its throughput, and its p99 TPOT as the
    multi-objective latency."""
    resolved = scenario.resolve()
    closed = scenario_objective(resolved)
    if scenario.objective in ("goodput", "throughput"):
        sim = simulation_objective(resolved, metric=scenario.objective)

        def tpot_p99(policy: TreePolicy | None, batch: int, context: int) -> float:
            return float(sim.run(policy, batch, context).metrics.tpot.p99)

        return Scorer(sim, tpot_p99), closed
    return Scorer(closed, closed.step_latency), closed


def simulation_objective(resolved: ResolvedScenario, metric: str = "goodput") -> SimObjective:
    """The simulator's objective (spectune.simulator.goodput_objective) for a scenario, with
    its SLOs and its (calibrated) cost model."""

    s = resolved.scenario
    return goodput_objective(
        resolved.hardware,
        resolved.target,
        resolved.drafter,
        resolved.workload,
        tp=resolved.tp,
        slo_tpot_s=seconds(s.slo_tpot_ms),
        slo_ttft_s=seconds(s.slo_ttft_ms),
        metric=metric,
        cost_model=scenario_cost_model(resolved),
        hierarchy=scenario_hierarchy(resolved),
    )


def scenario_sim_config(
    resolved: ResolvedScenario, arrivals: ArrivalProcess | None = None
) -> SimConfig:
    """A SimConfig for the scenario (arrivals default to one closed-loop client): its GPU,
    target, drafter, workload, TP, the SLOs it names, and its cost model. Callers set the
    rest with dataclasses.replace. A scenario naming an intermediate also simulates
    hierarchical policies (SimConfig.hierarchy)."""
    s = resolved.scenario
    return SimConfig(
        hardware=resolved.hardware,
        target=resolved.target,
        drafter=resolved.drafter,
        arrivals=arrivals if arrivals is not None else ClosedLoop(1),
        workload=resolved.workload,
        tp=resolved.tp,
        slo_tpot_s=seconds(s.slo_tpot_ms),
        slo_ttft_s=seconds(s.slo_ttft_ms),
        cost_model=scenario_cost_model(resolved),
        hierarchy=scenario_hierarchy(resolved),
    )


def seconds(ms: float | None) -> float | None:
    """A scenario's SLO in ms as the simulator's seconds (None stays None)."""
    return None if ms is None else float(ms) / 1e3
