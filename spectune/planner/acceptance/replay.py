"""Trace replay: acceptance from recorded steps (spectune.trace/v1), exact per step.

`ReplayStep` is one recorded step: any tree built from its candidate pool (a sub-tree that keeps
parents, or any tree whose token paths appear in the pool) is scored exactly: a node is accepted
iff its token is the target's next token after its parent's path, so probabilities are 0 or 1
and the accepted path is the replayed walk.

`TraceReplay` is the whole trace as an acceptance model for trees that come from no particular
step: an empirical positional table (how often the rank-r model child of a node at depth d-1
was the target's token) and an empirical candidate bank (the recorded draft probabilities of
each expanded node's children, with 0/1 acceptance from the target's token). `draw_step(rng)`
gives a ReplayStep for exact replay; builders given a ReplayStep select from its pool.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from spectune.planner.acceptance.base import (
    AcceptanceModel,
    CandidateBank,
    RetrievalProfile,
    model_sibling_rank,
)
from spectune.specs.errors import SpecError
from spectune.specs.trace import TraceStep
from spectune.specs.tree import SOURCE_MODEL, DraftTree


def map_to_pool(tree: DraftTree, pool: DraftTree) -> np.ndarray:
    """int64[N]: the pool node with the same token path as each tree node (-1: not in the pool)."""
    index: dict[tuple[int, int], int] = {}
    pp, pt = pool.parents.tolist(), pool.tokens.tolist()
    for i in range(1, pool.num_nodes):
        index.setdefault((pp[i], pt[i]), i)
    out = np.full(tree.num_nodes, -1, dtype=np.int64)
    out[0] = 0
    tp, tt = tree.parents.tolist(), tree.tokens.tolist()
    for i in range(1, tree.num_nodes):
        par = int(out[tp[i]])
        if par >= 0:
            out[i] = index.get((par, tt[i]), -1)
    return out


class ReplayStep(AcceptanceModel):
    """Exact acceptance for trees drawn from one recorded step's pool."""

    def __init__(self, step: TraceStep, parent: TraceReplay | None = None) -> None:
        super().__init__(parent.retrieval if parent is not None else None)
        self.step = step
        self.parent = parent
        self.workload = None

    @property
    def cache_key(self) -> tuple[object, ...]:
        return ("replay-step", self.step.request, self.step.step, id(self.step))

    def conditional(self, tree: DraftTree) -> np.ndarray:
        """1.0 where the node's token is the target's next token after its parent, else 0."""
        where = map_to_pool(tree, self.step.pool)
        tgt = np.where(where >= 0, self.step.target[np.maximum(where, 0)], -1)
        c = np.zeros(tree.num_nodes)
        c[0] = 1.0
        if tree.num_nodes > 1:
            par = tree.parents[1:]
            c[1:] = ((where[par] >= 0) & (tree.tokens[1:] == tgt[par])).astype(np.float64)
        return c

    def model_conditional(self, tree: DraftTree) -> np.ndarray:
        return self.conditional(tree)

    def candidate_bank(self, level: int, width: int) -> CandidateBank:
        if self.parent is None:
            raise SpecError("a ReplayStep without its trace has no candidate bank")
        return self.parent.candidate_bank(level, width)

    def positional_table(self, depth: int, width: int) -> np.ndarray:
        if self.parent is None:
            raise SpecError("a ReplayStep without its trace has no positional table")
        return self.parent.positional_table(depth, width)


class TraceReplay(AcceptanceModel):
    """A recorded trace as an acceptance model (empirical tables), plus exact per-step replay."""

    def __init__(self, steps: Sequence[TraceStep], max_width: int = 64) -> None:
        super().__init__(RetrievalProfile.from_workload(None))
        if not steps:
            raise SpecError("a trace replay needs at least one recorded step")
        self.steps = list(steps)
        self.workload = None
        rows: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}
        for st in self.steps:
            pool = st.pool
            rank = model_sibling_rank(pool)
            model = pool.source == SOURCE_MODEL
            conf = np.exp(pool.logprobs)
            for node in np.flatnonzero(pool.num_children > 0).tolist():
                kids = np.flatnonzero((pool.parents == node) & model)
                if kids.size == 0:
                    continue
                order = kids[np.argsort(-conf[kids], kind="stable")][:max_width]
                hit = (pool.tokens[order] == st.target[node]).astype(np.float64)
                level = int(pool.depth[node]) + 1
                rows.setdefault(level, []).append((conf[order], hit))
            del rank
        if not rows:
            raise SpecError("the trace records no model children: nothing to replay")
        self._rows = rows
        self.max_level = max(rows)
        self.max_width = max(len(c) for r in rows.values() for c, _ in r)
        self._banks: dict[tuple[int, int], CandidateBank] = {}

    @property
    def cache_key(self) -> tuple[object, ...]:
        return ("trace", id(self))

    def draw_step(self, rng: np.random.Generator) -> ReplayStep:
        """A recorded step, uniformly at random, as an exact acceptance model."""
        return ReplayStep(self.steps[int(rng.integers(len(self.steps)))], self)

    def candidate_bank(self, level: int, width: int) -> CandidateBank:
        key = (level, width)
        bank = self._banks.get(key)
        if bank is None:
            recs = self._rows[min(level, self.max_level)]
            conf = np.zeros((len(recs), width))
            hit = np.zeros((len(recs), width))
            for i, (c, h) in enumerate(recs):
                n = min(width, c.size)
                conf[i, :n] = c[:n]
                hit[i, :n] = h[:n]
            if level > self.max_level:  # nothing recorded this deep: propose nothing
                conf[:] = 0.0
                hit[:] = 0.0
            bank = CandidateBank.from_arrays(conf, hit)
            self._banks[key] = bank
        return bank

    def positional_table(self, depth: int, width: int) -> np.ndarray:
        return np.stack(
            [self.candidate_bank(d, width).accept.mean(axis=0) for d in range(1, depth + 1)]
        )

    def model_conditional(self, tree: DraftTree) -> np.ndarray:
        """Trees from no particular step are scored with the empirical positional table."""
        rank = model_sibling_rank(tree)
        depth = int(tree.max_depth) if tree.num_nodes > 1 else 1
        width = int(rank.max()) + 1
        t = self.positional_table(depth, width)
        out = np.zeros(tree.num_nodes)
        d = tree.depth
        nz = d > 0
        out[nz] = t[d[nz] - 1, rank[nz]]
        return out
