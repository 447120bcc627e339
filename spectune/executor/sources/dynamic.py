"""Dynamic top-k trees (EAGLE-2): draft a candidate pool level by level, keep the best nodes.

Draft (depth d, top-k k, per sequence): one drafter step over the root gives its k children
(pool level 1); each later level drafts the k-node frontier (the k best nodes of the level
above by path draft log-prob) and adds its k*k children, so the pool holds
P = k + (d-1) * k * k entries. Each drafted node draws its children's draft confidences and
conditional acceptances from the acceptance model's candidate bank (synthetic.py).
Build: tree_build.select_tree keeps the N-1 best pool entries (global rerank) and lays them out
as trees, as the planner's numpy builder does.

The drafter attends through a slot mask: draft slot s (slot 0 the root, then k per level) sees
the prefix and the slots on its own path; the mask bool[B, slots, slots] is grown on the device
level by level (no host sync).
"""

from __future__ import annotations

from typing import Any

import torch

from spectune.executor.draws import ROOT_ID, child_id
from spectune.executor.select import Candidates
from spectune.executor.sources.base import Drafting, TreeSource
from spectune.executor.tree_build import TreeBatch, pool_levels, pool_size, select_tree, stable_topk


class DynamicTopK(TreeSource):
    """EAGLE-2 dynamic top-k trees of `nodes` slots (tree_build.tree_size) from a depth x topk
    pool. Pool: token / parent int64[B, P] (parent: pool index, -1 the root), score float32[B, P]
    (path draft log-prob), accept / lo float32[B, P] (synthetic acceptance), level int64[P],
    id int64[B, P] (node ids of the common random draws: hashes of the rank path)."""

    def __init__(self, drafting: Drafting, depth: int, topk: int, nodes: int):
        self.d, self.depth, self.topk, self.nodes = drafting, depth, topk, nodes
        b, p, dev = drafting.batch, pool_size(depth, topk), drafting.device
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        f32: dict[str, Any] = {"dtype": torch.float32, "device": dev}
        self.pool_token = torch.zeros((b, p), **i64)
        self.pool_parent = torch.full((b, p), -1, **i64)
        self.pool_score = torch.zeros((b, p), **f32)
        self.pool_accept = torch.zeros((b, p), **f32)
        self.pool_lo = torch.zeros((b, p), **f32)
        self.pool_level = torch.tensor(pool_levels(depth, topk), **i64)
        self.pool_id = torch.zeros((b, p), **i64)
        ranks = torch.arange(topk, **i64)
        self.root_id = torch.full((b, 1), ROOT_ID, **i64)
        self.first_ids = child_id(self.root_id, ranks)  # [B, k]: the root's children
        self.ranks = ranks
        self.slots = 1 + (depth - 1) * topk
        self.slot_mask = torch.zeros((b, self.slots, self.slots), dtype=torch.bool, device=dev)
        self.true = torch.ones((), dtype=torch.bool, device=dev)
        self.tree = self.select(with_score=True)  # scores: what grafting ranks leaves by

    def draft(self) -> None:
        d, k, b, c = self.depth, self.topk, self.d.batch, self.d.context
        dev, syn, root = self.d.device, self.d.synthetic, self.d.root
        ones = torch.ones((b, 1, 1), dtype=torch.bool, device=dev)
        pos = torch.full((b, 1), c, dtype=torch.int64, device=dev)
        hid = self.d.drafter.draft_step(
            root.token[:, None], root.hidden[:, None], pos, self.d.cache, c, 0, ones
        )
        tok = self.d.topk_tokens(hid, k)  # [B, 1, k]
        logc, acc, lo = syn.children(1, self.rows(1, self.root_id), k)
        self.pool_token[:, :k] = tok[:, 0]
        self.pool_id[:, :k] = self.first_ids
        self.pool_parent[:, :k] = -1
        self.pool_score[:, :k] = logc[:, 0]
        self.pool_accept[:, :k] = acc[:, 0]
        self.pool_lo[:, :k] = lo[:, 0]
        sm = self.slot_mask
        sm.zero_()
        sm[:, :, 0] = True  # every slot descends from the root; level-1 slots 1..k: root + self
        sm[:, 0, 0] = True
        if d > 1:
            idx = torch.arange(1, 1 + k, device=dev)
            sm[:, idx, idx] = self.true  # a device scalar: no host copy under graph capture
        frontier = torch.arange(k, device=dev).expand(b, k)
        fr_hidden = hid.expand(b, k, hid.shape[-1])
        for level in range(1, d):
            slot0 = 1 + (level - 1) * k
            tokens = torch.gather(self.pool_token, 1, frontier)
            pos = torch.full((b, k), c + level, dtype=torch.int64, device=dev)
            mask = sm[:, slot0 : slot0 + k, : slot0 + k]
            hid = self.d.drafter.draft_step(tokens, fr_hidden, pos, self.d.cache, c, slot0, mask)
            ctok = self.d.topk_tokens(hid, k)  # [B, k, k]
            fr_id = torch.gather(self.pool_id, 1, frontier)  # [B, k]
            logc, acc, lo = syn.children(level + 1, self.rows(level + 1, fr_id), k)
            score = torch.gather(self.pool_score, 1, frontier)[:, :, None] + logc
            base = k + (level - 1) * k * k
            span = slice(base, base + k * k)
            self.pool_token[:, span] = ctok.reshape(b, k * k)
            self.pool_parent[:, span] = frontier[:, :, None].expand(b, k, k).reshape(b, k * k)
            self.pool_score[:, span] = score.reshape(b, k * k)
            self.pool_accept[:, span] = acc.reshape(b, k * k)
            self.pool_lo[:, span] = lo.reshape(b, k * k)
            self.pool_id[:, span] = child_id(fr_id[:, :, None], self.ranks).reshape(b, k * k)
            if level < d - 1:
                sel = stable_topk(score.reshape(b, k * k), k)  # [B, k]
                frontier = base + sel
                j = sel // k
                fr_hidden = torch.gather(hid, 1, j[:, :, None].expand(b, k, hid.shape[-1]))
                new = slot0 + k + torch.arange(k, device=dev)
                rows = torch.gather(sm, 1, (slot0 + j)[:, :, None].expand(b, k, self.slots))
                rows[:, torch.arange(k, device=dev), new] = self.true
                sm[:, new] = rows

    def rows(self, level: int, ids: torch.Tensor) -> torch.Tensor:
        """Bank rows of the drafted nodes `ids` [B, W]: common random draws when the
        synthetic acceptance has them, else the global generator."""
        syn = self.d.synthetic
        if syn.draws is not None:
            return syn.rows_for(level, ids)
        return syn.draw_rows(level, tuple(ids.shape), self.d.device)

    def build(self) -> None:
        t = self.select(with_score=True)
        for name in ("parents", "tokens", "depth", "accept", "lo", "mask", "score", "ids"):
            getattr(self.tree, name).copy_(getattr(t, name))

    def candidates(self) -> Candidates:
        """The root and the whole drafted pool as a candidate set [B, 1 + P] (pool entry i at
        column i + 1)."""
        b = self.d.batch
        dev = self.d.device
        minus1 = torch.full((b, 1), -1, dtype=torch.int64, device=dev)
        zero_i = torch.zeros((b, 1), dtype=torch.int64, device=dev)
        one_f = torch.ones((b, 1), dtype=torch.float32, device=dev)
        par = torch.where(self.pool_parent >= 0, self.pool_parent + 1, 0)
        return Candidates(
            parents=torch.cat((minus1, par), 1),
            tokens=torch.cat((self.d.root.token[:, None], self.pool_token), 1),
            depth=torch.cat((zero_i, self.pool_level.expand(b, -1)), 1),
            accept=torch.cat((one_f, self.pool_accept), 1),
            lo=torch.cat((one_f * 0, self.pool_lo), 1),
            score=torch.cat((one_f * 0, self.pool_score), 1),
            ids=torch.cat((self.root_id, self.pool_id), 1),
        )

    def full_tree(self) -> TreeBatch:
        return self.select(with_score=True)

    def select(self, with_score: bool = False) -> TreeBatch:
        """This step's tree from the drafted pool (tree_build.select_tree), as fresh tensors."""
        return select_tree(
            self.pool_token,
            self.pool_parent,
            self.pool_score,
            self.pool_accept,
            self.pool_lo,
            self.pool_level,
            self.d.root.token,
            self.nodes,
            self.depth,
            with_score=with_score,
            pool_id=self.pool_id,
        )
