"""Tree sources: where a speculative step's verify trees come from (the draft and tree phases).

- DynamicTopK (dynamic.py): EAGLE-2 dynamic top-k expansion with global rerank;
- StaticShape (static.py): a fixed Sequoia shape from the planner, drafted level by level;
- Delayed (delayed.py): one sampled path, then i.i.d. sampled rollouts (planner.trees.delayed);
- Pruned (pruned.py): dynamic-depth pruning of the top-k sources, verified as a ragged batch;
- Shared (shared.py): ECHO's one verify budget for the whole batch over either's candidates;
- Grafted (grafted.py): retrieved chains (retrieval.py) in the slots any of the above left free.
`make_source` picks them for a TreePolicy; base.py holds the interface and the drafting state.
"""

from __future__ import annotations

from spectune.executor.retrieval import RetrievalDrafter
from spectune.executor.sources.base import Drafting, DraftRoot, TreeSource
from spectune.executor.sources.delayed import Delayed
from spectune.executor.sources.dynamic import DynamicTopK
from spectune.executor.sources.grafted import Grafted
from spectune.executor.sources.pruned import Pruned
from spectune.executor.sources.shared import Shared, shared_row_nodes
from spectune.executor.sources.static import StaticPlan, StaticShape
from spectune.executor.tree_build import pool_size, tree_size
from spectune.planner.trees import static_shape
from spectune.planner.trees.delayed import delayed_nodes
from spectune.planner.trees.static import static_size
from spectune.specs import TreePolicy

__all__ = [
    "Delayed",
    "DraftRoot",
    "Drafting",
    "DynamicTopK",
    "Grafted",
    "Pruned",
    "Shared",
    "StaticPlan",
    "StaticShape",
    "TreeSource",
    "cache_slots",
    "is_ragged",
    "make_source",
    "shares",
    "tree_slots",
    "verify_tokens",
]


def shares(policy: TreePolicy, batch: int) -> bool:
    """Whether this batch shares one verify budget (ECHO; at batch 1 it is the per-request one)."""
    return policy.shared_budget and batch > 1


def is_ragged(policy: TreePolicy, batch: int) -> bool:
    """Whether the trees differ in size per request (pruned or shared budget): ragged verify."""
    return policy.prune_threshold > 0 or shares(policy, batch)


def _static_size(policy: TreePolicy, batch: int) -> int:
    """Nodes of the static shape drafted (planner.trees.static.static_size)."""
    return static_size(policy.budget, shares(policy, batch))


def tree_slots(policy: TreePolicy, acceptance: object, batch: int) -> int:
    """Slots per sequence of the trees make_source lays out (root included): what the caches
    and buffers must hold."""
    if policy.builder == "delayed":  # no shared budget, pruning or grafting (TreePolicy)
        return delayed_nodes(policy)
    if policy.builder == "static":
        shape = static_shape(acceptance, _static_size(policy, batch), policy.depth, policy.topk)  # type: ignore[arg-type]
        nodes = columns = int(shape.parents.size)
    else:
        nodes = tree_size(policy.depth, policy.topk, policy.budget)
        columns = 1 + pool_size(policy.depth, policy.topk)
    if shares(policy, batch):
        nodes = shared_row_nodes(columns, policy.budget, batch)
    if policy.graft_budget > 0:
        nodes = nodes + policy.graft_budget if shares(policy, batch) else max(nodes, policy.budget)
    return nodes


def verify_tokens(policy: TreePolicy, acceptance: object) -> int:
    """Tree nodes (root included) a source of this policy verifies per sequence: the planner's
    static shape, or the dynamic tree's budget (the whole pool if smaller)."""
    if policy.builder == "delayed":
        return delayed_nodes(policy)
    if policy.builder == "static":
        return int(static_shape(acceptance, policy.budget, policy.depth, policy.topk).parents.size)  # type: ignore[arg-type]
    return tree_size(policy.depth, policy.topk, policy.budget)


def cache_slots(policy: TreePolicy, acceptance: object, batch: int) -> int:
    """Cache positions past the context a run of this policy writes per sequence: its tree
    slots, or the padded draft extend (depth + 1, + the longest grafted chain, at most
    graft_budget) or the dynamic drafter's own slots (the root plus top-k per step after the
    first, dynamic.DynamicTopK.slots) when those are longer."""
    drafted = 1 + (policy.depth - 1) * policy.topk if policy.builder == "dynamic-topk" else 0
    return max(
        tree_slots(policy, acceptance, batch), policy.depth + policy.graft_budget + 1, drafted
    )


def make_source(
    policy: TreePolicy,
    acceptance: object,
    drafting: Drafting,
    retrieval: RetrievalDrafter | None = None,
    max_depth: int | None = None,
) -> TreeSource:
    """The source of a policy: static (the planner's Sequoia shape for this acceptance model)
    or dynamic top-k; under a shared budget (batch > 1) Shared, else Pruned when
    policy.prune_threshold > 0; then Grafted when policy.graft_budget > 0 (needs `retrieval`).
    max_depth: deepest node of the final trees (depth + the longest grafted chain)."""
    prune = policy.prune_threshold > 0
    shared = shares(policy, drafting.batch)
    graft = policy.graft_budget > 0
    depth = policy.depth if max_depth is None else max_depth
    source: TreeSource
    if policy.builder == "delayed":
        return Delayed(drafting, policy.depth, policy.topk, policy.delay, policy.budget)
    if policy.builder == "static":
        size = _static_size(policy, drafting.batch)
        shape = static_shape(acceptance, size, policy.depth, policy.topk)  # type: ignore[arg-type]
        plan = StaticPlan(shape.parents, shape.rank, drafting.device)
        source = StaticShape(drafting, plan, with_score=prune or shared or graft)
        columns = plan.nodes
    else:
        nodes = tree_size(policy.depth, policy.topk, policy.budget)
        source = DynamicTopK(drafting, policy.depth, policy.topk, nodes)
        columns = 1 + pool_size(policy.depth, policy.topk)
    outcomes = drafting.synthetic.outcomes
    if shared:
        source = Shared(
            source, columns, policy.budget, policy.prune_threshold, policy.depth, outcomes
        )
    elif prune:
        source = Pruned(source, policy.prune_threshold)
    if graft:
        if retrieval is None:
            raise ValueError("a grafting policy needs a RetrievalDrafter")
        source = Grafted(
            source, retrieval, policy.budget, policy.graft_budget, shared, depth, outcomes
        )
    return source
