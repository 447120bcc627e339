"""Plan a policy table for what the executor runs, with a calibrated cost model (CPU only).

To measure "the planned policy" on a GPU the executor needs the plan made for that GPU's
Scenario, priced with the calibration fitted on it (the scenario's `calibration`), by the
planner's own closed form (planner.objective.scenario_objective) in its decode-only form: the
executor times pure decode steps at a fixed batch and context, with no prefill turnover. The
search covers every tree the executor runs: dynamic top-k and static, with or without
dynamic-depth pruning (the executor verifies only the kept nodes, as the cost model prices
them), grafting of retrieved chains into freed slots (GRAFT_RANGE) and ECHO's shared verify
budget; the verify budget is bounded by BUDGET_RANGE (the executor's caches hold the trees next
to the weights at batch 64). This module runs the planner's own search with that space and
writes an ordinary PolicyTable, one bucket per measured batch size, that records its Scenario.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from spectune.specs import PolicyTable
from spectune.specs.scenario import Scenario

BUDGET_RANGE = (2, 128)
GRAFT_RANGE = (0, 16)


def plan_table(
    scenario: Scenario,
    *,
    batches: Sequence[int],
    context: int,
    trials: int = 48,
    seed: int = 0,
    min_gain: float | None = None,
    builders: tuple[str, ...] = ("dynamic-topk", "static"),
) -> PolicyTable:
    """A PolicyTable for `batches` at `context` for the scenario (its GPU, models, workload
    and calibration file; a calibration fitted on another GPU is a SpecError)."""
    from spectune import __version__
    from spectune.planner.buckets import BucketSpec
    from spectune.planner.objective import scenario_objective
    from spectune.planner.search import SearchSettings, search
    from spectune.planner.space import PolicySpace
    from spectune.planner.table import build_table

    resolved = scenario.resolve()
    closed = scenario_objective(resolved, decode_only=True, seed=seed)
    source = resolved.calibration.source if resolved.calibration else "defaults"
    space = PolicySpace(
        builders=builders, budget=BUDGET_RANGE, allow_prune=True, graft=GRAFT_RANGE,
        allow_shared=True,
    )  # fmt: skip
    settings = SearchSettings(trials=trials, seed=seed, space=space)
    if min_gain is not None:  # the planner's margin before it leaves an engine default
        settings = dataclasses.replace(settings, min_gain=min_gain)
    buckets = [BucketSpec((b, b), (context, context)) for b in batches]
    results = search(closed, buckets, settings, setup={"calibration": source})
    provenance = {
        "spectune": __version__,
        "planner": "spectune.validate.planned.plan_table",
        "calibration": source,
        "trials": trials,
        "seed": seed,
        "min_gain": settings.min_gain,
        "space": f"{', '.join(builders)}; budget {BUDGET_RANGE}, prune allowed, graft "
        f"{GRAFT_RANGE}, shared budget allowed (what the executor runs); decode-only closed form",
    }
    return build_table(results, closed, scenario, provenance)
