"""ECHO's shared verify budget: one budget of B x (budget - 1) draft nodes for the whole batch.

Drafting is the base source's (dynamic top-k pool, or the static Sequoia shape for 2 x budget,
as the planner's builder drafts for a shared budget). Build: every drafted candidate of every
request competes for the batch's B x (budget - 1) draft slots by P(accepted), the product of
the synthetic acceptances on its path (select.shared_keep: the planner's keep_top over the
whole batch), then nodes whose path draft probability is under the prune threshold are dropped
(as the planner does after choosing), and each request's kept nodes are laid out as one row of
[B, N] (select.compact; placeholders after counts[b]). Trees differ in size per request, so the
batch is verified ragged (verifiers/ragged.py), T = sum(counts) tokens. Under recorded-trace
acceptance (0/1 outcomes, SyntheticAcceptance.outcomes) P(accepted) is the answer, not an
estimate, so candidates compete by their path draft probability instead (what a drafter knows).
"""

from __future__ import annotations

import math

import torch

from spectune.executor.select import (
    ECHO_ROW_FACTOR,
    NEG,
    Candidates,
    accept_logp,
    compact,
    shared_keep,
)
from spectune.executor.sources.base import TreeSource
from spectune.executor.tree_build import TreeBatch


def shared_row_nodes(columns: int, budget: int, batch: int) -> int:
    """Slots of one request's row under a shared budget: its candidates (columns, root
    included), at most ECHO_ROW_FACTOR x budget and the whole batch's budget + 1."""
    return max(2, min(columns, ECHO_ROW_FACTOR * budget, 1 + batch * (budget - 1)))


class Shared(TreeSource):
    """`base`'s candidates chosen under one shared verify budget (ECHO super-tree).
    tree: [B, N] compacted rows; counts int64[B]: kept nodes per request (root included)."""

    counts: torch.Tensor

    def __init__(
        self,
        base: TreeSource,
        columns: int,
        budget: int,
        prune: float,
        max_depth: int,
        by_confidence: bool = False,
    ):
        self.base, self.prune, self.max_depth = base, float(prune), max_depth
        self.by_confidence = by_confidence
        b = base.tree.tokens.shape[0]
        self.total = b * (budget - 1)
        self.nodes = shared_row_nodes(columns, budget, b)
        t, counts = self.choose()
        self.tree = t
        self.counts = counts

    def choose(self) -> tuple[TreeBatch, torch.Tensor]:
        """This step's shared-budget trees and counts, as fresh tensors."""
        cands: Candidates = self.base.candidates()
        if self.by_confidence:  # recorded outcomes: rank by the draft path probability
            lp = torch.where(cands.score > NEG / 2, cands.score.double(), NEG)
        else:
            lp = accept_logp(cands.parents, cands.accept, self.max_depth)
        keep = shared_keep(lp, self.total, self.nodes)
        if self.prune > 0:
            keep &= cands.score.double() >= math.log(self.prune)
            keep[:, 0] = True
        return compact(cands, keep, self.nodes, self.max_depth)

    def draft(self) -> None:
        self.base.draft()

    def build(self) -> None:
        t, counts = self.choose()
        for name in ("parents", "tokens", "depth", "accept", "lo", "mask", "score", "ids"):
            getattr(self.tree, name).copy_(getattr(t, name))
        self.counts.copy_(counts)

    def full_tree(self) -> TreeBatch:
        return self.base.full_tree()

    def candidates(self) -> Candidates:
        return self.base.candidates()
