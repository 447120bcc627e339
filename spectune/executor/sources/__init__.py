"""Tree sources: where a speculative step's verify trees come from (the draft and tree phases).

- DynamicTopK (dynamic.py): EAGLE-2 dynamic top-k expansion with global rerank;
- StaticShape (static.py): a fixed Sequoia shape from the planner, drafted level by level;
- Delayed (delayed.py): one sampled path, then i.i.d. sampled rollouts (planner.trees.delayed);
- Pruned (pruned.py): dynamic-depth pruning of the top-k sources, verified as a ragged batch.
`make_source` picks them for a TreePolicy; base.py holds the interface and the drafting state.
"""

from __future__ import annotations

from spectune.executor.sources.base import Drafting, DraftRoot, TreeSource
from spectune.executor.sources.delayed import Delayed
from spectune.executor.sources.dynamic import DynamicTopK
from spectune.executor.sources.pruned import Pruned
from spectune.executor.sources.static import StaticPlan, StaticShape
from spectune.executor.tree_build import tree_size
from spectune.planner.trees import static_shape
from spectune.planner.trees.delayed import delayed_nodes
from spectune.specs import TreePolicy

__all__ = [
    "Delayed",
    "DraftRoot",
    "Drafting",
    "DynamicTopK",
    "Pruned",
    "StaticPlan",
    "StaticShape",
    "TreeSource",
    "make_source",
    "verify_tokens",
]


def verify_tokens(policy: TreePolicy, acceptance: object) -> int:
    """Tree nodes (root included) a source of this policy verifies per sequence: the planner's
    static shape, or the dynamic tree's budget (the whole pool if smaller)."""
    if policy.builder == "delayed":
        return delayed_nodes(policy)
    if policy.builder == "static":
        return int(static_shape(acceptance, policy.budget, policy.depth, policy.topk).parents.size)  # type: ignore[arg-type]
    return tree_size(policy.depth, policy.topk, policy.budget)


def make_source(policy: TreePolicy, acceptance: object, drafting: Drafting) -> TreeSource:
    """The source of a policy: static (the planner's Sequoia shape for this acceptance model)
    or dynamic top-k, wrapped in Pruned when policy.prune_threshold > 0."""
    prune = policy.prune_threshold > 0
    source: TreeSource
    if policy.builder == "delayed":
        return Delayed(drafting, policy.depth, policy.topk, policy.delay, policy.budget)
    if policy.builder == "static":
        shape = static_shape(acceptance, policy.budget, policy.depth, policy.topk)  # type: ignore[arg-type]
        plan = StaticPlan(shape.parents, shape.rank, drafting.device)
        source = StaticShape(drafting, plan, with_score=prune)
    else:
        nodes = tree_size(policy.depth, policy.topk, policy.budget)
        source = DynamicTopK(drafting, policy.depth, policy.topk, nodes)
    return Pruned(source, policy.prune_threshold) if prune else source
