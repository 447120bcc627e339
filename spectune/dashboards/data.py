"""What the dashboards compute, without any UI: every number a page shows comes from here.

Pages stay thin (widgets, layout, plots) and call these functions through cached wrappers
(dashboards.ui); the tests call the same functions and compare them, and what the pages show,
with the planner's and the simulator's own APIs. Nothing here prices, searches or simulates by
itself: it assembles the planner's cost model, acceptance model, closed-form objective, tree
builders, search and export, and the simulator's `simulate`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spectune.planner.acceptance import AcceptanceModel, acceptance_model
from spectune.planner.costmodel import CostModel
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.space import EAGLE_DEFAULT, SGLANG_DEFAULT, canonical_policy
from spectune.planner.trees import build_tree
from spectune.specs import (
    DraftTree,
    HardwareSpec,
    ModelSpec,
    PolicyTable,
    SpecError,
    TreePolicy,
    Workload,
    load_hardware,
    load_model,
    load_workload,
)

DEFAULT_GPU = "h100-sxm"
DEFAULT_TARGET = "llama-3.1-8b"
DEFAULT_DRAFTER = "eagle3-llama-3.1-8b"
DEFAULT_WORKLOAD = "mt-bench"

# The references every policy is compared with (planner.space): SGLang's and EAGLE's defaults.
REFERENCE_POLICIES: Mapping[str, TreePolicy | None] = {
    "SGLang default 5/4/8": SGLANG_DEFAULT,
    "EAGLE default 7/10/60": EAGLE_DEFAULT,
    "no speculation": None,
}


@dataclass(frozen=True)
class Scenario:
    """What a prediction is about: GPU, target, drafter (None: retrieval only), workload, TP."""

    hardware: HardwareSpec
    target: ModelSpec
    drafter: ModelSpec | None
    workload: Workload
    tp: int = 1
    trace: str = ""  # key of a registered acceptance trace ('' : the workload's acceptance)
    trace_label: str = ""

    @property
    def label(self) -> str:
        drafter = self.drafter.name if self.drafter else "no drafter"
        accept = f", acceptance from trace {self.trace_label}" if self.trace else ""
        return (
            f"{self.target.name} + {drafter} on {self.hardware.name} (tp {self.tp}), "
            f"workload {self.workload.name}{accept}"
        )


# Acceptance models replayed from uploaded traces, by content hash (the Scenario holds the key,
# so scenarios stay small and hashable for the dashboards' caches).
_TRACES: dict[str, AcceptanceModel] = {}


def register_trace(key: str, model: AcceptanceModel) -> None:
    """Make an acceptance model (a planner TraceReplay) available to scenarios as `key`."""
    _TRACES[key] = model


def acceptance_for(scenario: Scenario) -> AcceptanceModel:
    """The scenario's acceptance model: its registered trace, else its workload's."""
    if not scenario.trace:
        return acceptance_model(scenario.workload)
    model = _TRACES.get(scenario.trace)
    if model is None:
        raise SpecError("the acceptance trace of this scenario is gone; upload it again")
    return model


def scenario_from_names(
    gpu: str = DEFAULT_GPU,
    target: str = DEFAULT_TARGET,
    drafter: str | None = DEFAULT_DRAFTER,
    workload: str = DEFAULT_WORKLOAD,
    tp: int = 1,
) -> Scenario:
    """A scenario from preset names (or spec file paths), as `spectune plan` takes them."""
    return Scenario(
        hardware=load_hardware(gpu),
        target=load_model(target),
        drafter=load_model(drafter) if drafter else None,
        workload=load_workload(workload),
        tp=tp,
    )


def objective_for(scenario: Scenario) -> ClosedFormObjective:
    """The planner's closed-form objective for a scenario (what `spectune plan` scores with)."""
    cm = CostModel(scenario.hardware, scenario.target, scenario.drafter, tp=scenario.tp)
    return ClosedFormObjective(cm, acceptance_for(scenario))


def make_policy(
    builder: str,
    depth: int,
    topk: int,
    budget: int,
    prune_threshold: float = 0.0,
    graft_budget: int = 0,
    shared_budget: bool = False,
) -> tuple[TreePolicy, str]:
    """The policy these slider values build (planner.space.canonical_policy) and a note saying
    what was cut, if anything ('' otherwise). shared_budget: ECHO's one verify budget for the
    whole batch (priced at the page's batch size)."""
    p = canonical_policy(builder, depth, topk, budget, prune_threshold, graft_budget, shared_budget)
    notes = []
    if p.budget != budget:
        notes.append(
            f"verify budget cut to {p.budget}: the largest tree {builder} grows with depth "
            f"{depth} and top-k {topk}"
        )
    if p.graft_budget != graft_budget:
        notes.append(f"graft budget cut to {p.graft_budget}: the draft slots of the budget")
    return p, "; ".join(notes)


# ---- what-if ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WhatIf:
    """One decoding iteration of the whole batch under one policy (None: speculation off)."""

    policy: TreePolicy | None
    batch: int
    context: int
    tree_tokens: float  # tokens verified per sequence, root included (mean when pruning)
    expected_tokens: float  # tokens emitted per sequence per step (accepted + bonus)
    phases_s: Mapping[str, float]  # StepBreakdown.phases (draft ... engine); sum = step_s
    verify_breakdown_s: Mapping[str, float]  # operator classes of the verify pass
    draft_steps_s: Mapping[str, float]  # the drafting phase by step; sums to phases_s["draft"]
    step_s: float
    off_step_s: float
    tokens_per_s: float
    off_tokens_per_s: float

    @property
    def speedup(self) -> float:
        return self.tokens_per_s / self.off_tokens_per_s

    def table_rows(self) -> list[dict[str, Any]]:
        """The numbers the What-if page shows, one row each (quantity, value, unit)."""
        rows = [
            ("tokens/s", self.tokens_per_s, "tok/s"),
            ("tokens/s without speculation", self.off_tokens_per_s, "tok/s"),
            ("speedup", self.speedup, "x"),
            ("expected tokens per step", self.expected_tokens, "tok/seq"),
            ("tree tokens verified", self.tree_tokens, "tok/seq"),
            ("step time", self.step_s * 1e3, "ms"),
            ("step time without speculation", self.off_step_s * 1e3, "ms"),
        ]
        rows += [(f"{k} time", v * 1e3, "ms") for k, v in self.phases_s.items()]
        return [{"quantity": q, "value": float(v), "unit": u} for q, v, u in rows]


def _f(x: Any) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def what_if(scenario: Scenario, policy: TreePolicy | None, batch: int, context: int) -> WhatIf:
    """Predicted time of each phase, the verify pass per operator class, tokens per step,
    tokens/s and speedup: the planner's closed form at one (policy, batch, context). The
    phases are the cost model's StepBreakdown of the iteration the objective prices
    (ClosedFormObjective.iteration), as StepBreakdown.phases lists them."""
    obj = objective_for(scenario)
    cm = obj.cost_model
    off_step = obj.step_time(None, batch, context)
    if policy is None:
        tokens, expected = 1.0, 1.0
    else:
        tokens = obj.tree_tokens(policy, batch)  # a shared budget depends on the batch
        expected = obj.expected_tokens(policy, batch)
    phases = {k: _f(v) for k, v in obj.iteration(policy, batch, context).phases().items()}
    verify_parts = {k: _f(v) for k, v in cm.verify_breakdown(batch, tokens, context).items()}
    draft_steps = {} if policy is None else _draft_steps(cm, policy, batch, context)
    step = obj.step_time(policy, batch, context)
    return WhatIf(
        policy=policy,
        batch=batch,
        context=context,
        tree_tokens=float(tokens),
        expected_tokens=float(expected),
        phases_s=phases,
        verify_breakdown_s=verify_parts,
        draft_steps_s=draft_steps,
        step_s=step,
        off_step_s=off_step,
        tokens_per_s=obj(policy, batch, context),
        off_tokens_per_s=obj(None, batch, context),
    )


def _draft_steps(cm: CostModel, policy: TreePolicy, batch: int, context: int) -> dict[str, float]:
    """The drafting phase as the cost model prices it: one step over 1 token per sequence fed by
    the target's hidden states, then depth - 1 steps over top-k tokens per sequence, plus the
    fixed bookkeeping of every step (a drafter model); or the retrieval lookup (no drafter
    model)."""
    if cm.drafter is None:
        return {"retrieval lookup": _f(cm.draft_time(batch, policy.depth, policy.topk, context))}
    first = _f(cm.draft_step_time(batch, 1, context, from_target=True))
    later = _f(cm.draft_step_time(batch, policy.topk, context))
    steps = {"first step (1 token/seq)": first}
    if policy.depth > 1:
        steps[f"{policy.depth - 1} later steps ({policy.topk} tokens/seq each)"] = (
            policy.depth - 1
        ) * later
    fixed = cm.calibration.draft_step_cost_s(policy.builder)
    if policy.depth > 0 and fixed > 0:
        # top-k, frontier sort and pool bookkeeping: a fixed cost per step of this builder
        # (CostModel.draft_time)
        steps[f"top-k / sort / pool x {policy.depth} steps"] = policy.depth * fixed
    return steps


@dataclass(frozen=True)
class SampleTree:
    """One drawn draft tree and each node's probability of lying on the accepted path."""

    tree: DraftTree
    accept_prob: np.ndarray  # float64[N]
    expected_tokens: float


def sample_tree(scenario: Scenario, policy: TreePolicy, seed: int = 0) -> SampleTree:
    """The tree the planner's builder draws for this policy with this seed."""
    model = acceptance_for(scenario)
    tree = build_tree(policy, model, np.random.default_rng(seed))
    return SampleTree(tree, np.asarray(model.node_accept_prob(tree)), model.expected_tokens(tree))


# ---- tokens/s against batch size ----------------------------------------------------------------


def batch_curves(
    scenario: Scenario,
    policies: Mapping[str, TreePolicy | None],
    batches: Sequence[int],
    context: int,
) -> dict[str, np.ndarray]:
    """Predicted tokens/s at each batch size (float64[len(batches)]) for fixed policies."""
    obj = objective_for(scenario)
    return {name: np.asarray(obj.many(p, batches, context)) for name, p in policies.items()}


def table_curve(
    scenario: Scenario, table: PolicyTable, batches: Sequence[int], context: int
) -> np.ndarray:
    """Predicted tokens/s at each batch size with the table's policy for that batch (the policy
    PolicyTable.lookup gives, as a serving engine would switch)."""
    obj = objective_for(scenario)
    out = np.empty(len(batches))
    groups: dict[TreePolicy | None, list[int]] = {}
    for i, b in enumerate(batches):
        groups.setdefault(table.lookup(int(b), context), []).append(i)
    for policy, idx in groups.items():
        out[idx] = obj.many(policy, [batches[i] for i in idx], context)
    return out


def policy_label(p: TreePolicy | None) -> str:
    """'off', or the policy's CLI form (TreePolicy.label)."""
    return "off" if p is None else p.label
