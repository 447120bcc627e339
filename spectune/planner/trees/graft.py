"""Dynamic-depth pruning and grafting on a built DraftTree.

Pruning drops nodes whose path draft probability is below a threshold (a node's path
probability never exceeds its parent's, so what is left keeps its parents). Grafting fills the
slots pruning freed with retrieved continuations: each step draws a suffix-match length m; a
chain of retrieved tokens hangs from a leaf, its j-th token matching (given the previous did)
with rho[m][j]; slots go one by one to the (leaf, position) with the largest expected gain
P(leaf accepted) * rho_1 * ... * rho_j, i.e. to extensions of the most probable surviving paths.
Chains hang from leaves, where no model branch remains, so they never duplicate a model child;
the pool-based grafting of recorded steps (trees.pool.graft_from_pool) deduplicates recorded
retrieval tokens by token id.
"""

from __future__ import annotations

import numpy as np

from spectune.planner.acceptance.base import AcceptanceModel
from spectune.specs.tree import SOURCE_RETRIEVAL, DraftTree


def prune_tree(tree: DraftTree, threshold: float) -> DraftTree:
    """The tree without nodes whose path draft probability is below `threshold`."""
    if threshold <= 0.0:
        return tree
    keep = np.exp(tree.path_logprob) >= threshold
    keep[0] = True
    return tree.subtree(keep)


def graft_tree(
    tree: DraftTree,
    model: AcceptanceModel,
    rng: np.random.Generator,
    graft_budget: int,
    budget: int,
) -> DraftTree:
    """Add up to min(graft_budget, budget - N) retrieved tokens as chains under the leaves with
    the highest P(accepted). Never exceeds `budget`; never lowers expected tokens (existing
    nodes keep their probabilities)."""
    profile = model.retrieval
    slots = min(int(graft_budget), int(budget) - tree.num_nodes)
    if slots <= 0 or not profile.enabled:
        return tree
    m = int(profile.draw_match_len(rng, 1)[0])
    rho = profile.chain(m, slots)
    if m == 0 or rho[0] <= 0:
        return tree
    p = model.node_accept_prob(tree)
    leaves = tree.leaves
    order = leaves[np.lexsort((leaves, -p[leaves]))][:slots]
    cum = np.cumprod(rho)
    gains = p[order][:, None] * cum[None, :]  # [L, J]
    flat = gains.ravel()
    pick = np.lexsort((np.arange(flat.size), -flat))[:slots]
    pick = pick[flat[pick] > 0]
    length = np.zeros(order.size, dtype=np.int64)
    np.add.at(length, pick // rho.size, 1)
    parents = tree.parents.tolist()
    logprobs = tree.logprobs.tolist()
    tokens = tree.tokens.tolist()
    source = tree.source.tolist()
    fresh = int(tree.tokens.max()) + 1
    for leaf, n in zip(order.tolist(), length.tolist(), strict=True):
        at = leaf
        for j in range(n):
            parents.append(at)
            logprobs.append(float(np.log(rho[j])))
            tokens.append(fresh)
            source.append(SOURCE_RETRIEVAL)
            fresh += 1
            at = len(parents) - 1
    return DraftTree(
        np.asarray(parents), np.asarray(tokens), np.asarray(logprobs), np.asarray(source)
    )
