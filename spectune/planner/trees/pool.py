"""Building trees from a recorded candidate pool (trace replay), with the same rules as the
synthetic builders: EAGLE-2 top-k expansion and rerank by path draft log-prob, or the static
shape mapped onto the pool by rank; pruning by path probability; grafting the pool's recorded
retrieval candidates into the freed slots, skipping any whose token duplicates a kept sibling.
"""

from __future__ import annotations

import numpy as np

from spectune.planner.acceptance.replay import ReplayStep
from spectune.planner.trees.static import static_shape
from spectune.specs.policy import TreePolicy
from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL, DraftTree


def _model_children(pool: DraftTree) -> list[list[int]]:
    """Model children of each pool node, by draft log-prob (highest first)."""
    kids: list[list[int]] = [[] for _ in range(pool.num_nodes)]
    lp = pool.logprobs
    for i in range(1, pool.num_nodes):
        if pool.source[i] == SOURCE_MODEL:
            kids[int(pool.parents[i])].append(i)
    for k in kids:
        k.sort(key=lambda i: (-lp[i], i))
    return kids


def select_dynamic(pool: DraftTree, depth: int, topk: int, budget: int) -> np.ndarray:
    """bool[P]: the EAGLE-2 selection of at most budget nodes (root included) from a pool."""
    kids = _model_children(pool)
    plp = pool.path_logprob
    cands = [c for c in kids[0][:topk]]
    level = list(cands)
    for _ in range(2, depth + 1):
        expand = sorted(level, key=lambda i: (-plp[i], i))[:topk]
        level = [c for e in expand for c in kids[e][:topk]]
        cands.extend(level)
    chosen = sorted(cands, key=lambda i: (-plp[i], int(pool.depth[i]), i))[: budget - 1]
    keep = np.zeros(pool.num_nodes, dtype=bool)
    keep[0] = True
    keep[chosen] = True
    # a parent outranks its child unless its own draft prob is 1; keep parents in any case
    for i in np.flatnonzero(keep)[::-1].tolist():
        p = int(pool.parents[i])
        while p > 0 and not keep[p]:
            keep[p] = True
            p = int(pool.parents[p])
    return keep


def select_static(pool: DraftTree, shape_parents: np.ndarray, shape_rank: np.ndarray) -> np.ndarray:
    """bool[P]: the pool nodes that a static shape maps onto (rank r -> r-th most probable model
    child); shape nodes with no recorded counterpart are dropped with their subtrees."""
    kids = _model_children(pool)
    where = np.full(shape_parents.size, -1, dtype=np.int64)
    where[0] = 0
    for i in range(1, shape_parents.size):
        par = int(where[shape_parents[i]])
        r = int(shape_rank[i])
        if par >= 0 and r < len(kids[par]):
            where[i] = kids[par][r]
    keep = np.zeros(pool.num_nodes, dtype=bool)
    keep[where[where >= 0]] = True
    return keep


def graft_from_pool(pool: DraftTree, keep: np.ndarray, slots: int) -> np.ndarray:
    """Add up to `slots` recorded retrieval nodes whose parent is kept, best path log-prob first,
    skipping those whose token equals a kept sibling's (dedup against model branches)."""
    keep = keep.copy()
    retr = np.flatnonzero(pool.source == SOURCE_RETRIEVAL)
    order = sorted(retr.tolist(), key=lambda i: (int(pool.depth[i]), -pool.path_logprob[i], i))
    added = 0
    changed = True
    while changed and added < slots:
        changed = False
        for i in order:
            if added >= slots:
                break
            par = int(pool.parents[i])
            if keep[i] or not keep[par]:
                continue
            sib = np.flatnonzero(keep & (pool.parents == par))
            if (pool.tokens[sib] == pool.tokens[i]).any():
                continue
            keep[i] = True
            added += 1
            changed = True
    return keep


def build_from_pool(policy: TreePolicy, model: ReplayStep, rng: np.random.Generator) -> DraftTree:
    """The tree a policy builds from one recorded step's pool (deterministic; rng unused)."""
    del rng
    pool = model.step.pool
    if policy.builder == "static":
        if model.parent is None:
            raise ValueError("static trees from a ReplayStep need its TraceReplay (draw_step)")
        shape = static_shape(model.parent, policy.budget, policy.depth, policy.topk)
        keep = select_static(pool, shape.parents, shape.rank)
    else:
        keep = select_dynamic(pool, policy.depth, policy.topk, policy.budget)
    if policy.prune_threshold > 0.0:
        keep &= np.exp(pool.path_logprob) >= policy.prune_threshold
        keep[0] = True
        keep &= _closed(pool, keep)
    if policy.graft_budget > 0:
        slots = min(policy.graft_budget, policy.budget - int(keep.sum()))
        keep = graft_from_pool(pool, keep, slots)
    return pool.subtree(keep)


def _closed(pool: DraftTree, keep: np.ndarray) -> np.ndarray:
    """Drop kept nodes whose parent is not kept (in index order, so whole subtrees go)."""
    out = keep.copy()
    for i in range(1, pool.num_nodes):
        if out[i] and not out[int(pool.parents[i])]:
            out[i] = False
    return out
