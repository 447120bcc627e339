"""The acceptance-model interface: how likely each node of a draft tree is to be accepted.

The target emits exactly one token after each accepted node, so at most one child of an accepted
node is accepted: every model gives a conditional probability c[i] = P(i accepted | parent(i)
accepted) with the children of one node summing to <= 1, and P(i on the accepted path) is the
product of c along the root path. Expected tokens per step = sum over draft nodes of P + 1 (the
bonus token the target always adds).

Retrieval (grafted) nodes are handled here for every model: a retrieval node's draft log-prob
holds log rho, the retriever's match probability for that position and match length (the
builders write it; see planner.trees.graft), and it takes rho of the probability mass its
parent's model children and earlier retrieval siblings leave: c = rho * (1 - sum of those).

Builders also ask a model for draft candidates: `candidate_bank(level)` gives draft
probabilities (sorted, per rank) and their conditional acceptances for the children of one node
at `level`, as rows to draw from; `positional_table` gives the mean conditional acceptance per
(depth, rank) for the static (Sequoia) dynamic program.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np

from spectune.specs.tree import SOURCE_MODEL, SOURCE_RETRIEVAL, DraftTree
from spectune.specs.workload import Workload

#: log-prob given to a candidate of probability 0: far below any real path (64 levels of
#: probabilities >= 1e-30 stay above LOG_ZERO / 2), so builders never keep it.
LOG_ZERO = -1.0e4


@dataclass(frozen=True, eq=False)
class CandidateBank:
    """Draws of the drafter's top-K children of one node at one depth.

    conf:    float64[M, K]     draft probability of the rank-r child (rows sorted, decreasing)
    logconf: float64[M, K]     log of conf, floored at LOG_ZERO where conf is 0
    accept:  float64[M, K]     P(rank-r child accepted | parent accepted); rows sum to <= 1
    pair:    float64[M, 2, K]  logconf and accept stacked (one gather fetches both)
    """

    conf: np.ndarray
    logconf: np.ndarray
    accept: np.ndarray
    pair: np.ndarray

    @classmethod
    def from_arrays(cls, conf: np.ndarray, accept: np.ndarray) -> CandidateBank:
        conf = np.atleast_2d(np.asarray(conf, dtype=np.float64))
        accept = np.atleast_2d(np.asarray(accept, dtype=np.float64))
        with np.errstate(divide="ignore"):
            logconf = np.maximum(np.log(conf), LOG_ZERO)
        pair = np.stack([logconf, accept], axis=1)
        for a in (conf, logconf, accept, pair):
            a.setflags(write=False)
        return cls(conf, logconf, accept, pair)

    @property
    def rows(self) -> int:
        return int(self.conf.shape[0])

    @property
    def width(self) -> int:
        return int(self.conf.shape[1])


@dataclass(frozen=True)
class RetrievalProfile:
    """rho[m-1, j-1] = P(the j-th retrieved token matches | the previous did), for a suffix
    match of length m; match_probs[m-1] = P(a step finds a match of length m)."""

    rho: np.ndarray  # float64[M, J]
    match_probs: np.ndarray  # float64[M]

    @classmethod
    def from_workload(cls, wl: Workload | None) -> RetrievalProfile:
        if wl is None or not wl.retrieval_accept:
            return cls(np.zeros((1, 1)), np.zeros(1))
        width = max(len(r) for r in wl.retrieval_accept)
        rho = np.zeros((len(wl.retrieval_accept), width))
        for m, row in enumerate(wl.retrieval_accept):
            rho[m, : len(row)] = row
            rho[m, len(row) :] = 0.0
        probs = np.zeros(rho.shape[0])
        probs[: len(wl.retrieval_match_probs)] = wl.retrieval_match_probs
        return cls(rho, probs)

    @property
    def enabled(self) -> bool:
        return bool(self.match_probs.sum() > 0 and self.rho.max() > 0)

    def draw_match_len(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """int64[size]: match length per step, 0 = no match."""
        cum = np.cumsum(self.match_probs)  # P(match length <= m), m = 1..M
        u = rng.random(size)
        none = 1.0 - cum[-1]
        return np.where(u < none, 0, 1 + np.searchsorted(cum, u - none, side="right"))

    def chain(self, match_len: int, length: int) -> np.ndarray:
        """float64[length]: rho for the 1st..length-th token of a match of length `match_len`."""
        out = np.zeros(length)
        if match_len <= 0:
            return out
        row = self.rho[min(match_len, self.rho.shape[0]) - 1]
        n = min(length, row.size)
        out[:n] = row[:n]
        return out


class AcceptanceModel(ABC):
    """P(node on the accepted path) for draft trees, and draft candidates for the builders."""

    #: the workload this model was built from (None for hand-built models)
    workload: Workload | None = None

    def __init__(self, retrieval: RetrievalProfile | None = None) -> None:
        self.retrieval = (
            retrieval if retrieval is not None else RetrievalProfile.from_workload(None)
        )

    # ---- what each model defines ----------------------------------------------------------------
    @abstractmethod
    def model_conditional(self, tree: DraftTree) -> np.ndarray:
        """float64[N]: P(i accepted | parent accepted) for model-proposed nodes (other entries
        are ignored). Model children of one node must sum to <= 1."""

    @abstractmethod
    def candidate_bank(self, level: int, width: int) -> CandidateBank:
        """Draws of the top-`width` children (ranks 0..width-1, zero-padded) of one node whose
        children sit at depth `level` (>= 1)."""

    @abstractmethod
    def positional_table(self, depth: int, width: int) -> np.ndarray:
        """float64[depth, width]: mean P(rank-r child at depth d+1 accepted | parent accepted)."""

    @property
    def cache_key(self) -> tuple[object, ...]:
        """Hashable identity for caches (same key, same behaviour)."""
        return (type(self).__name__, id(self))

    # ---- derived ------------------------------------------------------------------------------
    def conditional(self, tree: DraftTree) -> np.ndarray:
        """float64[N]: P(i accepted | parent accepted) for every node; root 1."""
        c = np.asarray(self.model_conditional(tree), dtype=np.float64).copy()
        src, par = tree.source, tree.parents
        c[0] = 1.0
        model = src == SOURCE_MODEL
        c[~model] = 0.0
        c[0] = 1.0
        n = tree.num_nodes
        if n > 1:
            # guard against hand-made trees whose sibling sums pass 1
            sums = np.bincount(par[1:], weights=c[1:], minlength=n)
            over = sums > 1.0
            if over.any():
                scale = np.where(over, 1.0 / np.maximum(sums, 1e-300), 1.0)
                c[1:] *= scale[par[1:]]
                sums = np.minimum(sums, 1.0)
            retr = np.flatnonzero(src == SOURCE_RETRIEVAL)
            if retr.size:
                left = 1.0 - sums
                rho = np.exp(tree.logprobs[retr])
                for i, r in zip(retr.tolist(), rho.tolist(), strict=True):
                    p = int(par[i])
                    c[i] = r * max(left[p], 0.0)
                    left[p] -= c[i]
        return c

    def node_accept_prob(self, tree: DraftTree) -> np.ndarray:
        """float64[N]: P(node lies on the accepted path); root 1."""
        c = self.conditional(tree)
        return path_products(tree, c)

    def expected_tokens(self, tree: DraftTree) -> float:
        """Expected tokens per step: accepted draft tokens + 1 (the bonus token)."""
        return float(self.node_accept_prob(tree)[1:].sum() + 1.0)

    def sample_accepted(self, tree: DraftTree, rng: np.random.Generator) -> np.ndarray:
        """int32[k]: one sampled accepted path, node indices from the root down."""
        c = self.conditional(tree)
        first, nxt = tree.first_child, tree.next_sibling
        path = [0]
        node = 0
        while True:
            u = rng.random()
            child = int(first[node])
            acc = 0.0
            while child >= 0:
                acc += c[child]
                if u < acc:
                    break
                child = int(nxt[child])
            if child < 0:
                return np.asarray(path, dtype=np.int32)
            path.append(child)
            node = child

    def sample_tokens(self, tree: DraftTree, rng: np.random.Generator, n: int) -> np.ndarray:
        """int64[n]: tokens per step (accepted + 1) of `n` independent steps on one tree,
        vectorised (for Monte Carlo checks of expected_tokens)."""
        c = self.conditional(tree)
        kids = children_table(tree)  # [N, W]
        cc = np.where(kids >= 0, c[np.maximum(kids, 0)], 0.0).cumsum(axis=1)
        cur = np.zeros(n, dtype=np.int64)
        alive = np.ones(n, dtype=bool)
        tokens = np.ones(n, dtype=np.int64)
        for _ in range(tree.max_depth):
            u = rng.random(n)
            rank = (u[:, None] >= cc[cur]).sum(axis=1)
            ok = alive & (rank < kids.shape[1])
            nxt = np.where(ok, kids[cur, np.minimum(rank, kids.shape[1] - 1)], -1)
            ok &= nxt >= 0
            tokens += ok
            alive = ok
            cur = np.where(ok, nxt, 0)
            if not alive.any():
                break
        return tokens


def path_products(tree: DraftTree, c: np.ndarray) -> np.ndarray:
    """float64[N]: product of c along the root path of each node (c[0] taken as 1)."""
    out = np.asarray(c, dtype=np.float64).copy()
    out[0] = 1.0
    depth = tree.depth
    par = tree.parents
    for d in range(1, int(depth.max()) + 1 if depth.size else 1):
        idx = np.flatnonzero(depth == d)
        out[idx] *= out[par[idx]]
    return out


def children_table(tree: DraftTree) -> np.ndarray:
    """int32[N, W]: children of each node in index order, padded with -1 (W = max children)."""
    n = tree.num_nodes
    w = max(int(tree.num_children.max()) if n else 0, 1)
    out = np.full((n, w), -1, dtype=np.int32)
    if n > 1:
        kids = np.arange(1, n)
        rank = tree.sibling_rank[1:]
        out[tree.parents[1:], rank] = kids
    return out


def model_sibling_rank(tree: DraftTree) -> np.ndarray:
    """int32[N]: rank of each model node among its parent's model children (index order)."""
    n = tree.num_nodes
    rank = np.zeros(n, dtype=np.int32)
    model = np.flatnonzero(tree.source == SOURCE_MODEL)
    if model.size:
        par = tree.parents[model]
        order = np.argsort(par, kind="stable")
        sp = par[order]
        starts = np.r_[0, np.flatnonzero(sp[1:] != sp[:-1]) + 1]
        first = np.repeat(starts, np.diff(np.r_[starts, sp.size]))
        rank[model[order]] = np.arange(sp.size) - first
    return rank
