"""Static (Sequoia) trees on the GPU: a fixed shape, drafted level by level.

The shape comes from the planner (planner.trees.static_shape: Sequoia's dynamic program over the
acceptance model's mean positional table), so the executor verifies exactly the tree the planner
priced. Every node of depth l that has children is drafted at step l (W_l of them); its rank-r
child takes the drafter's r-th most probable token, and, as for dynamic trees, its draft
confidence and conditional acceptance come from one bank row of the acceptance model per
drafted node (synthetic.py); with scores on (for pruning), each node's path log-prob is summed
along too (the planner's static_pool does the same) and the pruned source cuts the shape per step.
Parents, depths, the ancestor mask and all gather indices are static tensors built once
(`StaticPlan`), so a step is a fixed sequence of kernels (one CUDA graph per phase), and the
build phase has nothing to do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from spectune.executor.draws import ROOT_ID, child_id
from spectune.executor.select import Candidates
from spectune.executor.sources.base import Drafting, TreeSource
from spectune.executor.tree_build import TreeBatch
from spectune.specs import DraftTree


@dataclass
class StaticLevel:
    """Drafting step l: the W_l nodes of depth l that have children, and their children.

    nodes: int64[W_l] tree indices drafted at this step (slots slot0 .. slot0 + W_l - 1)
    from_prev: int64[W_l] position of each node's parent among the previous step's nodes
    width: children per drafted node needed at this step (max rank + 1)
    children: int64[C_l] tree indices of the children; pick: int64[C_l] = parent position *
        width + rank, the flat index into that step's [W_l, width] top-k / bank tensors;
    child_parents: int64[C_l] tree index of each child's parent (path log-probs for pruning)
    """

    nodes: torch.Tensor
    from_prev: torch.Tensor
    slot0: int
    width: int
    children: torch.Tensor
    pick: torch.Tensor
    child_parents: torch.Tensor


class StaticPlan:
    """Static indices of one tree shape (parents int[N] in breadth-first order, rank int[N])."""

    def __init__(self, parents: np.ndarray, rank: np.ndarray, device: torch.device | str):
        tree = DraftTree.from_parents(np.asarray(parents))
        self.nodes = tree.num_nodes
        self.max_depth = tree.max_depth
        depth = tree.depth
        has_kids = tree.num_children > 0
        self.levels: list[StaticLevel] = []
        slots: list[int] = []
        prev = np.zeros(0, dtype=np.int64)
        for lvl in range(self.max_depth):
            nodes = np.flatnonzero((depth == lvl) & has_kids)
            if nodes.size == 0:
                break
            pos_prev = {int(v): i for i, v in enumerate(prev)}
            from_prev = np.array(
                [pos_prev.get(int(tree.parents[v]), 0) for v in nodes], dtype=np.int64
            )
            kids = np.flatnonzero(np.isin(tree.parents, nodes) & (np.arange(self.nodes) > 0))
            width = int(rank[kids].max()) + 1
            pos_here = {int(v): i for i, v in enumerate(nodes)}
            pick = np.array(
                [pos_here[int(tree.parents[c])] * width + int(rank[c]) for c in kids],
                dtype=np.int64,
            )
            self.levels.append(StaticLevel(
                torch.tensor(nodes, device=device), torch.tensor(from_prev, device=device), len(slots),
                width, torch.tensor(kids, device=device), torch.tensor(pick, device=device),
                torch.tensor(tree.parents[kids].astype(np.int64), device=device),
            ))  # fmt: skip
            slots.extend(int(v) for v in nodes)
            prev = nodes
        self.slots = max(len(slots), 1)
        anc = tree.ancestor_matrix
        slot_mask = np.zeros((self.slots, self.slots), dtype=bool)
        if slots:
            slot_mask[: len(slots), : len(slots)] = anc[np.ix_(slots, slots)]
        self.slot_mask = torch.tensor(slot_mask, device=device)
        self.parents = torch.tensor(tree.parents.astype(np.int64), device=device)
        self.depth = torch.tensor(depth.astype(np.int64), device=device)
        self.mask = torch.tensor(anc, device=device)
        ids = torch.full((self.nodes,), ROOT_ID, dtype=torch.int64)  # rank-path hashes
        for i in range(1, self.nodes):
            ids[i] = child_id(ids[int(tree.parents[i])], int(rank[i]))
        self.ids = ids.to(device)


class StaticShape(TreeSource):
    """A fixed Sequoia tree shape (StaticPlan), drafted level by level each step into `tree`
    (`drafted` is the same tree); with `with_score` it also sums each node's path log-prob
    (TreeBatch.score: what pruning, a shared budget and grafting read)."""

    def __init__(self, drafting: Drafting, plan: StaticPlan, with_score: bool = False):
        self.d, self.plan, self.nodes = drafting, plan, plan.nodes
        b, n, dev = drafting.batch, plan.nodes, drafting.device
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        f32: dict[str, Any] = {"dtype": torch.float32, "device": dev}
        # fixed shape: parents, depths and mask never change
        self.tree = TreeBatch(
            plan.parents.expand(b, n).contiguous(),
            torch.zeros((b, n), **i64),
            plan.depth.expand(b, n).contiguous(),
            torch.ones((b, n), **f32),
            torch.zeros((b, n), **f32),
            plan.mask.expand(b, n, n).contiguous(),
            ids=plan.ids.expand(b, n).contiguous(),
        )
        self.pos = [
            torch.full((b, lv.nodes.numel()), drafting.context + i, **i64)
            for i, lv in enumerate(plan.levels)
        ]
        self.drafted = self.tree
        if with_score:
            t0 = self.tree
            self.drafted = TreeBatch(
                t0.parents.clone(), t0.tokens.clone(), t0.depth.clone(), t0.accept.clone(),
                t0.lo.clone(), t0.mask.clone(), torch.zeros((b, n), **f32), t0.ids,
            )  # fmt: skip
            self.tree = self.drafted  # one tree: the drafted shape with its path log-probs

    def draft(self) -> None:
        """The rank-r child of each drafted node takes its r-th most probable token and the r-th
        entry of the node's bank row."""
        st, d = self.plan, self.d
        b, c, dev, t, syn = d.batch, d.context, d.device, self.drafted, d.synthetic
        t.tokens[:, 0] = d.root.token
        prev = d.root.hidden[:, None]
        mask_all = st.slot_mask.expand(b, st.slots, st.slots)
        for i, lv in enumerate(st.levels):
            w = lv.nodes.numel()
            tokens = t.tokens[:, lv.nodes]
            hidden = prev[:, lv.from_prev]
            mask = mask_all[:, lv.slot0 : lv.slot0 + w, : lv.slot0 + w]
            hid = d.drafter.draft_step(tokens, hidden, self.pos[i], d.cache, c, lv.slot0, mask)
            top = d.topk_tokens(hid, lv.width)  # [B, W, width]
            if syn.draws is not None:  # common random draws by node id
                rows = syn.rows_for(i + 1, st.ids[lv.nodes].expand(b, w))
            else:
                rows = syn.draw_rows(i + 1, (b, w), dev)
            logc, acc, lo = syn.children(i + 1, rows, lv.width)
            t.tokens[:, lv.children] = top.reshape(b, -1)[:, lv.pick]
            t.accept[:, lv.children] = acc.reshape(b, -1)[:, lv.pick]
            t.lo[:, lv.children] = lo.reshape(b, -1)[:, lv.pick]
            if t.score is not None:  # path log-prob = parent's + own draft log-prob
                own = logc.reshape(b, -1)[:, lv.pick]
                t.score[:, lv.children] = t.score[:, lv.child_parents] + own
            prev = hid

    def build(self) -> None:
        """Nothing: the shape is fixed and drafting wrote its tokens."""

    def full_tree(self) -> TreeBatch:
        if self.drafted.score is None:
            raise ValueError("full_tree needs a StaticShape built with_score")
        return self.drafted

    def candidates(self) -> Candidates:
        """The drafted shape as a candidate set [B, N] (breadth-first: parents first)."""
        t = self.full_tree()
        assert t.score is not None and t.ids is not None
        return Candidates(t.parents, t.tokens, t.depth, t.accept, t.lo, t.score, t.ids)
