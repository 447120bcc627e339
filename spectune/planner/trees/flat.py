"""Candidate pools for a whole batch as flat numpy arrays (choosing nodes from them and the
outcomes of a step live in trees.outcome).

Both builders first draw a candidate pool per request, then choose which candidates become tree
nodes. Doing that for the whole batch at once, over [batch, nodes] arrays, is what lets the
simulator sample one iteration of batch 64 (EAGLE-2 depth 7, top-k 10, 60 nodes) in ~0.8 ms of
one core (benchmarks/bench_trees.py); build_tree is the same code with batch 1, turned into a
DraftTree at the end, so the per-tree and batched paths share every rule.

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

import numpy as np

from spectune.planner.acceptance.base import LOG_ZERO, AcceptanceModel
from spectune.planner.trees.static import StaticShape

#: tie-break: at equal score the earlier column (a parent before its child) wins
TIE_BREAK = 1e-11
LOG_FLOOR = -1e4
"""Path log-probabilities below this rank as equal (e**-1e4 is 0 in float64); keeps the
tie-break exact where a whole level has probability 0."""
REAL_FLOOR = LOG_ZERO / 2  # path log-probs below this go through a probability-0 candidate


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


def sort_keys(score: np.ndarray) -> np.ndarray:
    """Distinct sort keys: earlier columns win ties (scores are finite, >= LOG_ZERO * depth)."""
    return score - TIE_BREAK * np.arange(score.shape[-1])


# ---- drawing candidate pools -------------------------------------------------------------------
def scratch(
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
    bufs = scratch(("dyn", b, depth, k), shapes) if reuse else None
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
    ties = TIE_BREAK * np.arange(k * k)
    consts = _level_constants(b, depth, k)
    ats = []  # flat index (into [B, T]) of each level's expanded nodes, [B * k]
    for lvl in range(2, depth + 1):
        p0, p1, c0, c1 = bounds[lvl - 1], bounds[lvl], bounds[lvl], bounds[lvl + 1]
        c = p1 - p0
        shift, first_child = consts[lvl - 2]
        if c > k:  # top-k of the previous level, in column (= rank) order
            # floored: a level of impossible (-inf) paths still ranks by the tie-break
            keys = np.maximum(lp[:, p0:p1], LOG_FLOOR) - ties[:c]
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
