"""Grafting: retrieved continuations fill the verify slots that pruning (or a small pool) left.

Drafting and choosing are the base source's (dense, pruned or shared-budget trees). Build:
after the base's trees, the retrieval drafter (executor/retrieval.py) looks up a continuation
for each of the L = min(graft_budget, N) kept leaves with the highest P(accepted), and up to
min(free slots, graft_budget) of its tokens per request are grafted as chains under those
leaves, each slot to the (leaf, position) of largest expected gain (select.place_grafts, the
planner's choose_grafts). Free slots: budget - kept nodes per request; with a shared budget,
the batch's unused B x (budget - 1) - kept draft slots split evenly. The chain tokens' acceptance
is the retrieval profile's rho for the request's drawn match length (common random draws).
The trees keep the [B, N] layout with counts (kept + grafted nodes per request). Under
recorded-trace acceptance (0/1 outcomes) leaves are ranked by their path draft probability, as
a shared budget's candidates are (shared.py).
"""

from __future__ import annotations

import torch

from spectune.executor.retrieval import RetrievalDrafter
from spectune.executor.select import (
    Candidates,
    accept_logp,
    attach_chains,
    best_leaves,
    place_grafts,
)
from spectune.executor.sources.base import TreeSource
from spectune.executor.tree_build import PRUNED, TreeBatch

FIELDS = ("parents", "tokens", "depth", "accept", "lo", "mask", "score", "ids")


class Grafted(TreeSource):
    """`base`'s trees with retrieved chains grafted into their free slots (N slots per row:
    the base's plus graft_budget under a shared budget, else at least the budget)."""

    counts: torch.Tensor

    def __init__(
        self,
        base: TreeSource,
        retrieval: RetrievalDrafter,
        budget: int,
        graft_budget: int,
        shared: bool,
        max_depth: int,
        by_confidence: bool = False,
    ):
        self.base, self.retrieval, self.budget = base, retrieval, budget
        self.by_confidence = by_confidence
        self.graft_budget, self.shared, self.max_depth = graft_budget, shared, max_depth
        bt = base.tree
        b, n0 = bt.tokens.shape
        self.batch, self.base_nodes = b, n0
        self.nodes = n0 + graft_budget if shared else max(n0, budget)
        self.leaves = min(graft_budget, n0)
        dev = bt.tokens.device
        self.tree = self._widen(bt)
        self.counts = torch.full((b,), n0, dtype=torch.int64, device=dev)
        self.base_counts = torch.full((b,), n0, dtype=torch.int64, device=dev)

    def _widen(self, t: TreeBatch) -> TreeBatch:
        """t [B, n0] padded to [B, N] with placeholders (fresh tensors)."""
        b, n0 = t.tokens.shape
        extra = self.nodes - n0
        dev = t.tokens.device

        def pad(x: torch.Tensor, fill: float | int) -> torch.Tensor:
            tail = torch.full((b, extra), fill, dtype=x.dtype, device=dev)
            return torch.cat((x, tail), dim=1)

        mask = torch.zeros((b, self.nodes, self.nodes), dtype=torch.bool, device=dev)
        mask[:, :n0, :n0] = t.mask
        # a placeholder sees itself; a device-side eye, since indexed assignment of a Python
        # scalar copies it from the host, which a CUDA graph capture refuses
        mask[:, n0:, n0:] = torch.eye(extra, dtype=torch.bool, device=dev)
        mask[:, n0:, 0] = True
        score = (
            pad(t.score, 0.0)
            if t.score is not None
            else torch.zeros((b, self.nodes), dtype=torch.float32, device=dev)
        )
        ids = None if t.ids is None else pad(t.ids, 0)
        return TreeBatch(
            pad(t.parents, 0), pad(t.tokens, PRUNED), pad(t.depth, 1), pad(t.accept, 0.0),
            pad(t.lo, 0.0), mask, score, ids,
        )  # fmt: skip

    def draft(self) -> None:
        self.base.draft()

    def build(self) -> None:
        self.base.build()
        base_counts = self.base.counts if self.base.counts is not None else self.base_counts
        t = self._widen(self.base.tree)
        if self.by_confidence:  # recorded outcomes: leaves ranked by draft path probability
            assert t.score is not None  # _widen always gives one
            lp = t.score.double()
        else:
            lp = accept_logp(t.parents, t.accept, self.max_depth)
        lp = torch.where(
            torch.arange(self.nodes, device=lp.device) < base_counts[:, None], lp, -1.0e30
        )
        leaf, leaf_lp = best_leaves(t, base_counts, lp, self.leaves)
        rho = self.retrieval.chain_accept()  # [B, G]
        if self.shared:
            free = (self.batch * (self.budget - 1) - (base_counts - 1).sum()).clamp(min=0)
            slots = (free // self.batch).expand(self.batch)
        else:
            slots = self.budget - base_counts
        length, _ = place_grafts(leaf_lp, rho, slots, self.graft_budget)
        par = torch.gather(t.parents, 1, leaf)
        prev = torch.gather(t.tokens, 1, torch.where(par >= 0, par, leaf))
        last = torch.gather(t.tokens, 1, leaf)
        chains = self.retrieval.lookup(prev, last)  # [B, L, G]
        out, counts = attach_chains(t, base_counts, leaf, length, chains, rho, self.max_depth)
        for name in FIELDS:
            src = getattr(out, name)
            if src is not None and getattr(self.tree, name) is not None:
                getattr(self.tree, name).copy_(src)
        self.counts.copy_(counts)

    def observe(self, tokens: torch.Tensor, count: torch.Tensor) -> None:
        self.retrieval.record(tokens, count)
        self.base.observe(tokens, count)

    def full_tree(self) -> TreeBatch:
        return self.base.full_tree()

    def candidates(self) -> Candidates:
        return self.base.candidates()
