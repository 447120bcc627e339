"""Sequoia's dynamic program: the tree shape with the largest expected tokens for a positional
acceptance profile, within a node budget, a depth limit and a width limit.

f[l][n] = best expected tokens of a subtree of at most n nodes whose root sits at depth l and is
itself accepted (it counts 1). Its children are ranks 0, 1, ... (a prefix: a tree cannot hold a
rank-2 child without a rank-1 one); the rank-r child is accepted with q[l+1][r], so

    f[l][n] = 1 + h_0[n - 1],   h_r[m] = max(0, max_{1<=k<=m} q[l+1][r] * f[l+1][k] + h_{r+1}[m-k])

with h_W = 0 and f[D][n] = 1. Each (l, r) step is one [n, k] max over a (budget x budget)
matrix, so a budget of 256, depth 16 and width 16 costs 256 matrix maxima of 256 x 256 entries.
The root's f[0][budget] is the expected tokens of the best tree (root counts as the bonus token).
`static_shape` caches the shape per acceptance model; the synthetic builders (trees.build), the
trace-replay builder (trees.pool) and the executor's static drafter all take it from there.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from spectune.planner.acceptance.base import AcceptanceModel
from spectune.specs.errors import SpecError
from spectune.specs.policy import MAX_BUDGET, TreePolicy

MAX_STATIC_WIDTH = 16


@dataclass(frozen=True, eq=False)
class StaticShape:
    """The optimal tree for one (table, budget, depth, width): parents in breadth-first order
    (children of a node contiguous, by rank), each node's rank and depth, and its value."""

    parents: np.ndarray  # int32[N]
    rank: np.ndarray  # int32[N]
    depth: np.ndarray  # int32[N]
    expected_tokens: float
    best_by_budget: np.ndarray  # float64[budget + 1]: f[0][n], n = 0..budget (0 -> 0)

    @property
    def draft_widths(self) -> tuple[int, ...]:
        """Nodes drafted at each drafting step after the first: step l (l >= 1) runs the
        drafter over the W_l nodes of depth l that have children (the first step drafts the
        root's children from the target's hidden state), up to the first level without any;
        the executor's StaticPlan drafts exactly these."""
        n = self.parents.size
        has_kids = np.bincount(self.parents[1:], minlength=n)[:n] > 0
        widths: list[int] = []
        for lvl in range(1, int(self.depth.max(initial=0)) + 1):
            w = int(np.count_nonzero((self.depth == lvl) & has_kids))
            if w == 0:
                break
            widths.append(w)
        return tuple(widths)


def sequoia_dp(table: np.ndarray, budget: int, depth: int, width: int) -> StaticShape:
    """Best tree of <= budget nodes (root included), <= depth levels below the root and <= width
    children per node, for conditional acceptances table[d-1][r] (float64[>=depth, >=width])."""
    if budget < 1 or depth < 0 or width < 1:
        raise SpecError("sequoia_dp needs budget >= 1, depth >= 0, width >= 1")
    q = np.zeros((depth, width))
    t = np.asarray(table, dtype=np.float64)
    dd, ww = min(depth, t.shape[0]), min(width, t.shape[1])
    q[:dd, :ww] = t[:dd, :ww]
    b = budget
    neg = -np.inf
    # f[l][n], n = 0..b; n = 0 means "no node" (value 0 for children, never chosen for a root)
    f = np.ones((depth + 1, b + 1))
    f[:, 0] = 0.0
    m_idx = np.arange(b)[:, None]  # remaining nodes m = 0..b-1
    k_idx = np.arange(1, b)[None, :]  # nodes given to this rank, k = 1..b-1
    valid = k_idx <= m_idx
    rest = np.where(valid, m_idx - k_idx, 0)
    # arg[l][r][m]: nodes given to rank r at a depth-l parent with m nodes left (0: stop)
    arg = np.zeros((depth, width, b), dtype=np.int16)
    for lvl in range(depth - 1, -1, -1):
        child = f[lvl + 1, 1:b]  # f at depth l+1 for k = 1..b-1
        h = np.zeros(b)
        for r in range(width - 1, -1, -1):
            if q[lvl, r] <= 0.0:
                h = np.zeros(b)  # a zero-probability rank ends the prefix
                continue
            cand = np.where(valid, q[lvl, r] * child[None, :] + h[rest], neg)  # [m, k]
            best_k = cand.argmax(axis=1)
            best = cand[np.arange(b), best_k]
            take = best > 0.0
            arg[lvl, r] = np.where(take, best_k + 1, 0)
            h = np.where(take, best, 0.0)
        f[lvl, 1:] = 1.0 + h[:b]
    # rebuild breadth-first: a queue of (node, depth, nodes allowed)
    parents, ranks, depths = [-1], [0], [0]
    queue = [(0, 0, budget)]
    head = 0
    while head < len(queue):
        node, lvl, n = queue[head]
        head += 1
        if lvl >= depth:
            continue
        m = n - 1
        for r in range(width):
            k = int(arg[lvl, r, m]) if m > 0 else 0
            if k == 0:
                break
            parents.append(node)
            ranks.append(r)
            depths.append(lvl + 1)
            queue.append((len(parents) - 1, lvl + 1, k))
            m -= k
    shape = StaticShape(
        parents=np.asarray(parents, dtype=np.int32),
        rank=np.asarray(ranks, dtype=np.int32),
        depth=np.asarray(depths, dtype=np.int32),
        expected_tokens=float(f[0, budget]),
        best_by_budget=np.r_[0.0, f[0, 1:]],
    )
    return shape


def static_size(budget: int, shared: bool) -> int:
    """Nodes of the static shape a policy of this `budget` drafts: the budget, or 2 x budget
    (at most MAX_BUDGET) when the batch shares one verify budget (ECHO above batch 1), whose
    selection then keeps budget - 1 nodes per request on average from the larger shape."""
    return min(2 * budget, MAX_BUDGET) if shared else budget


def draft_widths(
    policy: TreePolicy, model: AcceptanceModel, batch: int = 1
) -> tuple[int, ...] | None:
    """Tokens per sequence of each drafting step after the first for `policy`'s trees at
    `batch` under `model`: a static policy's shape's drafted nodes per level
    (StaticShape.draft_widths); None for the other builders, whose later steps each run over
    the top-k frontier (CostModel.draft_parts' default)."""
    if policy.builder != "static":
        return None
    size = static_size(policy.budget, policy.shared_budget and batch > 1)
    return static_shape(model, size, policy.depth, policy.topk).draft_widths


_SHAPES: OrderedDict[tuple[object, ...], StaticShape] = OrderedDict()
_CACHE_SIZE = 4096


def static_shape(model: AcceptanceModel, budget: int, depth: int, width: int) -> StaticShape:
    """Sequoia-optimal shape for the model's mean positional table (cached per model, the
    least recently added of _CACHE_SIZE shapes dropped first)."""
    width = max(1, min(width, MAX_STATIC_WIDTH))
    key = (model.cache_key, budget, depth, width)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = sequoia_dp(model.positional_table(depth, width), budget, depth, width)
        _SHAPES[key] = shape
        if len(_SHAPES) > _CACHE_SIZE:
            _SHAPES.popitem(last=False)
    return shape
