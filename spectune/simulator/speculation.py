"""Per-iteration speculation: which policy applies to the live batch, how many tokens each
sequence's tree puts in the verify batch, and how many of its draft tokens the target accepts.

Trees come from the planner's builders and acceptance model (the same ones the planner scores
with). Building a fresh tree per sequence per step in Python would cost milliseconds per
iteration, so each policy gets a pool of trees built once (a dynamic builder's trees differ with
the sampled draft confidences, so the pool holds `pool_size` independent draws; a static shape
is one tree). From each tree's node acceptance probabilities we keep the distribution of its
accepted length: the nodes at one depth are mutually exclusive ways of reaching that depth, so
P(accepted >= d) = sum of P(node on accepted path) over nodes at depth d. A step then draws, for
all B sequences at once, a tree index and a uniform number and inverts that distribution:
O(B x depth) numpy work and no Python loop over sequences.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from spectune.specs import DraftTree, PolicyTable, SpecError, TreePolicy


class AcceptanceModelLike(Protocol):
    def node_accept_prob(self, tree: DraftTree) -> np.ndarray: ...


TreeBuilder = Callable[[TreePolicy, Any, np.random.Generator], DraftTree]
BatchTreeBuilder = Callable[[TreePolicy, Any, np.random.Generator, int], list[DraftTree]]

PolicySource = PolicyTable | TreePolicy | None


@dataclass(frozen=True)
class TreePool:
    """Accepted-length distributions of a set of trees built for one policy.

    tokens: int64[K]       verify tokens of each tree (root included)
    cdf:    float64[K, D+1] P(accepted draft tokens <= j), j = 0..D (last column 1)
    """

    tokens: np.ndarray
    cdf: np.ndarray

    @classmethod
    def from_trees(cls, trees: list[DraftTree], model: AcceptanceModelLike) -> TreePool:
        depth = max(t.max_depth for t in trees)
        cdf = np.ones((len(trees), depth + 1))
        for k, tree in enumerate(trees):
            p = np.asarray(model.node_accept_prob(tree), dtype=np.float64)
            reach = np.bincount(tree.depth, weights=p, minlength=depth + 1)  # P(len >= d), d>=0
            reach = np.minimum(np.minimum.accumulate(np.clip(reach, 0.0, 1.0)), 1.0)
            # P(len <= j) = 1 - P(len >= j + 1)
            cdf[k, :depth] = 1.0 - reach[1 : depth + 1]
        tokens = np.array([t.num_nodes for t in trees], dtype=np.int64)
        return cls(tokens, cdf)

    def expected_tokens(self) -> float:
        """Mean over the pool of E[accepted + 1] (tokens emitted per verify)."""
        return float(np.mean((1.0 - self.cdf[:, :-1]).sum(axis=1) + 1.0))

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(tree tokens int64[n], accepted draft tokens int64[n]) for n sequences: the accepted
        count is the number of CDF entries below a uniform draw, found with one searchsorted
        over the rows laid end to end (row k shifted by k, so the rows stay sorted)."""
        k, width = self.cdf.shape
        u = rng.random(n)
        if k == 1:
            return np.full(n, self.tokens[0]), np.searchsorted(self.cdf[0], u)
        idx = rng.integers(k, size=n)
        pos = np.searchsorted(self._flat, idx + u) - idx * width
        return self.tokens[idx], pos

    @property
    def _flat(self) -> np.ndarray:
        flat = self.__dict__.get("_flat_cache")
        if flat is None:
            k = self.cdf.shape[0]
            flat = (self.cdf + np.arange(k)[:, None]).ravel()
            object.__setattr__(self, "_flat_cache", flat)
        return flat


class Speculator:
    """Answers, per iteration, the policy for the live batch and each sequence's draw."""

    def __init__(
        self,
        policy: PolicySource,
        acceptance: AcceptanceModelLike | None,
        build_tree: TreeBuilder | None,
        *,
        pool_size: int = 256,
        seed: int = 0,
        build_batch_trees: BatchTreeBuilder | None = None,
    ):
        if policy is not None and (acceptance is None or build_tree is None):
            raise SpecError("speculation needs an acceptance model and a tree builder")
        self.policy = policy
        self.acceptance = acceptance
        self.build_tree = build_tree
        self.build_batch_trees = build_batch_trees
        self.pool_size = max(1, pool_size)
        self.seed = seed
        self._pools: dict[tuple[TreePolicy, int], TreePool] = {}
        self._lookup: dict[tuple[int, int], TreePolicy | None] = {}

    def policy_for(self, batch: int, context: float) -> TreePolicy | None:
        p = self.policy
        if p is None or isinstance(p, TreePolicy):
            return p
        key = (batch, int(context) >> 4)
        if key not in self._lookup:
            self._lookup[key] = p.lookup(batch, int(context))
        return self._lookup[key]

    def pool(self, policy: TreePolicy, batch: int = 0) -> TreePool:
        """The tree pool of a policy (built on first use, from a seed of its own so that pools
        do not depend on the order in which policies are first met)."""
        super_tree = self.build_batch_trees is not None and batch > 1
        key = (policy, batch if super_tree else 0)
        pool = self._pools.get(key)
        if pool is None:
            assert self.acceptance is not None and self.build_tree is not None
            h = zlib.crc32(repr((policy, key[1])).encode())  # stable across processes
            rng = np.random.default_rng([self.seed, h])
            if super_tree:
                assert self.build_batch_trees is not None
                draws = max(1, -(-self.pool_size // batch))
                trees = [
                    t
                    for _ in range(draws)
                    for t in self.build_batch_trees(policy, self.acceptance, rng, batch)
                ]
            else:
                n = 1 if policy.builder == "static" else self.pool_size
                trees = [self.build_tree(policy, self.acceptance, rng) for _ in range(n)]
            pool = TreePool.from_trees(trees, self.acceptance)
            self._pools[key] = pool
        return pool

    def draw(
        self, policy: TreePolicy, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(tree tokens int64[n], accepted draft tokens int64[n]) for the n decoding sequences."""
        return self.pool(policy, n).draw(rng, n)
