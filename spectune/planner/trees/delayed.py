"""Delayed tree expansion: one drafted path first, then i.i.d. branches from a later node.

The tree of a `delayed` policy (depth D, top-k k, delay L, budget B): the root, a chain of L
sampled tokens, then k rollouts sampled i.i.d. from the drafter at the chain's last node (the
root when L = 0), each a chain of D - L tokens. Rollouts branch only where they differ, so the
shape drafts k sequences for the price of one shared prefix; it keeps the target distribution
under every lossless rule because each child is a draw from its parent's draft distribution
(Dynamic Delayed Tree Expansion, 2025). When 1 + L + k (D - L) exceeds B, the rollouts are cut
evenly (the first ones keep one token more) and a delay past B - 1 is cut to B - 1. Nodes are
numbered level by level (the order a drafter produces them).

The shape is one function of the policy, used alike by the planner (trees.build), the
simulator (through trees.build) and the executor (executor.tree_build.delayed_parents).
"""

from __future__ import annotations

import numpy as np

from spectune.specs.policy import TreePolicy
from spectune.specs.tree import DraftTree


def delayed_parents(depth: int, topk: int, delay: int, budget: int) -> np.ndarray:
    """int32[N]: parents of the delayed tree, N <= budget, level by level: the root, the chain,
    then the rollouts' first tokens, their second tokens, ... (rollout j of length L_j is in
    levels 1..L_j). Every parent precedes its children; the executor drafts in this order."""
    return delayed_layout(depth, topk, delay, budget)[0]


def delayed_layout(depth: int, topk: int, delay: int, budget: int) -> tuple[np.ndarray, np.ndarray]:
    """(parents int32[N], full_index int64[N]): the tree, and each node's index in the uncut
    level-major layout of 1 + delay + topk * (depth - delay) slots (root, chain, then topk
    slots per rollout level) that a drafter fills one level per step."""
    chain = min(delay, budget - 1)
    left = budget - 1 - chain
    span = depth - chain
    lengths = np.array([min(span, left // topk + (j < left % topk)) for j in range(topk)])
    parents = list(range(-1, chain))  # root, then the chain
    full = list(range(chain + 1))
    last = np.full(topk, chain)  # current tip of each rollout (tree index)
    for level in range(1, int(lengths.max(initial=0)) + 1):
        for j in np.flatnonzero(lengths >= level):
            parents.append(int(last[j]))
            last[j] = len(parents) - 1
            full.append(chain + 1 + (level - 1) * topk + int(j))
    return np.asarray(parents, dtype=np.int32), np.asarray(full, dtype=np.int64)


def delayed_nodes(policy: TreePolicy) -> int:
    """Verify tokens (root included) of a delayed policy's tree."""
    return int(delayed_parents(policy.depth, policy.topk, policy.delay, policy.budget).size)


def delayed_tree(policy: TreePolicy) -> DraftTree:
    """The delayed policy's tree shape (tokens and log-probs are drawn per step)."""
    return DraftTree.from_parents(
        delayed_parents(policy.depth, policy.topk, policy.delay, policy.budget)
    )
