"""Acceptance of hierarchical drafting: a tree drafter, an intermediate model, a target.

"Speculative Decoding Meets Quantization" (Zhang et al., arXiv 2505.22179; code
AI9Stars/SpecMQuant, src/model/hier_spec_quant) finds that verifying a tree on a 4-bit
weight-only target costs far more than a one-token step (its GEMMs leave the memory floor at a
few dozen rows, planner.operators.gemm_time), and lets a small intermediate model turn the tree
draft into a sequence: the drafter (the intermediate's EAGLE head) grows a tree, the
intermediate verifies it, and this repeats until the intermediate has accepted at least `chain`
tokens (TreePolicy.chain; SpecMQuant's --spec-min-draft-length, 6 for W4A16 Llama-3-70B with a
W4A16 Llama-3-8B intermediate). The target then verifies that chain. Every round keeps all it
accepted, so the chain is L' >= chain tokens.

One target step emits E[tokens] = E over L' of (1 + sum_{i=1..L'} prod_{j<=i} a_j), a_j the
chain conditionals of the target against the intermediate (the `chain` acceptance model, e.g.
the draft-model preset of the pair); the rounds R and the chain length L' come from the
`tree` acceptance model (the drafter against the intermediate), sampled per round with the
same builders as any tree (planner.trees.sample_step).

Assumption (stated, not measured): at temperature 0 verification is lossless, so the chain is
the intermediate's own greedy continuation whatever tree proposed it; the target's acceptance
of it is therefore the intermediate's chain acceptance as a draft model, independent of the
tree. The two are also drawn independently of each other: contexts hard for the intermediate's
drafter are not assumed harder for the target (a positive correlation would lower E[tokens]
slightly when R is large). At temperature > 0 the same composition is used with each model's
own acceptance at that temperature.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace

import numpy as np

from spectune.planner.acceptance.base import AcceptanceModel
from spectune.specs.errors import SpecError
from spectune.specs.policy import MAX_DEPTH, TreePolicy
from spectune.specs.scenario import ResolvedScenario

SAMPLES = 2048
"""Chains drawn per policy: the standard error of E[tokens] is then under 0.5%."""

_CACHE: OrderedDict[tuple[object, ...], HierOutcome] = OrderedDict()
_CACHE_SIZE = 1024


@dataclass(frozen=True)
class HierAcceptance:
    """The two acceptance models a hierarchical policy composes."""

    tree: AcceptanceModel
    """the drafter's trees against the intermediate model"""
    chain: AcceptanceModel
    """the intermediate's chain against the target (a draft-model pair)"""


@dataclass(frozen=True)
class HierOutcome:
    """Means of one hierarchical target step per sequence (what CostModel.iteration prices)."""

    expected_tokens: float
    """tokens the target step emits: accepted chain tokens + the bonus token"""
    target_tokens: float
    """tokens the target verifies: the chain L' + the root"""
    rounds: float
    """intermediate rounds (tree draft + intermediate verify) per target step"""
    round_accepted: float
    """tokens the intermediate accepts per round (accepted + its bonus): the drafter's extend"""
    tree_tokens: float
    """tokens of each round's tree (root included), as built"""
    chain_tokens: float
    """mean chain length L' (>= policy.chain)"""


def tree_policy(policy: TreePolicy) -> TreePolicy:
    """The policy of one round's tree (the same tree, not hierarchical)."""
    return replace(policy, chain=0)


def chain_expected_tokens(chain: AcceptanceModel, length: int) -> float:
    """E[tokens] of a target step verifying a chain of `length` draft tokens (1 + accepted)."""
    from spectune.planner.trees import expected_tokens_for_policy

    if length <= 0:
        return 1.0
    if length > MAX_DEPTH:
        raise SpecError(f"a chain of {length} tokens is longer than {MAX_DEPTH}")
    return expected_tokens_for_policy(
        TreePolicy("dynamic-topk", length, 1, length + 1), chain, samples=64
    )


def hierarchical_outcome(
    policy: TreePolicy, models: HierAcceptance, *, samples: int = SAMPLES, seed: int = 0
) -> HierOutcome:
    """Means of a hierarchical step (module docstring), from `samples` sampled chains: each
    draws rounds of the policy's tree against the intermediate until the accepted tokens reach
    policy.chain. Deterministic for (policy, models, samples, seed) and cached."""
    from spectune.planner.trees import sample_step

    if not policy.chain:
        raise SpecError(f"policy {policy.label} is not hierarchical (chain 0)")
    key = (policy, models.tree.cache_key, models.chain.cache_key, samples, seed)
    hit = _CACHE.get(key)
    if hit is not None:
        _CACHE.move_to_end(key)
        return hit
    rng = np.random.default_rng(seed)
    inner = tree_policy(policy)
    # every round gains >= 1 token, so `chain` rounds always suffice: draw them all at once
    tok, nodes, _ = sample_step(inner, models.tree, rng, samples * policy.chain)
    gained = tok.reshape(samples, policy.chain).astype(np.float64)
    total = np.cumsum(gained, axis=1)
    done = total >= policy.chain
    last = np.argmax(done, axis=1)  # first round whose running total reaches the chain
    rows = np.arange(samples)
    length = np.minimum(total[rows, last], MAX_DEPTH).astype(np.int64)
    rounds = last + 1.0
    used = np.arange(policy.chain)[None, :] <= last[:, None]
    table = {int(n): chain_expected_tokens(models.chain, int(n)) for n in np.unique(length)}
    out = HierOutcome(
        expected_tokens=float(np.mean([table[int(n)] for n in length])),
        target_tokens=float(length.mean()) + 1.0,
        rounds=float(rounds.mean()),
        round_accepted=float(gained[used].mean()),
        tree_tokens=float(nodes.reshape(samples, policy.chain)[used].mean()),
        chain_tokens=float(length.mean()),
    )
    _CACHE[key] = out
    if len(_CACHE) > _CACHE_SIZE:
        _CACHE.popitem(last=False)
    return out


def sample_hierarchical(
    policy: TreePolicy, models: HierAcceptance, rng: np.random.Generator, batch: int
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int64[batch], target tokens int64[batch]) of one hierarchical step per sequence:
    rounds of the policy's tree against the intermediate until the running total of accepted
    tokens reaches policy.chain (chain L'), then the target's walk down that chain with the
    chain acceptance model. tokens = accepted chain tokens + 1; target tokens = L' + 1 (what
    the target verifies). The simulator's sampler for hierarchical policies."""
    from spectune.planner.trees import sample_accepted_lengths, sample_step

    if not policy.chain:
        raise SpecError(f"policy {policy.label} is not hierarchical (chain 0)")
    tok, _, _ = sample_step(tree_policy(policy), models.tree, rng, batch * policy.chain)
    total = np.cumsum(tok.reshape(batch, policy.chain), axis=1)
    last = np.argmax(total >= policy.chain, axis=1)
    length = np.minimum(total[np.arange(batch), last], MAX_DEPTH).astype(np.int64)
    tokens = np.ones(batch, dtype=np.int64)
    for n in np.unique(length):
        rows = np.flatnonzero(length == n)
        chain = TreePolicy("dynamic-topk", int(n), 1, int(n) + 1)
        tokens[rows] = sample_accepted_lengths(chain, models.chain, rng, rows.size)
    return tokens, length + 1


def chain_acceptance(alpha: float) -> AcceptanceModel:
    """The acceptance of a draft model's chain with the same conditional `alpha` at every
    position (draft models read real tokens, so acceptance does not decay with depth: the
    presets' decay 1.0): the `chain` model of a HierAcceptance where no preset covers the pair."""
    from spectune.planner.acceptance import PositionalAcceptance

    if not 0.0 < alpha < 1.0:
        raise SpecError(f"chain acceptance alpha must be in (0, 1), got {alpha!r}")
    return PositionalAcceptance([[float(alpha)]])


def scenario_hierarchy(resolved: ResolvedScenario) -> HierAcceptance | None:
    """The acceptance models of a scenario's hierarchical policies (its intermediate's drafter
    against the intermediate, the intermediate's chains against the target: Scenario.resolve),
    or None when the scenario names no intermediate."""
    from spectune.planner.acceptance import acceptance_model

    trees, chains = resolved.intermediate_trees, resolved.intermediate_chains
    if trees is None or chains is None:
        return None
    return HierAcceptance(tree=acceptance_model(trees), chain=acceptance_model(chains))
