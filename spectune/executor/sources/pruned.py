"""Dynamic-depth pruning of another source's trees: verify only the nodes likely to be accepted.

Drafting is the base source's (dynamic top-k or static shape, drafted with path log-probs).
Build: the base's full tree of this step, then tree_build.prune_tree drops every node whose path
draft probability is below the threshold (root always kept; the comparison in float64 against
log(threshold), as the planner's trees.build._choose does) and compacts each row: its counts[b]
kept nodes first, then inert placeholders (tree_build.PRUNED token, child of the root,
acceptance 0) that never match a target token, so accept / compact / extend run unchanged on
the [B, N] layout. A ragged verifier then verifies only the kept nodes.
"""

from __future__ import annotations

import torch

from spectune.executor.select import Candidates
from spectune.executor.sources.base import TreeSource
from spectune.executor.tree_build import TreeBatch, prune_tree


class Pruned(TreeSource):
    """`base`'s trees pruned at `threshold` (> 0). tree: the compacted trees [B, N];
    counts int64[B]: kept nodes per sequence (root included)."""

    counts: torch.Tensor

    def __init__(self, base: TreeSource, threshold: float):
        self.base, self.threshold, self.nodes = base, float(threshold), base.nodes
        t = base.tree
        self.tree = TreeBatch(
            t.parents.clone(), t.tokens.clone(), t.depth.clone(), t.accept.clone(),
            t.lo.clone(), t.mask.clone(), None, None if t.ids is None else t.ids.clone(),
        )  # fmt: skip
        b, n = t.tokens.shape
        self.counts = torch.full((b,), n, dtype=torch.int64, device=t.tokens.device)

    def draft(self) -> None:
        self.base.draft()

    def build(self) -> None:
        t, counts = prune_tree(self.base.full_tree(), self.threshold)
        for name in ("parents", "tokens", "depth", "accept", "lo", "mask"):
            getattr(self.tree, name).copy_(getattr(t, name))
        if self.tree.ids is not None and t.ids is not None:
            self.tree.ids.copy_(t.ids)
        self.counts.copy_(counts)

    def full_tree(self) -> TreeBatch:
        return self.base.full_tree()

    def candidates(self) -> Candidates:
        return self.base.candidates()
