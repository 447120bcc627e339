"""What a serving engine adds to each decoding iteration beyond the forward passes.

The cost model (spectune.planner.costmodel) prices the GPU work of an iteration from the
roofline and a Calibration. A serving engine also spends host time per iteration: its scheduler,
batch preparation, sampling, speculative bookkeeping (draft-step launches, tree masks, accept and
KV bookkeeping), and more of it with more tensor-parallel ranks. Part of that host time overlaps
GPU work (overlap schedulers), and the rest is added to the step. `EngineOverheads` is that model;
`CostModel.iteration` charges `EngineOverheads.iteration_s` as the step's `engine_s` term.

    engine_s = (1 - overlap) * (iteration_s + per_request_s * batch
                                + speculating * (spec_iteration_s + per_draft_step_s * steps
                                                 + tree_s * is_tree))
               * (1 + tp_growth * log2(tp))

The zero profile (every field 0) is spectune's own executor, whose per-step host costs are
already in its Calibration (step_overhead_s, draft_step_s, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from spectune.specs.errors import SpecError
from spectune.specs.io import help_field


@dataclass(frozen=True)
class EngineOverheads:
    """Host-side seconds an engine adds per decoding iteration (see the module docstring)."""

    iteration_s: float = help_field(
        0.0, help="fixed host cost per iteration, speculation on or off (scheduler, batch prep), s"
    )
    per_request_s: float = help_field(
        0.0, help="host cost per running request per iteration (input prep, detokenize), s"
    )
    spec_iteration_s: float = help_field(
        0.0,
        help="extra fixed host cost per iteration when speculating (verify/accept bookkeeping, "
        "draft-extend setup, KV slot moves), s",
    )
    per_draft_step_s: float = help_field(
        0.0, help="host cost per draft step (launches and syncs the engine does per step), s"
    )
    tree_s: float = help_field(
        0.0, help="extra host cost per iteration of a tree (topk > 1: masks, positions), s"
    )
    overlap: float = help_field(
        0.0,
        help="fraction 0..1 of the host cost hidden behind GPU work (overlap scheduler); "
        "the rest adds to the step",
    )
    tp_growth: float = help_field(
        0.0, help="relative growth of the host cost per doubling of tensor-parallel ranks"
    )

    def __post_init__(self) -> None:
        for name in (
            "iteration_s",
            "per_request_s",
            "spec_iteration_s",
            "per_draft_step_s",
            "tree_s",
            "tp_growth",
        ):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not (0.0 <= float(v) < 1.0):
                raise SpecError(f"EngineOverheads.{name} must be in [0, 1) seconds, got {v!r}")
        if not isinstance(self.overlap, int | float) or not (0.0 <= float(self.overlap) <= 1.0):
            raise SpecError(f"EngineOverheads.overlap must be in [0, 1], got {self.overlap!r}")

    def iteration_s_for(
        self, batch: ArrayLike, draft_steps: ArrayLike, tree: ArrayLike, tp: int = 1
    ) -> np.ndarray:
        """Seconds added to one iteration of `batch` requests (float64, broadcast): with
        `draft_steps` > 0 the iteration speculates (draft_steps drafter steps), `tree` (bool)
        marks a tree (topk > 1) rather than a chain."""
        b = np.asarray(batch, dtype=np.float64)
        d = np.asarray(draft_steps, dtype=np.float64)
        is_tree = np.asarray(tree, dtype=np.float64)
        spec = np.where(
            d > 0, self.spec_iteration_s + self.per_draft_step_s * d + self.tree_s * is_tree, 0.0
        )
        host = self.iteration_s + self.per_request_s * b + spec
        scale = 1.0 + self.tp_growth * np.log2(max(int(tp), 1))
        return np.asarray((1.0 - self.overlap) * host * scale, dtype=np.float64)


NO_OVERHEADS = EngineOverheads()
"""spectune's own executor: its host costs are in the Calibration."""
