"""The search's scorer for a named scenario: the planner's closed form, or the simulator's
goodput/throughput objective. It lives in the simulator layer because it composes the two (the
planner never imports the simulator); `spectune plan`, `spectune worker` and the dashboards call
it with the same scenario dict, so every worker of a shared study scores the same way."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from spectune.planner.costmodel import CostModel
from spectune.planner.objective import ClosedFormObjective, closed_form_objective
from spectune.planner.search import Scorer
from spectune.simulator.objective import SimObjective, goodput_objective
from spectune.specs import TreePolicy, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.specs.workload import load_workload


def build_scorer(scenario: Mapping[str, Any]) -> tuple[Scorer, ClosedFormObjective]:
    """The search's scorer for a scenario, and the closed form (accepted lengths, latency).

    closed-form: tokens/s and step latency from the cost model; goodput / throughput: the
    simulator's goodput under the TPOT/TTFT SLO or its throughput, and its p99 TPOT as the
    multi-objective latency."""
    closed = closed_form_objective(
        scenario["target"],
        scenario["drafter"],
        scenario["gpu"],
        scenario["workload"],
        tp=int(scenario.get("tp", 1)),
        turnover=True,  # saturated servers replace finished requests, as the simulator does
        kv_capacity=True,  # and run no larger batch than the KV cache holds at the context
        calibration=scenario.get("calibration"),  # a calibration file, or None: defaults
    )
    kind = scenario.get("objective", "closed-form")
    if kind in ("goodput", "throughput"):
        sim = simulation_objective(scenario, metric=kind)

        def tpot_p99(policy: TreePolicy | None, batch: int, context: int) -> float:
            return float(sim.run(policy, batch, context).metrics.tpot.p99)

        return Scorer(sim, tpot_p99), closed
    return Scorer(closed, closed.step_latency), closed


def simulation_objective(scenario: Mapping[str, Any], metric: str = "goodput") -> SimObjective:
    """The simulator's objective (spectune.simulator.goodput_objective) for a scenario."""

    def seconds(ms: Any) -> float | None:
        return None if ms is None else float(ms) / 1e3

    hw, target = load_hardware(scenario["gpu"]), load_model(scenario["target"])
    drafter, tp = load_model(scenario["drafter"]), int(scenario.get("tp", 1))
    extra: dict[str, Any] = {}
    if scenario.get("calibration"):  # the simulator prices steps with the calibrated model too
        cal = Calibration.load(scenario["calibration"])
        extra["cost_model"] = CostModel(hw, target, drafter, tp=tp, calibration=cal)
    return goodput_objective(
        hw,
        target,
        drafter,
        load_workload(scenario["workload"], target=target, drafter=drafter),
        tp=tp,
        slo_tpot_s=seconds(scenario.get("slo_tpot_ms")),
        slo_ttft_s=seconds(scenario.get("slo_ttft_ms")),
        metric=metric,
        **extra,
    )
