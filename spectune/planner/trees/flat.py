"""Candidate pools for a whole batch as flat numpy arrays, and everything done on them.

Both builders first draw a candidate pool per request, then choose which candidates become tree
nodes. Doing that for the whole batch at once, over [batch, nodes] arrays, is what lets the
simulator run one iteration of batch 64 in well under a millisecond; build_tree is the same code
with batch 1, turned into a DraftTree at the end, so the per-tree and batched paths share every
rule.

Layout: column 0 is the root, then the candidates level by level. For request b and column i:
    lp[b, i]     path draft log-probability (root 0)
    acc[b, i]    P(i accepted | parent accepted)
    parent[b, i] parent column (-1 for the root)
    start[b, i], count[b, i]  the contiguous columns of i's candidate children (rank order)
Candidates of one parent are contiguous and in rank order, so the kept children of a node are
always a prefix of its candidates (their path log-prob falls with rank).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from spectune.planner.acceptance.base import LOG_ZERO, AcceptanceModel, RetrievalProfile
from spectune.planner.trees.static import StaticShape
from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL, SOURCE_ROOT, DraftTree

_TIE = 1e-11  # tie-break: at equal score, the earlier column (a parent before its child) wins
_REAL = LOG_ZERO / 2  # path log-probs below this go through a probability-0 candidate


class FlatPool:
    """Candidate pools of a batch (see the module docstring for the layout).

    `count` may be given as None when every node with children has exactly `width` of them
    (dynamic pools: count = width where start > 0); `parent` may be given as `exps`, the flat
    indices (into [B, T], row-major) of each level's expanded nodes, and is then built on use.
    """

    def __init__(
        self,
        lp: np.ndarray,
        acc: np.ndarray | None,
        start: np.ndarray,
        level: np.ndarray,
        level_slices: list[slice],
        width: int,
        *,
        parent: np.ndarray | None = None,
        count: np.ndarray | None = None,
        exps: list[np.ndarray] | None = None,
        level_acc: np.ndarray | None = None,
    ) -> None:
        self.lp = lp  # float64[B, T]
        self._acc = acc  # float64[B, T], or None: built from level_acc on first use
        self.level_acc = level_acc  # dynamic pools: float64[D, B, k, k] acc by (level, parent slot)
        self.start = start  # int64[B, T]
        self.level = level  # int64[T]
        self.level_slices = level_slices  # columns of each level, level 0 = the root column
        self.width = width  # most children a node can have
        self._parent = parent
        self._count = count
        self._exps = exps

    @property
    def parent(self) -> np.ndarray:
        """int64[B, T]: parent column of each candidate (-1 for the root)."""
        if self._parent is None:
            assert self._exps is not None
            b, k = self.batch, self.width
            par = np.empty((b, self.columns), dtype=np.int64)
            par[:, 0] = -1
            par[:, 1 : 1 + k] = 0
            rows_t = np.arange(b)[:, None] * self.columns
            for sl, at in zip(self.level_slices[2:], self._exps, strict=True):
                par[:, sl] = np.repeat(at.reshape(b, k) - rows_t, k, axis=1)
            self._parent = par
        return self._parent

    @property
    def acc(self) -> np.ndarray:
        """float64[B, T]: P(candidate accepted | parent accepted); root 1."""
        if self._acc is None:
            la = self.level_acc
            assert la is not None
            b, k = self.batch, self.width
            acc = np.empty((b, self.columns))
            acc[:, 0] = 1.0
            acc[:, 1 : 1 + k] = la[0, :, 0]  # float32 bank values, widened
            if la.shape[0] > 1:
                acc[:, 1 + k :] = la[1:].transpose(1, 0, 2, 3).reshape(b, -1)
            self._acc = acc
        return self._acc

    @property
    def count(self) -> np.ndarray:
        """int64[B, T]: candidate children of each column."""
        if self._count is None:
            self._count = np.where(self.start > 0, self.width, 0)
        return self._count

    def children_count(self, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
        """int64[n]: count[rows, cols] without building the whole count array."""
        if self._count is None:
            return np.where(self.start[rows, cols] > 0, self.width, 0)
        return self._count[rows, cols]

    @property
    def batch(self) -> int:
        return int(self.lp.shape[0])

    @property
    def columns(self) -> int:
        return int(self.lp.shape[1])

    def accept_prob(self) -> np.ndarray:
        """float64[B, T]: P(candidate on the accepted path) if every candidate were kept."""
        if self._exps is not None and self.level_acc is not None:
            return self._dynamic_accept_prob()
        p = self.acc.copy()
        p[:, 0] = 1.0
        rows = np.arange(self.batch)[:, None]
        for sl in self.level_slices[1:]:
            p[:, sl] *= p[rows, self.parent[:, sl]]
        return p

    def _dynamic_accept_prob(self) -> np.ndarray:
        """accept_prob for dynamic pools, level by level from the expanded slots."""
        b, k, t = self.batch, self.width, self.columns
        la = self.level_acc
        assert la is not None and self._exps is not None
        p = np.empty((b, t))
        p[:, 0] = 1.0
        p[:, 1 : 1 + k] = la[0, :, 0]
        p_flat = p.ravel()
        for lvl, at in enumerate(self._exps, start=2):
            here = self.level_slices[lvl]
            parent_p = p_flat.take(at).reshape(b, k, 1)  # P of the expanded slots
            np.multiply(parent_p, la[lvl - 1], out=p[:, here].reshape(b, k, k))
        return p


def _sort_keys(score: np.ndarray) -> np.ndarray:
    """Distinct sort keys: earlier columns win ties (scores are finite, >= LOG_ZERO * depth)."""
    return score - _TIE * np.arange(score.shape[-1])


# ---- drawing candidate pools -------------------------------------------------------------------
def _buffers(
    key: tuple[object, ...], shapes: Mapping[str, tuple[tuple[int, ...], type]]
) -> dict[str, np.ndarray]:
    """Reusable scratch arrays (a batch step allocates ~1 MB; fresh pages cost more than the
    arithmetic). Only for pools that never leave the call that drew them."""
    bufs = _WORK.get(key)
    if bufs is None:
        if len(_WORK) > 64:
            _WORK.clear()
        bufs = {name: np.empty(shape, dtype=dt) for name, (shape, dt) in shapes.items()}
        _WORK[key] = bufs
    return bufs


_WORK: dict[tuple[object, ...], dict[str, np.ndarray]] = {}


def dynamic_pool(
    model: AcceptanceModel,
    depth: int,
    topk: int,
    rng: np.random.Generator,
    batch: int,
    reuse: bool = False,
) -> FlatPool:
    """EAGLE-2 expansion: the root's top-k children, then at each further depth the top-k
    candidates of the previous depth (by path draft log-prob) each get their top-k children.
    With `reuse`, the pool lives in scratch buffers that the next call overwrites."""
    b, k = batch, topk
    sizes = [1, k] + [k * k] * (depth - 1)
    bounds = np.cumsum([0, *sizes])
    t = int(bounds[-1])
    shapes = {
        "lp": ((b, t), np.float64),
        "start": ((b, t), np.int64),
        "lc": ((depth, b, k, k), np.float32),
        "acc": ((depth, b, k, k), np.float32),
    }
    bufs = _buffers(("dyn", b, depth, k), shapes) if reuse else None
    if bufs is None:
        lp = np.empty((b, t))
        start = np.zeros((b, t), dtype=np.int64)
    else:
        lp, start = bufs["lp"], bufs["start"]
        start.fill(0)
    lp[:, 0], start[:, 0] = 0.0, 1
    lp_flat, start_flat = lp.ravel(), start.ravel()
    # every level's candidates at once: a bank row per (level, request, parent slot)
    logconf, accept, rows_per_level = _stacked_banks(model, depth, k)
    u = rng.random((depth, b, k))
    pick = (u * rows_per_level[:, None, None]).astype(np.int64)
    pick += (np.arange(depth) * logconf.shape[1])[:, None, None]
    pick[0, :, 1:] = pick[0, :, :1]  # the root is one node: one row
    if bufs is None:
        got_lc = logconf.reshape(-1, k).take(pick, axis=0)  # [D, B, k, k]
        got_acc = accept.reshape(-1, k).take(pick, axis=0)  # [D, B, k, k]
    else:
        got_lc = logconf.reshape(-1, k).take(pick, axis=0, out=bufs["lc"])
        got_acc = accept.reshape(-1, k).take(pick, axis=0, out=bufs["acc"])
    lp[:, 1 : 1 + k] = got_lc[0, :, 0]
    ties = _TIE * np.arange(k * k)
    consts = _level_constants(b, depth, k)
    ats = []  # flat index (into [B, T]) of each level's expanded nodes, [B * k]
    for lvl in range(2, depth + 1):
        p0, p1, c0, c1 = bounds[lvl - 1], bounds[lvl], bounds[lvl], bounds[lvl + 1]
        c = p1 - p0
        shift, first_child = consts[lvl - 2]
        if c > k:  # top-k of the previous level, in column (= rank) order
            keys = lp[:, p0:p1] - ties[:c]
            thr = np.partition(keys, c - k, axis=1)[:, c - k]
            at = np.flatnonzero(keys >= thr[:, None]) + shift  # row*c + col -> row*t + p0 + col
        else:
            at = shift
        ats.append(at)
        np.add(
            lp_flat.take(at).reshape(b, k, 1), got_lc[lvl - 1], out=lp[:, c0:c1].reshape(b, k, k)
        )
        start_flat[at] = first_child
    return FlatPool(
        lp,
        None,
        start,
        level=np.repeat(np.arange(len(sizes)), sizes),
        level_slices=[slice(int(bounds[i]), int(bounds[i + 1])) for i in range(len(sizes))],
        width=k,
        exps=ats,
        level_acc=got_acc,
    )


_CONSTS: dict[tuple[int, int, int], list[tuple[np.ndarray, np.ndarray]]] = {}


def _level_constants(b: int, depth: int, k: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per expansion level (2..depth): (shift int64[B*k], first_child int64[B*k]). For level 2
    (parents = the k root children) `shift` is the expanded nodes' flat index itself; above,
    adding it to a flat index row*c + col into the level's [B, c] keys gives row*T + p0 + col.
    first_child: the column of each expanded slot's first child, c0 + slot*k."""
    key = (b, depth, k)
    hit = _CONSTS.get(key)
    if hit is None:
        sizes = [1, k] + [k * k] * (depth - 1)
        bounds = np.cumsum([0, *sizes])
        t = int(bounds[-1])
        rows = np.repeat(np.arange(b, dtype=np.int64), k)
        hit = []
        for lvl in range(2, depth + 1):
            p0, p1, c0 = int(bounds[lvl - 1]), int(bounds[lvl]), int(bounds[lvl])
            c = p1 - p0
            # level 2 expands all k root children; above, keys are [B, c] with c = k * k
            full = rows * t + p0 + np.tile(np.arange(k), b)
            shift = rows * (t - c) + p0 if c > k else full
            first_child = np.tile(c0 + np.arange(k) * k, b)
            hit.append((shift, first_child))
        if len(_CONSTS) > 256:
            _CONSTS.clear()
        _CONSTS[key] = hit
    return hit


_STACKS: dict[tuple[object, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _stacked_banks(
    model: AcceptanceModel, depth: int, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(logconf float32[D, M, k], accept float32[D, M, k], rows int64[D]): every level's bank,
    zero-padded to the largest M, cached per model."""
    key = (model.cache_key, depth, k)
    hit = _STACKS.get(key)
    if hit is None:
        banks = [model.candidate_bank(lvl, k) for lvl in range(1, depth + 1)]
        rows = np.array([bk.rows for bk in banks], dtype=np.int64)
        # float32 halves the bytes a batch gathers; sums are taken in float64
        logconf = np.full((depth, int(rows.max()), k), LOG_ZERO, dtype=np.float32)
        accept = np.zeros((depth, int(rows.max()), k), dtype=np.float32)
        for d, bk in enumerate(banks):
            logconf[d, : bk.rows] = bk.logconf
            accept[d, : bk.rows] = bk.accept
        if len(_STACKS) > 256:
            _STACKS.clear()
        hit = (logconf, accept, rows)
        _STACKS[key] = hit
    return hit


def static_pool(
    model: AcceptanceModel, shape: StaticShape, rng: np.random.Generator, batch: int
) -> FlatPool:
    """A fixed (Sequoia) shape with each node's children drawn from the model's candidate bank
    (deterministic for positional models)."""
    b = batch
    n = shape.parents.size
    par = shape.parents.astype(np.int64)
    depth = shape.depth.astype(np.int64)
    width = int(shape.rank.max()) + 1 if n > 1 else 1
    lp = np.zeros((b, n))
    acc = np.ones((b, n))
    levels = int(depth.max()) if n > 1 else 0
    slices = [slice(0, 1)]
    for lvl in range(1, levels + 1):
        idx = np.flatnonzero(depth == lvl)  # breadth-first: one contiguous run per level
        slices.append(slice(int(idx[0]), int(idx[-1]) + 1))
        bank = model.candidate_bank(lvl, width)
        parents_here, which = np.unique(par[idx], return_inverse=True)
        rows = rng.integers(bank.rows, size=(b, parents_here.size))
        r = rows[:, which]  # [B, n_level]: the row of each node's parent
        lp[:, idx] = lp[:, par[idx]] + bank.logconf[r, shape.rank[idx]]
        acc[:, idx] = bank.accept[r, shape.rank[idx]]
    nkids = np.bincount(par[1:], minlength=n) if n > 1 else np.zeros(1, np.int64)
    first = np.zeros(n, dtype=np.int64)
    if n > 1:
        kids = np.arange(1, n)
        first[par[kids][::-1]] = kids[::-1]
    return FlatPool(
        lp,
        acc,
        np.broadcast_to(first, (b, n)),
        level=depth,
        level_slices=slices,
        width=width,
        parent=np.broadcast_to(par, (b, n)),
        count=np.broadcast_to(nkids, (b, n)),
    )


# ---- choosing nodes ----------------------------------------------------------------------------
def keep_top(score: np.ndarray, per_row: int | None, total: int | None) -> np.ndarray:
    """bool[B, T]: column 0 always, plus the best-scoring other columns: `per_row` per request
    (equal split) or `total` over the whole batch (super-tree). Scores must not rise from parent
    to child; ties go to the earlier column, so the chosen set keeps parents."""
    b, t = score.shape
    finite = score[:, 1:] > _REAL
    keyed = _sort_keys(score)[:, 1:]
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
        floor = np.maximum(np.maximum(self.key_min, self.lp_min), _REAL)
        kept = _sort_keys(pool.lp) >= floor[:, None]
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
    keys = _buffers(("keys", b, t), {"keys": ((b, t - 1), np.float64)})["keys"]
    np.subtract(pool.lp[:, 1:], _TIE * np.arange(1, t), out=keys)
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
    keys = leaf_p - _TIE * np.arange(t)  # distinct: exactly nl per row pass the threshold
    thr_leaf = np.partition(keys, t - nl, axis=1)[:, t - nl]
    leaves = (np.flatnonzero(keys >= thr_leaf[:, None]) % t).reshape(b, nl)
    lp_sel = leaf_p.ravel().take(row_t + leaves)  # [B, nl]; -1 where not a leaf
    gains = np.maximum(lp_sel, 0.0)[:, :, None] * np.cumprod(rho, axis=1)[:, None, :]
    gains = gains - _TIE * np.arange(nl * g).reshape(nl, g)  # earlier leaf / position first
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
    ties = _TIE * span
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
            key = lpw - (_TIE * start)[:, None] - ties
            ok = (key >= keep.key_min.take(live)[:, None]) & (lpw >= keep.lp_min) & (lpw > _REAL)
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
        floor = np.maximum(np.maximum(keep.key_min, keep.lp_min), _REAL)

        def kept(col: np.ndarray) -> np.ndarray:
            return keys_f.take(base + col) - _TIE * col >= floor

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
