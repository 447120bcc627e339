"""The price of one decoding iteration, split into the phases every consumer reads.

`CostModel.iteration` returns a StepBreakdown; the closed-form objective, the simulator's step
tables, the dashboards' What-if page, `spectune check` and the calibration fit read its fields
and its total and add no term of their own. A new term of an iteration (such as a serving
engine's host time) is therefore priced in one place, `CostModel.iteration`, and reaches every
consumer.

    total_s = draft_s + intermediate_s + verify_s + extend_s + overhead_s + retrieval_s
              + prune_s + engine_s

summed in that order (the display order of `phases`). Every field is a float64 array in
seconds; all fields of one breakdown have the same shape, the broadcast of the arguments of
the `iteration` call that made it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from spectune.planner.operators import F64

PHASES: tuple[tuple[str, str], ...] = (
    ("draft", "draft_s"),
    ("intermediate verify", "intermediate_s"),
    ("verify", "verify_s"),
    ("draft extend", "extend_s"),
    ("overhead", "overhead_s"),
    ("retrieval", "retrieval_s"),
    ("pruning", "prune_s"),
    ("engine", "engine_s"),
)
"""(display name, field) of every phase, in display and summation order."""

ALWAYS = frozenset({"verify", "overhead"})
"""Phases every iteration has (the others are listed only where they cost something)."""


@dataclass(frozen=True, eq=False)
class StepBreakdown:
    """Seconds of each phase of one decoding iteration of the whole batch (float64 arrays of
    one shape; zero where a phase does not apply)."""

    draft_s: F64
    """drafting phase: the first draft step (fed by the target) and depth - 1 steps over top-k
    tokens per sequence, plus the tree builder's fixed cost per step; without a model drafter,
    the retrieval lookup. 0 with speculation off."""
    verify_s: F64
    """target forward over the tree tokens of every sequence (1 token with speculation off),
    logits at every token"""
    extend_s: F64
    """drafter pass over the accepted tokens (draft extend); 0 with speculation off or without
    a model drafter"""
    overhead_s: F64
    """scheduler, sampling and tree building outside the forward passes (Calibration's
    step_overhead_s, per_request_overhead_s and tree_build costs)"""
    retrieval_s: F64
    """retrieval lookup of a grafting policy (graft_budget > 0); 0 otherwise"""
    prune_s: F64
    """pruning pass, ragged packing and host read of a pruning policy (prune_threshold > 0);
    0 otherwise"""
    engine_s: F64
    """the serving engine's host time per iteration not hidden behind GPU work
    (specs.engine.EngineOverheads); 0 for spectune's own executor"""
    intermediate_s: F64 = field(default_factory=lambda: np.zeros(()))
    """hierarchical drafting (TreePolicy.chain > 0): the intermediate model's verification of
    the drafter's trees, every round until its chain is long enough (planner.hierarchical);
    0 otherwise. Last in the field order (it has a default); second in PHASES."""

    @property
    def total_s(self) -> F64:
        """Seconds of the whole iteration: the sum of the phases, in PHASES order."""
        total = np.asarray(getattr(self, PHASES[0][1]), dtype=np.float64)
        for _, name in PHASES[1:]:
            total = total + getattr(self, name)
        return np.asarray(total, dtype=np.float64)

    def phases(self) -> dict[str, F64]:
        """Display name -> seconds, in display order: verify and overhead always, every other
        phase where it costs something at any point (so speculation off lists no drafting, a
        policy without pruning no pruning, an engine without host overhead no engine)."""
        out: dict[str, F64] = {}
        for label, name in PHASES:
            value = getattr(self, name)
            if label in ALWAYS or np.any(value != 0.0):
                out[label] = value
        return out
