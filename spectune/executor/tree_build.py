"""Draft trees on the GPU: the torch port of the planner's dynamic top-k builder (EAGLE-2).

Drafting fills a candidate pool per sequence, in level order (so a parent precedes its children):
level 1 holds the root's top-k children, each later level the k*k children of that level's
frontier (the k best nodes of the level above by cumulative draft log-prob). `select_tree`
keeps the budget-1 best pool entries by cumulative log-prob (ties: lower pool index first, the
numpy reference's stable order), which is closed under parents because a child's cumulative
log-prob never exceeds its parent's, and lays the kept nodes out as a tree batch: node 0 the
root, kept nodes in pool order. Everything is batched tensor work: no host sync, no per-node loop.

Dynamic-depth pruning (`prune_tree`, both builders) then drops every node whose path draft
probability is below the policy's prune_threshold (root always kept), as the planner's
trees.build._choose does (`keep &= lp >= log(p)`). A child's path log-prob never exceeds its
parent's, so the kept set stays closed under parents; it is compacted to the front of each row
(kept nodes in their old order, so parents still precede children) and the freed slots become
inert placeholders (PRUNED token, child of the root, acceptance 0) that never match a target.

Pool (per sequence, P = k + (depth-1) * k * k entries):
    token int64[B, P], parent int64[B, P] (pool index, -1 = root), score float32[B, P]
    (cumulative log-prob), accept / lo float32[B, P] (synthetic acceptance of the node),
    level int64[P] (depth of each entry; static).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from spectune.executor.draws import ROOT_ID

#: token of a pruned slot: no target token (all >= 0) equals it, so it is never accepted
PRUNED = -1


def pool_size(depth: int, topk: int) -> int:
    """Entries a dynamic top-k draft of `depth` steps produces per sequence."""
    return topk + (depth - 1) * topk * topk


def tree_size(depth: int, topk: int, budget: int) -> int:
    """Nodes of the verified tree (root included): the budget, or the whole pool if smaller."""
    return min(budget, 1 + pool_size(depth, topk))


def pool_levels(depth: int, topk: int) -> np.ndarray:
    """int64[P]: depth of each pool entry."""
    return np.concatenate(
        [np.full(topk, 1)] + [np.full(topk * topk, lv) for lv in range(2, depth + 1)]
    )


def stable_topk(score: torch.Tensor, k: int) -> torch.Tensor:
    """int64[B, k]: indices of the k largest entries of score [B, M], ties to the lower index."""
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    return order[:, :k]


@dataclass
class TreeBatch:
    """B verify trees of N nodes each (node 0 the root).

    parents int64[B, N] (root -1); tokens int64[B, N]; depth int64[B, N];
    accept, lo float32[B, N] (synthetic acceptance; root 1, 0); mask bool[B, N, N] (ancestor
    matrix: [b, i, j] when j is i or an ancestor of i); score float32[B, N] (path draft log-prob,
    root 0) where pruning needs it, else None; ids int64[B, N] (node ids for the common random
    draws, executor.draws; root ROOT_ID) where the source tracks them, else None
    """

    parents: torch.Tensor
    tokens: torch.Tensor
    depth: torch.Tensor
    accept: torch.Tensor
    lo: torch.Tensor
    mask: torch.Tensor
    score: torch.Tensor | None = None
    ids: torch.Tensor | None = None


def ancestor_mask(parents: torch.Tensor, max_depth: int) -> torch.Tensor:
    """bool[B, N, N] from parents int64[B, N] (root -1): `max_depth` gather steps up the tree."""
    b, n = parents.shape
    eye = torch.eye(n, dtype=torch.bool, device=parents.device).expand(b, n, n)
    mask = eye.clone()
    cur = parents
    rows = torch.arange(n, device=parents.device).expand(b, n)
    for _ in range(max_depth):
        live = cur >= 0
        hit = torch.zeros((b, n, n + 1), dtype=torch.bool, device=parents.device)
        hit.scatter_(2, torch.where(live, cur, n)[..., None], True)
        mask |= hit[..., :n]
        cur = torch.where(live, torch.gather(parents, 1, cur.clamp(min=0)), cur)
    del rows
    return mask


def select_tree(
    pool_token: torch.Tensor,
    pool_parent: torch.Tensor,
    pool_score: torch.Tensor,
    pool_accept: torch.Tensor,
    pool_lo: torch.Tensor,
    pool_level: torch.Tensor,
    root_token: torch.Tensor,
    nodes: int,
    max_depth: int,
    with_score: bool = False,
    pool_id: torch.Tensor | None = None,
) -> TreeBatch:
    """Keep the nodes-1 best pool entries of each sequence and lay them out as trees.

    pool_*: [B, P] (pool_level int64[P]); root_token int64[B]; nodes: N <= P + 1;
    with_score: also return each node's path log-prob (TreeBatch.score; pruning reads it);
    pool_id: int64[B, P] node ids of the pool entries (TreeBatch.ids; root ROOT_ID), or None.
    """
    b, p = pool_score.shape
    dev = pool_score.device
    keep = stable_topk(pool_score, nodes - 1)  # [B, N-1]
    keep = torch.sort(keep, dim=-1).values  # pool order: parents before children
    # pool index -> tree node (1..N-1); root (-1) -> 0
    where = torch.zeros((b, p), dtype=torch.int64, device=dev)
    where.scatter_(1, keep, torch.arange(1, nodes, device=dev).expand(b, nodes - 1))
    par_pool = torch.gather(pool_parent, 1, keep)
    par_tree = torch.where(par_pool >= 0, torch.gather(where, 1, par_pool.clamp(min=0)), 0)
    minus1 = torch.full((b, 1), -1, dtype=torch.int64, device=dev)
    parents = torch.cat((minus1, par_tree), dim=1)
    tokens = torch.cat((root_token[:, None], torch.gather(pool_token, 1, keep)), dim=1)
    depth = torch.cat((torch.zeros_like(minus1), pool_level[keep]), dim=1)
    ones = torch.ones((b, 1), dtype=pool_accept.dtype, device=dev)
    accept = torch.cat((ones, torch.gather(pool_accept, 1, keep)), dim=1)
    lo = torch.cat((ones * 0, torch.gather(pool_lo, 1, keep)), dim=1)
    score = None
    if with_score:
        score = torch.cat((ones * 0, torch.gather(pool_score, 1, keep)), dim=1)
    ids = None
    if pool_id is not None:
        root = torch.full((b, 1), ROOT_ID, dtype=torch.int64, device=dev)
        ids = torch.cat((root, torch.gather(pool_id, 1, keep)), dim=1)
    mask = ancestor_mask(parents, max_depth)
    return TreeBatch(parents, tokens, depth, accept, lo, mask, score, ids)


def prune_tree(tree: TreeBatch, threshold: float) -> tuple[TreeBatch, torch.Tensor]:
    """Drop the nodes whose path draft probability is below `threshold` (> 0) and compact.

    tree: B trees of N nodes with tree.score set. Returns (the pruned trees, still [B, N]: row b
    holds its counts[b] kept nodes first, in their old order, then placeholders: PRUNED token,
    parent 0, depth 1, accept 0, mask self + root), counts int64[B] (kept nodes, root included)).
    The comparison is made in float64 against log(threshold), as the planner's numpy builder
    does on its float64 path log-probs."""
    assert tree.score is not None, "prune_tree needs the nodes' path log-probs (tree.score)"
    b, n = tree.parents.shape
    dev = tree.parents.device
    kept = tree.score.double() >= math.log(threshold)
    kept[:, 0] = True
    counts = kept.sum(dim=1)
    # kept first, old order within each group (a stable partition, no sort)
    kept_l = kept.long()
    new_of_old = torch.where(
        kept, torch.cumsum(kept_l, 1) - 1, counts[:, None] + torch.cumsum(1 - kept_l, 1) - 1
    )
    ar = torch.arange(n, device=dev).expand(b, n)
    idx = torch.empty_like(new_of_old)  # new slot -> old node
    idx.scatter_(1, new_of_old, ar)
    live = ar < counts[:, None]  # [B, N] new slot holds a kept node
    par_old = torch.gather(tree.parents, 1, idx)
    par_new = torch.where(par_old >= 0, torch.gather(new_of_old, 1, par_old.clamp(min=0)), -1)
    parents = torch.where(live, par_new, 0)
    parents[:, 0] = -1
    tokens = torch.where(live, torch.gather(tree.tokens, 1, idx), PRUNED)
    depth = torch.where(live, torch.gather(tree.depth, 1, idx), 1)
    zero = torch.zeros((), dtype=tree.accept.dtype, device=dev)
    accept = torch.where(live, torch.gather(tree.accept, 1, idx), zero)
    lo = torch.where(live, torch.gather(tree.lo, 1, idx), zero)
    score = torch.where(live, torch.gather(tree.score, 1, idx), zero)
    rows = torch.gather(tree.mask, 1, idx[:, :, None].expand(b, n, n))
    mask = torch.gather(rows, 2, idx[:, None, :].expand(b, n, n))  # ancestors of kept are kept
    eye = torch.eye(n, dtype=torch.bool, device=dev)
    placeholder = eye.clone()
    placeholder[:, 0] = True
    mask = torch.where(live[:, :, None], mask, placeholder)
    ids = None
    if tree.ids is not None:
        ids = torch.where(live, torch.gather(tree.ids, 1, idx), 0)
    return TreeBatch(parents, tokens, depth, accept, lo, mask, score, ids), counts


def reference_prune(
    parents: np.ndarray, score: np.ndarray, threshold: float
) -> tuple[np.ndarray, np.ndarray]:
    """numpy, one tree at a time (tests only): (kept bool[B, N] over the old nodes, compacted
    parents int64[B, N] laid out as prune_tree does: kept nodes first, placeholders parent 0)."""
    b, n = parents.shape
    kept = score.astype(np.float64) >= np.log(threshold)
    kept[:, 0] = True
    out = np.zeros((b, n), dtype=np.int64)
    for i in range(b):
        old = np.flatnonzero(kept[i])
        where = {int(o): j for j, o in enumerate(old)}
        out[i, 0] = -1
        for j, o in enumerate(old[1:], start=1):
            out[i, j] = where[int(parents[i, o])]
    return kept, out


def reference_select_tree(
    pool_token: np.ndarray,
    pool_parent: np.ndarray,
    pool_score: np.ndarray,
    pool_level: np.ndarray,
    root_token: np.ndarray,
    nodes: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """numpy, one sequence at a time: (parents, tokens, depth) int64[B, N] (tests only)."""
    b = pool_score.shape[0]
    out = np.zeros((3, b, nodes), dtype=np.int64)
    for i in range(b):
        order = sorted(range(pool_score.shape[1]), key=lambda j: (-float(pool_score[i, j]), j))
        keep = sorted(order[: nodes - 1])
        index = {j: t + 1 for t, j in enumerate(keep)}
        out[0, i, 0], out[1, i, 0], out[2, i, 0] = -1, root_token[i], 0
        for t, j in enumerate(keep, start=1):
            par = int(pool_parent[i, j])
            out[0, i, t] = 0 if par < 0 else index[par]
            out[1, i, t] = pool_token[i, j]
            out[2, i, t] = pool_level[j]
    return out[0], out[1], out[2]


def delayed_tree(
    full_token: torch.Tensor,
    full_accept: torch.Tensor,
    full_lo: torch.Tensor,
    layout: tuple[np.ndarray, np.ndarray],
) -> TreeBatch:
    """The delayed policy's trees (planner.trees.delayed) from a drafted level-major layout.

    full_token int64[B, F], full_accept / full_lo float32[B, F]: the root, the chain, then topk
    slots per rollout level, as the drafter filled them (F = 1 + delay + topk * (depth - delay));
    layout: planner.trees.delayed.delayed_layout (parents int32[N], full_index int64[N]).
    Gathers the N kept slots (a budget cut drops the tips of the last rollouts)."""
    parents_np, full_np = layout
    dev = full_token.device
    b = full_token.shape[0]
    idx = torch.as_tensor(full_np, device=dev).expand(b, -1)
    parents = torch.as_tensor(parents_np.astype(np.int64), device=dev).expand(b, -1).contiguous()
    depth_np = np.zeros(parents_np.size, dtype=np.int64)
    for i in range(1, parents_np.size):  # host, once per policy shape (N <= budget)
        depth_np[i] = depth_np[parents_np[i]] + 1
    depth = torch.as_tensor(depth_np, device=dev).expand(b, -1).contiguous()
    return TreeBatch(
        parents,
        torch.gather(full_token, 1, idx),
        depth,
        torch.gather(full_accept, 1, idx),
        torch.gather(full_lo, 1, idx),
        ancestor_mask(parents, int(depth_np.max(initial=0))),
    )
