"""Delayed tree expansion on the GPU: one sampled path, then top-k i.i.d. sampled rollouts.

Drafting runs one drafter step per level: the root and the chain one token per sequence (width
1), then the rollouts' frontier (width topk). Tokens are drawn from the drafter's softmax by
Gumbel-max (i.i.d. per rollout, so rollouts may repeat a token); at the branch node the topk
rollouts each draw their own first token from the same distribution. Draft slots are level
major (root, chain, then topk per rollout level), so a rollout node attends the chain and the
earlier slots of its own rollout. The tree (executor.tree_build.delayed_tree) keeps the shape
planner.trees.delayed gives for the policy, so planner, simulator and executor verify the same
trees.

Synthetic acceptance: a chain node takes the rank-0 entry of a bank row at its depth and the
rollouts' first tokens the rank-0..topk-1 entries of the branch node's row (siblings' acceptances
sum to <= 1, as draw_target_tokens needs); deeper rollout nodes the rank-0 entry. So the
accepted lengths measured here follow the top-k walk on this shape; the verification rules'
accepted lengths for i.i.d. drafts come from planner.acceptance.rules.
"""

from __future__ import annotations

from typing import Any

import torch

from spectune.executor.sources.base import Drafting, TreeSource
from spectune.executor.tree_build import TreeBatch, delayed_tree
from spectune.planner.trees.delayed import delayed_layout


class Delayed(TreeSource):
    """Delayed trees of `nodes` slots for a (depth, topk, delay, budget) policy."""

    def __init__(self, drafting: Drafting, depth: int, topk: int, delay: int, budget: int):
        self.d, self.depth, self.topk = drafting, depth, topk
        self.layout = delayed_layout(depth, topk, delay, budget)
        self.nodes = int(self.layout[0].size)
        self.chain = min(delay, budget - 1)
        self.span = depth - self.chain
        b, dev = drafting.batch, drafting.device
        f = 1 + self.chain + topk * self.span
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        f32: dict[str, Any] = {"dtype": torch.float32, "device": dev}
        self.full_token = torch.zeros((b, f), **i64)
        self.full_accept = torch.zeros((b, f), **f32)
        self.full_lo = torch.zeros((b, f), **f32)
        self.full_accept[:, 0] = 1.0
        # slot attention: a rollout slot sees the chain slots and its own rollout's slots
        slots = f
        own = torch.zeros((slots, slots), dtype=torch.bool, device=dev)
        own[:, : self.chain + 1] = True
        rollout = torch.arange(slots, device=dev) - (self.chain + 1)
        same = (rollout[:, None] % topk == rollout[None, :] % topk) & (rollout[None, :] >= 0)
        own |= same & (rollout[None, :] <= rollout[:, None])
        self.slot_mask = own.tril().expand(b, slots, slots)
        self.tree = self.select()

    def _sample(self, hidden: torch.Tensor, draws: int) -> torch.Tensor:
        """int64[B, W * draws]: draws i.i.d. tokens per row of hidden [B, W, h] (Gumbel-max)."""
        logits = self.d.drafter.logits(hidden).float()[..., : self.d.other]
        b, w, v = logits.shape
        g = -torch.log(-torch.log(torch.rand((b, w, draws, v), device=logits.device)))
        return (logits[:, :, None, :] + g).argmax(dim=-1).reshape(b, w * draws)

    def _accept(self, level: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        syn, b = self.d.synthetic, self.d.batch
        rows = syn.draw_rows(level, (b,), self.d.device)
        _, acc, lo = syn.children(level, rows, width)
        return acc, lo

    def draft(self) -> None:
        k, b, c, dev = self.topk, self.d.batch, self.d.context, self.d.device
        root = self.d.root
        tok, hid_in = root.token[:, None], root.hidden[:, None]
        for level in range(self.chain + 1):  # the root and the chain: width 1
            pos = torch.full((b, 1), c + level, dtype=torch.int64, device=dev)
            mask = self.slot_mask[:, level : level + 1, : level + 1]
            hid = self.d.drafter.draft_step(tok, hid_in, pos, self.d.cache, c, level, mask)
            if level < self.chain:
                tok = self._sample(hid, 1)
                acc, lo = self._accept(level + 1, 1)
                self.full_token[:, level + 1] = tok[:, 0]
                self.full_accept[:, level + 1], self.full_lo[:, level + 1] = acc[:, 0], lo[:, 0]
                hid_in = hid
        tok = self._sample(hid, k)  # [B, k]: the rollouts' first tokens, i.i.d.
        hid_in = hid.expand(b, k, hid.shape[-1])
        for step in range(self.span):
            s0 = self.chain + 1 + step * k
            self.full_token[:, s0 : s0 + k] = tok
            acc, lo = self._accept(self.chain + step + 1, k if step == 0 else 1)
            if step == 0:
                self.full_accept[:, s0 : s0 + k], self.full_lo[:, s0 : s0 + k] = acc, lo
            else:
                self.full_accept[:, s0 : s0 + k] = acc[:, :1]
                self.full_lo[:, s0 : s0 + k] = 0.0
            if step == self.span - 1:
                break
            pos = torch.full((b, k), c + self.chain + step + 1, dtype=torch.int64, device=dev)
            mask = self.slot_mask[:, s0 : s0 + k, : s0 + k]
            hid = self.d.drafter.draft_step(tok, hid_in, pos, self.d.cache, c, s0, mask)
            tok = self._sample(hid, 1)
            hid_in = hid

    def build(self) -> None:
        t = self.select()
        for name in ("parents", "tokens", "depth", "accept", "lo", "mask"):
            getattr(self.tree, name).copy_(getattr(t, name))

    def full_tree(self) -> TreeBatch:
        raise NotImplementedError("delayed trees are not pruned (no path scores)")

    def select(self) -> TreeBatch:
        return delayed_tree(self.full_token, self.full_accept, self.full_lo, self.layout)
