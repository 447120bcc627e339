"""Tree building entry points: one tree, a batch of trees, a batch of sampled step outcomes, and
the cached mean expected tokens of a policy (the planner's closed-form objective).

Every entry point goes through the same steps on flat candidate pools (trees.flat):
  1. draw candidates: dynamic-topk (EAGLE-2 top-k expansion) or static (Sequoia's optimal shape
     for the model's mean positional table, its nodes' draft probabilities drawn per step);
  2. choose nodes: the top budget-1 by path draft probability (EAGLE-2 rerank), or with
     shared_budget the top batch*(budget-1) over the whole batch by P(accepted) (ECHO
     super-tree); then drop nodes whose path draft probability is below prune_threshold;
  3. graft retrieved chains into the freed slots, up to graft_budget.
Models bound to one recorded step (ReplayStep) are built from the recorded pool (trees.pool).

Policies whose outcome the closed form does not give (the delayed builder's i.i.d. drafts, or a
verification rule other than 'token') are scored by simulation (planner.acceptance.rules): the
top-k builders' trees as built here, the delayed builder's shape from trees.delayed, each
verified in simulated worlds of draft and target distributions.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from spectune.planner.acceptance.base import LOG_ZERO, AcceptanceModel
from spectune.planner.acceptance.replay import ReplayStep
from spectune.planner.acceptance.rules import expected_tokens_by_rule, simulated_tokens
from spectune.planner.trees.delayed import delayed_tree
from spectune.planner.trees.flat import FlatPool, dynamic_pool, static_pool
from spectune.planner.trees.outcome import (
    Grafts,
    choose_grafts,
    expected_tokens,
    keep_top,
    row_threshold,
    sample_tokens,
    to_tree,
)
from spectune.planner.trees.pool import build_from_pool
from spectune.planner.trees.static import static_shape, static_size
from spectune.specs.policy import TreePolicy
from spectune.specs.tree import IID_BUILDERS, DraftTree

_EXPECTED: OrderedDict[tuple[object, ...], float] = OrderedDict()
_CACHE_SIZE = 4096
RULE_TREES = 8
"""Top-k trees built per simulated estimate of a non-'token' rule (worlds split among them)."""
RULE_WORLDS = 512
"""Fewest simulated worlds per estimate (standard error about 1% of the mean tokens)."""


def simulated(policy: TreePolicy) -> bool:
    """Whether this policy's outcome comes from simulation (planner.acceptance.rules): i.i.d.
    drafts, or greedy verification above temperature 0. With top-k drafts (one-hot draft rows)
    'token' is the target-only walk and Traversal Verification accepts each root path with the
    same probability (leaving a rejected child c of b rescales T_b without x_c by
    1 / (1 - T_b(x_c)): the walk's conditioning), so both take the exact closed form."""
    return policy.builder in IID_BUILDERS or policy.verify == "greedy"


def _simulated_expected(
    policy: TreePolicy, model: AcceptanceModel, rng: np.random.Generator, samples: int
) -> float:
    worlds = max(RULE_WORLDS, 4 * samples)
    if policy.builder in IID_BUILDERS:
        tree = delayed_tree(policy)
        return expected_tokens_by_rule(policy.verify, tree, model, rng, worlds, iid=True)
    trees = [build_tree(policy, model, rng) for _ in range(RULE_TREES)]
    each = -(-worlds // RULE_TREES)
    return float(
        np.mean(
            [expected_tokens_by_rule(policy.verify, t, model, rng, each, iid=False) for t in trees]
        )
    )


def _simulated_step(
    policy: TreePolicy, model: AcceptanceModel, rng: np.random.Generator, batch: int
) -> tuple[np.ndarray, int]:
    """(tokens int64[batch], tree nodes): one simulated world per request, all on one tree
    (the delayed shape, or one built top-k tree)."""
    iid = policy.builder in IID_BUILDERS
    tree = delayed_tree(policy) if iid else build_tree(policy, model, rng)
    return simulated_tokens(policy.verify, tree, model, rng, batch, iid), tree.num_nodes


def _pool(
    policy: TreePolicy,
    model: AcceptanceModel,
    rng: np.random.Generator,
    batch: int,
    shared: bool,
    reuse: bool = False,
) -> FlatPool:
    """Draw the batch's candidate pools (`reuse`: in scratch buffers; the pool must not leave
    the calling function)."""
    if policy.builder == "static":
        size = static_size(policy.budget, shared and batch > 1)
        shape = static_shape(model, size, policy.depth, policy.topk)
        return static_pool(model, shape, rng, batch)
    return dynamic_pool(model, policy.depth, policy.topk, rng, batch, reuse)


def _choose(
    policy: TreePolicy,
    model: AcceptanceModel,
    pool: FlatPool,
    rng: np.random.Generator,
    shared: bool,
) -> tuple[np.ndarray, np.ndarray, Grafts | None]:
    """(keep bool[B, T], P(accepted) float64[B, T], grafts) for a drawn pool."""
    b = pool.batch
    slots_each = policy.budget - 1
    need_p = (shared and b > 1) or policy.graft_budget > 0
    p = pool.accept_prob() if need_p else np.empty((0, 0))  # P only when something needs it
    if shared and b > 1:
        score = np.where(p > 0, np.log(np.maximum(p, 1e-300)), 2 * LOG_ZERO)
        keep = keep_top(score, None, b * slots_each)
    else:
        keep = keep_top(pool.lp, slots_each, None)
    if policy.prune_threshold > 0.0:
        keep &= pool.lp >= np.log(policy.prune_threshold)
        keep[:, 0] = True
    grafts = None
    if policy.graft_budget > 0:
        used = keep.sum(axis=1) - 1
        if shared and b > 1:
            free = max(b * slots_each - int(used.sum()), 0)
            slots = np.full(b, free // b, dtype=np.int64)
        else:
            slots = slots_each - used
        grafts = choose_grafts(model.retrieval, keep, pool, p, slots, policy.graft_budget, rng)
    return keep, p, grafts


def build_tree(policy: TreePolicy, model: AcceptanceModel, rng: np.random.Generator) -> DraftTree:
    """One request's draft tree for this step (pure: the result depends only on the inputs and
    the generator's state)."""
    if isinstance(model, ReplayStep):
        return build_from_pool(policy, model, rng)
    if policy.builder in IID_BUILDERS:
        return delayed_tree(policy)
    pool = _pool(policy, model, rng, 1, False)
    keep, _, grafts = _choose(policy, model, pool, rng, False)
    return to_tree(pool, keep, grafts, 0)


def build_batch_trees(
    policy: TreePolicy,
    model: AcceptanceModel,
    rng: np.random.Generator,
    batch: int,
    shared_budget: bool = True,
) -> list[DraftTree]:
    """Trees for a whole batch. With shared_budget (ECHO super-tree), one verify budget of
    batch * (budget - 1) draft tokens goes to the candidates with the highest P(accepted) over
    the whole batch; without it each request gets budget - 1 (equal split)."""
    pool = _pool(policy, model, rng, batch, shared_budget)
    keep, _, grafts = _choose(policy, model, pool, rng, shared_budget)
    return [to_tree(pool, keep, grafts, i) for i in range(batch)]


#: largest [batch, candidates] array drawn at once (16 MB of float64); bigger batches of huge
#: pools (top-k 64 x depth 64 is 258k candidates per request) are drawn in chunks
MAX_POOL_CELLS = 2_000_000


def _chunk(policy: TreePolicy, batch: int, shared: bool) -> int:
    """Requests per draw so that a pool stays under MAX_POOL_CELLS (the whole batch when the
    budget is shared: one allocation must see every request)."""
    if shared:
        return batch
    k = policy.topk
    cols = policy.budget if policy.builder == "static" else 1 + k + (policy.depth - 1) * k * k
    return max(1, min(batch, MAX_POOL_CELLS // cols))


def sample_accepted_lengths(
    policy: TreePolicy,
    model: AcceptanceModel,
    rng: np.random.Generator,
    batch: int,
    shared_budget: bool = False,
) -> np.ndarray:
    """int64[batch]: tokens each request gains in one iteration (accepted draft tokens + 1),
    built and verified with the same rules as build_tree / build_batch_trees, vectorised over
    the batch (no Python loop per request or node)."""
    if simulated(policy):
        return _simulated_step(policy, model, rng, batch)[0]
    step = _chunk(policy, batch, shared_budget and batch > 1)
    if step < batch:
        return np.concatenate(
            [
                sample_accepted_lengths(policy, model, rng, min(step, batch - i))
                for i in range(0, batch, step)
            ]
        )
    pool = _pool(policy, model, rng, batch, shared_budget, reuse=True)
    if policy.graft_budget == 0 and not (shared_budget and batch > 1):
        lp_min = np.log(policy.prune_threshold) if policy.prune_threshold > 0 else -np.inf
        thr = row_threshold(pool, policy.budget - 1, lp_min)
        return sample_tokens(pool, thr, None, rng)
    keep, _, grafts = _choose(policy, model, pool, rng, shared_budget)
    return sample_tokens(pool, keep, grafts, rng)


def sample_step(
    policy: TreePolicy,
    model: AcceptanceModel,
    rng: np.random.Generator,
    batch: int,
    shared_budget: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(tokens int64[B], tree_nodes int64[B], expected float64[B]) for one iteration: sampled
    tokens gained (accepted + 1), verify tokens each request's tree used (root included; what the
    cost model charges) and each tree's exact expected tokens (simulated policies: the
    policy's simulated mean, expected_tokens_for_policy)."""
    if simulated(policy):
        tokens, nodes = _simulated_step(policy, model, rng, batch)
        mean = expected_tokens_for_policy(policy, model)
        return tokens, np.full(batch, nodes, dtype=np.int64), np.full(batch, mean)
    step = _chunk(policy, batch, shared_budget and batch > 1)
    if step < batch:
        parts = [
            sample_step(policy, model, rng, min(step, batch - i)) for i in range(0, batch, step)
        ]
        return tuple(np.concatenate(a) for a in zip(*parts, strict=True))  # type: ignore[return-value]
    pool = _pool(policy, model, rng, batch, shared_budget, reuse=True)
    if policy.graft_budget == 0 and not (shared_budget and batch > 1):
        lp_min = np.log(policy.prune_threshold) if policy.prune_threshold > 0 else -np.inf
        thr = row_threshold(pool, policy.budget - 1, lp_min)
        kept = thr.mask(pool)
        p = pool.accept_prob()
        expected = np.where(kept, p, 0.0).sum(axis=1)  # the root column counts the bonus 1
        return sample_tokens(pool, thr, None, rng), kept.sum(axis=1), expected
    keep, p, grafts = _choose(policy, model, pool, rng, shared_budget)
    if not ((shared_budget and batch > 1) or policy.graft_budget > 0):
        p = pool.accept_prob()
    nodes = keep.sum(axis=1)
    if grafts is not None:
        nodes = nodes + grafts.length.sum(axis=1)
    expected = expected_tokens(keep, p, grafts)
    return sample_tokens(pool, keep, grafts, rng), nodes, expected


def expected_tokens_for_policy(
    policy: TreePolicy,
    model: AcceptanceModel,
    samples: int = 64,
    seed: int = 0,
    shared_budget: bool = False,
) -> float:
    """Mean over `samples` built trees of each tree's exact expected tokens per step (accepted +
    1). Deterministic for (policy, model, samples, seed) and cached, so the planner's objective
    can call it thousands of times."""
    key = (policy, model.cache_key, samples, seed, shared_budget)
    hit = _EXPECTED.get(key)
    if hit is not None:
        _EXPECTED.move_to_end(key)
        return hit
    rng = np.random.default_rng(seed)
    if simulated(policy) and not isinstance(model, ReplayStep):
        value = _simulated_expected(policy, model, rng, samples)
    elif isinstance(model, ReplayStep):
        value = model.expected_tokens(build_tree(policy, model, rng))
    else:
        step = _chunk(policy, samples, shared_budget and samples > 1)
        total = 0.0
        for i in range(0, samples, step):
            n = min(step, samples - i)
            pool = _pool(policy, model, rng, n, shared_budget, reuse=True)
            keep, p, grafts = _choose(policy, model, pool, rng, shared_budget)
            if not ((shared_budget and n > 1) or policy.graft_budget > 0):
                p = pool.accept_prob()
            total += float(expected_tokens(keep, p, grafts).sum())
        value = total / samples
    _EXPECTED[key] = value
    if len(_EXPECTED) > _CACHE_SIZE:
        _EXPECTED.popitem(last=False)
    return value
