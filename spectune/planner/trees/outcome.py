"""Choosing tree nodes from flat candidate pools, grafting retrieved chains, and the outcomes:
exact expected tokens, one sampled step per request, and the DraftTree of a request.

Works on trees.flat.FlatPool (layout in that module's docstring) for the whole batch at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectune.planner.acceptance.base import RetrievalProfile
from spectune.planner.trees.flat import REAL_FLOOR, TIE_BREAK, FlatPool, scratch, sort_keys
from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL, SOURCE_ROOT, DraftTree


# ---- choosing nodes ----------------------------------------------------------------------------
def keep_top(score: np.ndarray, per_row: int | None, total: int | None) -> np.ndarray:
    """bool[B, T]: column 0 always, plus the best-scoring other columns: `per_row` per request
    (equal split) or `total` over the whole batch (super-tree). Scores must not rise from parent
    to child; ties go to the earlier column, so the chosen set keeps parents."""
    b, t = score.shape
    finite = score[:, 1:] > REAL_FLOOR
    keyed = sort_keys(score)[:, 1:]
    keep = np.zeros((b, t), dtype=bool)
    keep[:, 0] = True
    if t == 1:
        return keep
    if per_row is not None:
        k = min(per_row, t - 1)
        if k <= 0:
            return keep
        if k < t - 1:
            thr = np.partition(keyed, t - 1 - k, axis=1)[:, t - 1 - k]
            keep[:, 1:] = (keyed >= thr[:, None]) & finite
        else:
            keep[:, 1:] = finite
        return keep
    assert total is not None
    flat = keyed.ravel()
    k = min(total, flat.size)
    if k <= 0:
        return keep
    if k < flat.size:
        thr = np.partition(flat, flat.size - k)[flat.size - k]
        keep[:, 1:] = (keyed >= thr) & finite
    else:
        keep[:, 1:] = finite
    return keep


@dataclass
class RowThreshold:
    """The equal-split choice without a mask: column c of request b is kept when its sort key
    (path log-prob, ties to the earlier column) is >= key_min[b] and its path log-prob is
    >= lp_min (the prune threshold). Same set as keep_top(lp, per_row) & pruning."""

    key_min: np.ndarray  # float64[B]
    lp_min: float

    def mask(self, pool: FlatPool) -> np.ndarray:
        """bool[B, T]: the kept mask this threshold stands for (root included)."""
        floor = np.maximum(np.maximum(self.key_min, self.lp_min), REAL_FLOOR)
        kept = sort_keys(pool.lp) >= floor[:, None]
        kept[:, 0] = True
        return kept


def row_threshold(pool: FlatPool, per_row: int, lp_min: float) -> RowThreshold:
    """The per-request threshold of keep_top(pool.lp, per_row, None)."""
    b, t = pool.lp.shape
    k = min(per_row, t - 1)
    if k <= 0:
        return RowThreshold(np.full(b, np.inf), lp_min)
    if k >= t - 1:
        return RowThreshold(np.full(b, -np.inf), lp_min)
    keys = scratch(("keys", b, t), {"keys": ((b, t - 1), np.float64)})["keys"]
    np.subtract(pool.lp[:, 1:], TIE_BREAK * np.arange(1, t), out=keys)
    keys.partition(t - 1 - k, axis=1)  # in place: the scratch row is ours
    return RowThreshold(keys[:, t - 1 - k].copy(), lp_min)


@dataclass
class Grafts:
    """Retrieved chains attached to leaves: for request b, leaf column leaf[b, g] carries a chain
    of length[b, g] tokens whose conditional match probabilities are rho[b, :length]."""

    leaf: np.ndarray  # int64[B, G]
    length: np.ndarray  # int64[B, G]
    rho: np.ndarray  # float64[B, J]
    match_len: np.ndarray  # int64[B]

    def expected_gain(self, p_leaf: np.ndarray) -> np.ndarray:
        """float64[B]: expected extra accepted tokens from the chains."""
        cum = np.cumsum(np.cumprod(self.rho, axis=1), axis=1)  # [B, J]
        j = np.clip(self.length - 1, 0, cum.shape[1] - 1)
        got = np.take_along_axis(cum, j, axis=1) * (self.length > 0)
        return (p_leaf * got).sum(axis=1)


def choose_grafts(
    profile: RetrievalProfile,
    keep: np.ndarray,
    pool: FlatPool,
    p: np.ndarray,
    slots: np.ndarray,
    graft_budget: int,
    rng: np.random.Generator,
) -> Grafts | None:
    """Retrieved continuations for the freed slots: each request draws a suffix-match length;
    chains hang from the kept leaves with the highest P(accepted), and each slot goes to the
    chain position with the largest expected gain P(leaf) * rho_1 * ... * rho_j, up to
    min(slots[b], graft_budget) slots (the verify budget never grows)."""
    if graft_budget <= 0 or not profile.enabled:
        return None
    b, t = keep.shape
    m = profile.draw_match_len(rng, b)
    g = int(graft_budget)
    rho = np.zeros((b, g))
    rows = profile.rho[np.clip(m - 1, 0, profile.rho.shape[0] - 1)]  # [B, J]
    j = min(g, rows.shape[1])
    rho[:, :j] = rows[:, :j]
    rho[m == 0] = 0.0
    # a kept node is a leaf when its first (most probable) candidate child is not kept: kept
    # children are always a prefix of a node's candidates
    row_t = (np.arange(b) * t)[:, None]
    has_child = (pool.count > 0) & keep.ravel().take(row_t + pool.start)
    leaf_p = np.where(keep & ~has_child, p, -1.0)
    nl = min(g, t)
    keys = leaf_p - TIE_BREAK * np.arange(t)  # distinct: exactly nl per row pass the threshold
    thr_leaf = np.partition(keys, t - nl, axis=1)[:, t - nl]
    leaves = (np.flatnonzero(keys >= thr_leaf[:, None]) % t).reshape(b, nl)
    lp_sel = leaf_p.ravel().take(row_t + leaves)  # [B, nl]; -1 where not a leaf
    gains = np.maximum(lp_sel, 0.0)[:, :, None] * np.cumprod(rho, axis=1)[:, None, :]
    gains = gains - TIE_BREAK * np.arange(nl * g).reshape(nl, g)  # earlier leaf / position first
    flat = gains.reshape(b, nl * g)
    allow = np.minimum(np.maximum(slots, 0), g)
    order = -np.sort(-flat, axis=1)
    thr = np.take_along_axis(order, np.maximum(allow - 1, 0)[:, None], axis=1)[:, 0]
    chosen = (flat >= thr[:, None]) & (flat > 0) & (allow[:, None] > 0)
    length = chosen.reshape(b, nl, g).sum(axis=2)
    return Grafts(leaf=leaves, length=length, rho=rho, match_len=m)


# ---- outcomes ----------------------------------------------------------------------------------
def expected_tokens(keep: np.ndarray, p: np.ndarray, grafts: Grafts | None) -> np.ndarray:
    """float64[B]: exact expected tokens per step of each request's tree (draft nodes + 1)."""
    e = (np.where(keep, p, 0.0)[:, 1:]).sum(axis=1) + 1.0
    if grafts is not None:
        e += grafts.expected_gain(np.take_along_axis(p, grafts.leaf, axis=1))
    return e


def sample_tokens(
    pool: FlatPool,
    keep: np.ndarray | RowThreshold,
    grafts: Grafts | None,
    rng: np.random.Generator,
) -> np.ndarray:
    """int64[B]: one sampled step per request: accepted draft tokens + 1 (bonus). `keep` is the
    kept mask, or a RowThreshold (the same choice, without building the mask)."""
    if pool._exps is not None:
        tokens, last = _walk_dynamic(pool, keep, rng)
        return _add_grafts(tokens, last, grafts, rng)
    b, t, w = pool.batch, pool.columns, pool.width
    acc_f, start_f, lp_f = pool.acc.ravel(), pool.start.ravel(), pool.lp.ravel()
    keep_f = keep.ravel() if isinstance(keep, np.ndarray) else None
    tokens = np.ones(b, dtype=np.int64)
    last = np.zeros(b, dtype=np.int64)  # deepest accepted column of each request
    live = np.arange(b)  # requests whose walk goes on
    cur = last
    span = np.arange(w)
    ties = TIE_BREAK * span
    for u in rng.random((len(pool.level_slices) - 1, b)):
        base = live * t
        start = start_f.take(base + cur)
        count = pool.children_count(live, cur)
        cols = np.minimum(start[:, None] + span, t - 1)
        idx = base[:, None] + cols
        a = acc_f.take(idx)
        if keep_f is not None:
            ok = keep_f.take(idx)
        else:
            assert isinstance(keep, RowThreshold)
            lpw = lp_f.take(idx)
            key = lpw - (TIE_BREAK * start)[:, None] - ties
            ok = (
                (key >= keep.key_min.take(live)[:, None])
                & (lpw >= keep.lp_min)
                & (lpw > REAL_FLOOR)
            )
        ok &= span < count[:, None]
        a = np.where(ok, a, 0.0)
        r = (u[: live.size, None] >= np.cumsum(a, axis=1)).sum(axis=1)
        hit = r < count
        live = live[hit]
        if live.size == 0:
            break
        cur = start[hit] + r[hit]
        tokens[live] += 1
        last[live] = cur
    return _add_grafts(tokens, last, grafts, rng)


def _add_grafts(
    tokens: np.ndarray, last: np.ndarray, grafts: Grafts | None, rng: np.random.Generator
) -> np.ndarray:
    """Walk on into the retrieved chain hanging from the last accepted node, if any."""
    if grafts is not None:
        on = grafts.leaf == last[:, None]  # [B, G]: did the walk stop at a grafted leaf?
        length = (grafts.length * on).sum(axis=1)
        j = np.arange(grafts.rho.shape[1])
        hits = (rng.random(grafts.rho.shape) < grafts.rho) & (j < length[:, None])
        tokens = tokens + np.cumprod(hits, axis=1).sum(axis=1)
    return tokens


def _walk_dynamic(
    pool: FlatPool, keep: np.ndarray | RowThreshold, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens, last accepted column) for a dynamic pool, whole batch in step (no compaction).
    At the current node the target picks candidate child j with acc[j] (all k candidates, kept
    or not) or none with the rest; the walk goes on only if the picked child is kept. So a kept
    child is taken with its acc and the walk stops with 1 - (sum of kept children's acc), as on
    the tree itself."""
    b, t, k = pool.batch, pool.columns, pool.width
    base = np.arange(b) * t
    if isinstance(keep, np.ndarray):
        kept_f = keep.ravel()

        def kept(col: np.ndarray) -> np.ndarray:
            return kept_f.take(base + col)
    else:
        keys_f = pool.lp.ravel()
        floor = np.maximum(np.maximum(keep.key_min, keep.lp_min), REAL_FLOOR)

        def kept(col: np.ndarray) -> np.ndarray:
            return keys_f.take(base + col) - TIE_BREAK * col >= floor

    start_f = pool.start.ravel()
    assert pool.level_acc is not None
    acc_f = pool.level_acc.ravel()  # [D, B, k parent slots, k children]
    span = np.arange(k)
    rows_kk = np.arange(b) * (k * k)
    cur = np.zeros(b, dtype=np.int64)
    alive = np.ones(b, dtype=bool)
    tokens = np.ones(b, dtype=np.int64)
    for lvl, u in enumerate(rng.random((len(pool.level_slices) - 1, b))):
        s = start_f.take(base + cur)  # first child column; 0 when cur was not expanded
        # children of the slot whose first child is column s: level_acc[lvl, row, slot, :],
        # slot * k = s - (first column of the level); unexpanded rows read junk, masked below
        offset = rows_kk + (lvl * b * k * k - pool.level_slices[lvl + 1].start)
        a = acc_f.take((s + offset)[:, None] + span, mode="clip")
        r = (u[:, None] >= np.cumsum(a, axis=1)).sum(axis=1)
        nxt = s + np.minimum(r, k - 1)
        alive &= (s > 0) & (r < k)
        alive &= kept(nxt)
        if not alive.any():
            break
        tokens += alive
        cur = np.where(alive, nxt, cur)
    return tokens, cur


def to_tree(pool: FlatPool, keep: np.ndarray, grafts: Grafts | None, row: int) -> DraftTree:
    """The DraftTree of request `row`: kept candidates in breadth-first order (children of a
    node contiguous, by rank), then grafted chains. Tokens are synthetic ids (the column)."""
    cols = np.flatnonzero(keep[row])
    # breadth-first order: by level, then by parent's new index, then by column (= rank)
    new = np.full(pool.columns, -1, dtype=np.int64)
    order: list[int] = []
    for sl in pool.level_slices:
        here = cols[(cols >= sl.start) & (cols < sl.stop)]
        if here.size == 0:
            break
        pk = new[pool.parent[row, here]] if sl.start > 0 else np.zeros(here.size, np.int64)
        here = here[np.lexsort((here, pk))]
        new[here] = np.arange(len(order), len(order) + here.size)
        order.extend(here.tolist())
    idx = np.asarray(order, dtype=np.int64)
    parents = np.where(idx == 0, -1, new[pool.parent[row, idx]])
    parents[0] = -1
    cond_lp = pool.lp[row, idx] - np.where(idx == 0, 0.0, pool.lp[row, pool.parent[row, idx]])
    logprobs = np.where(idx == 0, 0.0, np.minimum(cond_lp, 0.0))
    tokens = idx.copy()
    source = np.full(idx.size, SOURCE_MODEL, dtype=np.int8)
    source[0] = SOURCE_ROOT
    if grafts is not None:
        extra_par, extra_lp = [], []
        nxt = idx.size
        for leaf, length in zip(
            grafts.leaf[row].tolist(), grafts.length[row].tolist(), strict=True
        ):
            at = int(new[leaf])
            for jj in range(length):
                extra_par.append(at)
                extra_lp.append(float(np.log(grafts.rho[row, jj])))
                at = nxt
                nxt += 1
        if extra_par:
            k = len(extra_par)
            parents = np.r_[parents, extra_par]
            logprobs = np.r_[logprobs, extra_lp]
            tokens = np.r_[tokens, pool.columns + np.arange(k)]
            source = np.r_[source, np.full(k, SOURCE_RETRIEVAL, dtype=np.int8)]
    return DraftTree(parents, tokens, logprobs, source)
