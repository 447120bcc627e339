"""Per-iteration speculation: which policy applies to the live batch, how many tokens each
sequence's tree puts in the verify batch, and how many of its draft tokens the target accepts.

Outcomes come from the planner's vectorised step sampler (planner.trees.sample_step: the same
builders and acceptance model the planner scores with; it draws each request's draft
confidences, builds its tree, and samples the accepted path). Even vectorised, one call costs
milliseconds for a batch of 64, more than the whole rest of an iteration, so each policy gets
a pool of `pool_size` independent step outcomes drawn once (one call over a large batch), and an
iteration resamples B of them: two numpy gathers, no Python loop over sequences. The pool's
mean is the run's accepted length, so it must be tight: 8192 outcomes give a standard error of
about 0.5% (1024 gave 1.5%, enough to swap policies a few percent apart). With a shared
verify budget (ECHO super-tree: TreePolicy.shared_budget, or the run-wide override
SimConfig.shared_budget that forces it on for every policy) outcomes are correlated within a
batch, so the pool is kept per batch size as whole batches, and an iteration draws one whole
batch.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from spectune.specs import PolicyTable, SpecError, TreePolicy

StepSampler = Callable[[TreePolicy, np.random.Generator, int, bool], tuple[np.ndarray, np.ndarray]]
"""(policy, rng, batch, shared_budget) -> (tokens gained int64[batch] = accepted draft tokens + 1,
verify tokens int64[batch] = tree nodes, root included)."""

PolicySource = PolicyTable | TreePolicy | None

SHARED_POOL_MIN = 256  # outcomes per batch size kept for shared-budget policies


def tree_sampler(acceptance: Any, hierarchy: Any = None) -> StepSampler:
    """The planner's sampler bound to an acceptance model; hierarchical policies
    (TreePolicy.chain > 0) draw from planner.hierarchical.sample_hierarchical with `hierarchy`
    (a HierAcceptance; None: such a policy is a SpecError), their 'verify tokens' being the
    chain the target verifies."""
    from spectune.planner.trees import sample_step

    def sample(
        policy: TreePolicy, rng: np.random.Generator, batch: int, shared: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        if policy.chain:
            from spectune.planner.hierarchical import sample_hierarchical

            if hierarchy is None:
                raise SpecError(
                    f"simulating the hierarchical policy {policy.label} needs the acceptance "
                    "models of the intermediate stage (SimConfig.hierarchy)"
                )
            return sample_hierarchical(policy, hierarchy, rng, batch)
        tokens, nodes, _ = sample_step(policy, acceptance, rng, batch, shared_budget=shared)
        return np.asarray(tokens, dtype=np.int64), np.asarray(nodes, dtype=np.int64)

    return sample


@dataclass(frozen=True)
class OutcomePool:
    """Step outcomes drawn for one policy.

    nodes:    int64[K]  verify tokens of each outcome's tree (root included)
    accepted: int64[K]  accepted draft tokens (the bonus token not counted)
    group:    outcomes per joint draw (1: independent; B: whole batches of a shared budget)
    """

    nodes: np.ndarray
    accepted: np.ndarray
    group: int = 1

    def expected_tokens(self) -> float:
        """Mean tokens per verify (accepted + bonus) over the pool."""
        return float(self.accepted.mean()) + 1.0

    def draw(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(verify tokens int64[n], accepted draft tokens int64[n]) for n sequences."""
        if self.group > 1:
            g = int(rng.integers(self.nodes.size // self.group))
            sl = slice(g * self.group, g * self.group + n)
            return self.nodes[sl], self.accepted[sl]
        idx = rng.integers(self.nodes.size, size=n)
        return self.nodes[idx], self.accepted[idx]


def _any_shared(policy: PolicySource) -> bool:
    """Whether a policy source holds a shared_budget policy."""
    if isinstance(policy, TreePolicy):
        return policy.shared_budget
    if isinstance(policy, PolicyTable):
        return any(b.policy is not None and b.policy.shared_budget for b in policy.buckets)
    return False


class Speculator:
    """Answers, per iteration, the policy for the live batch and each sequence's outcome."""

    def __init__(
        self,
        policy: PolicySource,
        sampler: StepSampler | None,
        *,
        pool_size: int = 8192,
        seed: int = 0,
        shared_budget: bool = False,
        pools: dict[Any, OutcomePool] | None = None,
    ):
        if policy is not None and sampler is None:
            raise SpecError("speculation needs a step sampler (acceptance model + tree builder)")
        self.policy = policy
        self.sampler = sampler
        self.pool_size = max(1, pool_size)
        self.seed = seed
        self.force_shared = shared_budget  # the run-wide override: every policy shares
        # whether any policy of the source may share its verify budget (the replica's
        # multi-iteration fast path asks `shares` per policy and batch)
        self.shared = shared_budget or _any_shared(policy)
        self._pools: dict[Any, OutcomePool] = {} if pools is None else pools
        self._lookup: dict[tuple[int, int], TreePolicy | None] = {}

    def shares(self, policy: TreePolicy, batch: int) -> bool:
        """Whether this policy's outcomes at this batch come from one shared verify budget."""
        return (self.force_shared or policy.shared_budget) and batch > 1

    def policy_for(self, batch: int, context: float) -> TreePolicy | None:
        p = self.policy
        if p is None or isinstance(p, TreePolicy):
            return p
        key = (batch, int(context) >> 4)
        hit = self._lookup.get(key, False)
        if hit is False:
            hit = p.lookup(batch, int(context))
            self._lookup[key] = hit
        return hit  # type: ignore[return-value]

    def pool(self, policy: TreePolicy, batch: int = 1) -> OutcomePool:
        """The outcome pool of a policy (drawn on first use from a stream of its own, so pools
        do not depend on the order in which policies are met)."""
        shared = self.shares(policy, batch)
        key = (policy, batch if shared else 0)
        cache_key = (*key, self.seed, self.pool_size)
        pool = self._pools.get(cache_key)
        if pool is None:
            assert self.sampler is not None
            h = zlib.crc32(repr(key).encode())  # stable across processes
            rng = np.random.default_rng([self.seed, h])
            if shared:
                groups = max(2, -(-SHARED_POOL_MIN // batch))
                draws = [self.sampler(policy, rng, batch, True) for _ in range(groups)]
                gained = np.concatenate([d[0] for d in draws])
                nodes = np.concatenate([d[1] for d in draws])
            else:
                gained, nodes = self.sampler(policy, rng, self.pool_size, False)
            pool = OutcomePool(nodes, gained - 1, batch if shared else 1)
            self._pools[cache_key] = pool
        return pool

    def draw(
        self, policy: TreePolicy, rng: np.random.Generator, n: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """(verify tokens int64[n], accepted draft tokens int64[n]) for n decoding sequences."""
        return self.pool(policy, n).draw(rng, n)
