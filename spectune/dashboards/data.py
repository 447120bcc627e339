"""What the dashboards compute, without any UI: every number a page shows comes from here.

Pages stay thin (widgets, layout, plots) and call these functions through cached wrappers
(dashboards.ui); the tests call the same functions and compare them, and what the pages show,
with the planner's and the simulator's own APIs. Nothing here prices, searches or simulates by
itself: it assembles the planner's cost model, acceptance model, closed-form objective, tree
builders, search and export, and the simulator's `simulate`.

A page predicts for a `spectune.specs.Scenario` (the sidebar's, or a policy file's), resolved
here once and priced by the planner's one closed-form builder (planner.objective.
scenario_objective): the objective `spectune plan` scores with. Beside the scenario a page may
pass `trace`, the key of an uploaded acceptance trace (register_trace) that replaces the
workload's acceptance model; it is dashboard state, not part of the scenario. Decode-only
figures (the What-if page's one iteration, executor measurements) use the same builder with
`decode_only=True` and say so on the page.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spectune.planner.acceptance import AcceptanceModel, acceptance_model
from spectune.planner.costmodel import CostModel
from spectune.planner.objective import ClosedFormObjective, scenario_objective
from spectune.planner.space import EAGLE_DEFAULT, SGLANG_DEFAULT, canonical_policy
from spectune.planner.trees import build_tree
from spectune.specs import (
    DraftTree,
    PolicyTable,
    ResolvedScenario,
    Scenario,
    SpecError,
    TreePolicy,
)
from spectune.specs import policy_label as policy_label  # the pages' name for TreePolicy.label

DEFAULT_SCENARIO = Scenario()
"""The scenario of a page opened without the sidebar (the defaults of `spectune plan`)."""

DECODE_ONLY_NOTE = (
    "Decode-only: one iteration of running requests, without the prefill of requests that "
    "replace finished ones and without the KV-cache cap on the batch (the Planner's tokens/s "
    "include both)"
)

# The references every policy is compared with (planner.space): SGLang's and EAGLE's defaults.
REFERENCE_POLICIES: Mapping[str, TreePolicy | None] = {
    "SGLang default 5/4/8": SGLANG_DEFAULT,
    "EAGLE default 7/10/60": EAGLE_DEFAULT,
    "no speculation": None,
}


@functools.lru_cache(maxsize=64)
def resolve(scenario: Scenario) -> ResolvedScenario:
    """The scenario's specs, loaded once per scenario (Scenario.resolve)."""
    return scenario.resolve()


# Acceptance models replayed from uploaded traces, by content hash (pages pass the key beside
# the scenario, so arguments stay small and hashable for the dashboards' caches).
_TRACES: dict[str, tuple[AcceptanceModel, str]] = {}


def register_trace(key: str, model: AcceptanceModel, label: str = "") -> None:
    """Make an acceptance model (a planner TraceReplay) available to pages as `trace=key`."""
    _TRACES[key] = (model, label or key)


def acceptance_for(scenario: Scenario, trace: str = "") -> AcceptanceModel:
    """The acceptance model: the registered trace `trace`, else the scenario's workload's."""
    if not trace:
        return acceptance_model(resolve(scenario).workload)
    found = _TRACES.get(trace)
    if found is None:
        raise SpecError("the acceptance trace of this scenario is gone; upload it again")
    return found[0]


def trace_label(trace: str) -> str:
    """The label of a registered acceptance trace (its key when it is gone)."""
    found = _TRACES.get(trace)
    return found[1] if found else trace


def scenario_label(scenario: Scenario, trace: str = "") -> str:
    """What a page says it predicts for: the resolved scenario's label, and the trace."""
    label = resolve(scenario).label
    return label + (f", acceptance from trace {trace_label(trace)}" if trace else "")


def objective_for(
    scenario: Scenario, trace: str = "", *, decode_only: bool = False
) -> ClosedFormObjective:
    """The planner's closed-form objective for a scenario: what `spectune plan` scores with
    (planner.objective.scenario_objective), or its decode-only form."""
    acceptance = acceptance_for(scenario, trace) if trace else None
    return scenario_objective(resolve(scenario), decode_only=decode_only, acceptance=acceptance)


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


def what_if(
    scenario: Scenario, policy: TreePolicy | None, batch: int, context: int, trace: str = ""
) -> WhatIf:
    """Predicted time of each phase, the verify pass per operator class, tokens per step,
    tokens/s and speedup: the planner's closed form, decode-only (DECODE_ONLY_NOTE), at one
    (policy, batch, context). The phases are the cost model's StepBreakdown of the iteration the
    objective prices (ClosedFormObjective.iteration), as StepBreakdown.phases lists them."""
    obj = objective_for(scenario, trace, decode_only=True)
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
    """The drafting phase by part, as the cost model prices it (CostModel.draft_parts), with
    the labels the page shows."""
    parts = {
        k: _f(v)
        for k, v in cm.draft_parts(
            batch, policy.depth, policy.topk, context, builder=policy.builder
        ).items()
    }
    if "retrieval" in parts:
        return {"retrieval lookup": parts["retrieval"]}
    steps = {"first step (1 token/seq)": parts["first"]}
    if policy.depth > 1:
        steps[f"{policy.depth - 1} later steps ({policy.topk} tokens/seq each)"] = parts["later"]
    if parts["bookkeeping"] > 0:
        steps[f"top-k / sort / pool x {policy.depth} steps"] = parts["bookkeeping"]
    return steps


@dataclass(frozen=True)
class SampleTree:
    """One drawn draft tree and each node's probability of lying on the accepted path."""

    tree: DraftTree
    accept_prob: np.ndarray  # float64[N]
    expected_tokens: float


def sample_tree(
    scenario: Scenario, policy: TreePolicy, seed: int = 0, trace: str = ""
) -> SampleTree:
    """The tree the planner's builder draws for this policy with this seed."""
    model = acceptance_for(scenario, trace)
    tree = build_tree(policy, model, np.random.default_rng(seed))
    return SampleTree(tree, np.asarray(model.node_accept_prob(tree)), model.expected_tokens(tree))


# ---- tokens/s against batch size ----------------------------------------------------------------


def batch_curves(
    scenario: Scenario,
    policies: Mapping[str, TreePolicy | None],
    batches: Sequence[int],
    context: int,
    trace: str = "",
) -> dict[str, np.ndarray]:
    """Predicted tokens/s at each batch size (float64[len(batches)]) for fixed policies: the
    planner's objective (as the Planner's table predicts)."""
    obj = objective_for(scenario, trace)
    return {name: np.asarray(obj.many(p, batches, context)) for name, p in policies.items()}


def table_curve(
    scenario: Scenario, table: PolicyTable, batches: Sequence[int], context: int, trace: str = ""
) -> np.ndarray:
    """Predicted tokens/s at each batch size with the table's policy for that batch (the policy
    PolicyTable.lookup gives, as a serving engine would switch)."""
    obj = objective_for(scenario, trace)
    out = np.empty(len(batches))
    groups: dict[TreePolicy | None, list[int]] = {}
    for i, b in enumerate(batches):
        groups.setdefault(table.lookup(int(b), context), []).append(i)
    for policy, idx in groups.items():
        out[idx] = obj.many(policy, [batches[i] for i in idx], context)
    return out
