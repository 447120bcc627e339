"""Plan a policy table for what the executor runs, with a calibrated cost model (CPU only).

To measure "the planned policy" on a GPU the executor needs the plan made with the calibration
fitted on that GPU (planner.objective.closed_form_objective with it, as `spectune plan
--calibration FILE` builds, but without prefill turnover) and restricted to the trees it runs:
dynamic top-k and static, with or without dynamic-depth pruning (the executor verifies only the
kept nodes, as the cost model prices them), never grafting (grafting fills pruned slots with
retrieved n-gram/suffix continuations, and the executor has no retrieval drafter, so
SpecRunner rejects graft_budget > 0), never a shared verify budget (ECHO's super-tree, which
SpecRunner rejects too). This module runs the planner's own search with that space and writes
an ordinary PolicyTable, one bucket per measured batch size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from spectune.specs import PolicyTable
from spectune.specs.calibration import Calibration


def plan_table(
    calibration: Calibration,
    *,
    target: str,
    drafter: str,
    workload: str,
    batches: Sequence[int],
    context: int,
    trials: int = 48,
    seed: int = 0,
    min_gain: float | None = None,
    builders: tuple[str, ...] = ("dynamic-topk", "static"),
) -> PolicyTable:
    """A PolicyTable for `batches` at `context` on the calibrated GPU (calibration.hardware)."""
    from spectune import __version__
    from spectune.planner.buckets import BucketSpec
    from spectune.planner.objective import closed_form_objective
    from spectune.planner.search import SearchSettings, search
    from spectune.planner.space import PolicySpace
    from spectune.planner.table import build_table

    # the objective `spectune plan --calibration` builds; no turnover: the executor measures
    # pure decode steps at a fixed context
    closed = closed_form_objective(
        target,
        drafter,
        calibration.hardware,
        workload,
        seed=seed,
        calibration=calibration,
        turnover=False,
    )
    space = PolicySpace(
        builders=builders, budget=(2, 128), allow_prune=True, graft=(0, 0), allow_shared=False
    )
    settings = SearchSettings(trials=trials, seed=seed, space=space)
    if min_gain is not None:  # the planner's margin before it leaves an engine default
        settings = dataclasses.replace(settings, min_gain=min_gain)
    buckets = [BucketSpec((b, b), (context, context)) for b in batches]
    results = search(closed, buckets, settings, setup={"calibration": calibration.source})
    scenario = {
        "target": target,
        "drafter": drafter,
        "gpu": calibration.hardware,
        "workload": workload,
        "tp": 1,
    }
    provenance = {
        "spectune": __version__,
        "planner": "spectune.validate.planned.plan_table",
        "calibration": calibration.source,
        "trials": trials,
        "seed": seed,
        "min_gain": settings.min_gain,
        "space": f"{', '.join(builders)}; prune allowed, no graft, no shared budget "
        "(what the executor runs)",
    }
    return build_table(results, closed, scenario, provenance)
