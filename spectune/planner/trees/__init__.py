"""Tree builders: Sequoia's static optimum, EAGLE-2 dynamic top-k, dynamic-depth pruning,
grafting of retrieved tokens, and the ECHO batch super-tree; plus a vectorised batch sampler of
one iteration's outcome and the planner's cached expected-tokens objective."""

from __future__ import annotations

from spectune.planner.trees.build import (
    build_batch_trees,
    build_tree,
    expected_tokens_for_policy,
    sample_accepted_lengths,
    sample_step,
)
from spectune.planner.trees.graft import graft_tree, prune_tree
from spectune.planner.trees.pool import build_from_pool
from spectune.planner.trees.static import (
    StaticShape,
    draft_widths,
    sequoia_dp,
    static_shape,
    static_size,
)

__all__ = [
    "StaticShape",
    "build_batch_trees",
    "build_from_pool",
    "build_tree",
    "draft_widths",
    "expected_tokens_for_policy",
    "graft_tree",
    "prune_tree",
    "sample_accepted_lengths",
    "sample_step",
    "sequoia_dp",
    "static_shape",
    "static_size",
]
