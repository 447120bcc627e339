"""Delayed tree expansion: one drafted path first, then i.i.d. branches from a later node.

The tree of a `delayed` policy (depth D, top-k k, delay L, budget B): the root, a chain of L
sampled tokens, then k rollouts sampled i.i.d. from the drafter at the chain's last node (the
root when L = 0), each a chain of D - L tokens. Rollouts branch only where they differ, so the
shape drafts k sequences for the price of one shared prefix; it keeps the target distribution
under every lossless rule because each child is a draw from its parent's draft distribution
(Dynamic Delayed Tree Expansion, 2025). When 1 + L + k (D - L) exceeds B, the rollouts are cut
evenly (the first ones keep one token more) and a delay past B - 1 is cut to B - 1.

The shape is one function of the policy, used alike by the planner (trees.build), the
simulator (through trees.build) and the executor (executor.tree_build.delayed_parents).
"""

from __future__ import annotations

import numpy as np

from spectune.specs.policy import TreePolicy
from spectune.specs.tree import DraftTree


def delayed_parents(depth: int, topk: int, delay: int, budget: int) -> np.ndarray:
    """int32[N]: parents of the delayed tree, N <= budget; the chain first, then each rollout
    contiguous (so every parent precedes its children)."""
    chain = min(delay, budget - 1)
    left = budget - 1 - chain
    span = depth - chain
    lengths = [min(span, left // topk + (j < left % topk)) for j in range(topk)]
    parents = list(range(-1, chain))  # root, then the chain
    for length in lengths:
        at = chain
        for _ in range(length):
            parents.append(at)
            at = len(parents) - 1
    return np.asarray(parents, dtype=np.int32)


def delayed_nodes(policy: TreePolicy) -> int:
    """Verify tokens (root included) of a delayed policy's tree."""
    return int(delayed_parents(policy.depth, policy.topk, policy.delay, policy.budget).size)


def delayed_tree(policy: TreePolicy) -> DraftTree:
    """The delayed policy's tree shape (tokens and log-probs are drawn per step)."""
    return DraftTree.from_parents(
        delayed_parents(policy.depth, policy.topk, policy.delay, policy.budget)
    )
