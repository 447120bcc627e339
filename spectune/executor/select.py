"""Choosing tree nodes from whole candidate sets on the GPU: ECHO's shared verify budget, and
grafting retrieved chains into freed slots (torch ports of planner.trees.build._choose and
planner.trees.outcome.choose_grafts).

Candidates: every node a source drafted this step, column 0 the root, parents before children
(a dynamic pool in level order, a static shape in breadth-first order), with the synthetic
conditional acceptance of each node. P(node accepted) is the product of the acceptances on its
path (what AcceptanceModel.node_accept_prob gives for the same tree).

- ECHO (`shared_keep`): one budget of `total` = B x (budget - 1) draft nodes for the whole batch
  goes to the candidates with the highest P(accepted) over every request, as the planner's
  keep_top(log P, None, total) does; candidates of P = 0 are never kept. A node's P never
  exceeds its parent's and ties go to the earlier column (stable order), so every request's
  kept set is closed under parents. A request keeps at most `row_cap` nodes (the layout's row;
  ECHO_ROW_FACTOR x budget): bounded memory for the [B, N, N] masks.
- `compact`: the kept columns of each row laid out as a TreeBatch [B, N] (kept nodes first, in
  column order; then inert placeholders, as tree_build.prune_tree lays out pruned trees).
- Grafting (`place_grafts`): up to min(free slots, graft_budget) retrieved tokens per request,
  as chains under the kept leaves with the highest P(accepted): each slot goes to the (leaf,
  chain position j) of largest P(leaf) x rho_1 x ... x rho_j, rho the request's retrieval
  acceptance row for its match length (planner.trees.outcome.choose_grafts). Chain node j takes
  the j-th token the retrieval drafter proposed for its leaf; its conditional acceptance is
  rho_j (lo 0: it is its parent's only child).
Everything is fixed-shape tensor work (no host sync, CUDA-graph safe).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.executor.draws import GRAFT_RANK, child_id
from spectune.executor.tree_build import PRUNED, TreeBatch, ancestor_mask

NEG = -1.0e30  # log of probability 0 (finite, so sums stay ordered)
ECHO_ROW_FACTOR = 4  # an ECHO request keeps at most this many times the per-request budget


@dataclass
class Candidates:
    """B candidate sets of C columns, column 0 the root, parents before children.

    parents int64[B, C] (column index, root -1); tokens, depth, ids int64[B, C]; accept, lo
    float32[B, C] (synthetic conditional acceptance; root 1, 0); score float32[B, C] (path
    draft log-prob, root 0)."""

    parents: torch.Tensor
    tokens: torch.Tensor
    depth: torch.Tensor
    accept: torch.Tensor
    lo: torch.Tensor
    score: torch.Tensor
    ids: torch.Tensor


def accept_logp(parents: torch.Tensor, accept: torch.Tensor, max_depth: int) -> torch.Tensor:
    """float64[B, C]: log P(node on the accepted path) = sum of log accept along its path (NEG
    where a node's path holds an acceptance of 0); `max_depth` gather steps up the tree."""
    acc = accept.double()
    la = torch.where(acc > 0, torch.log(acc.clamp(min=1e-300)), NEG)
    root = parents < 0
    la = torch.where(root, 0.0, la)
    lp = la
    par = parents.clamp(min=0)
    for _ in range(max_depth):
        lp = torch.where(root, 0.0, (la + torch.gather(lp, 1, par)).clamp(min=NEG))
    return lp


def _stable_rank(key: torch.Tensor) -> torch.Tensor:
    """int64 of key's shape [..., M]: position of each entry in a descending stable sort along
    the last dimension (ties: lower index first)."""
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order)
    ar = torch.arange(key.shape[-1], device=key.device).expand_as(order)
    rank.scatter_(-1, order, ar)
    return rank


def shared_keep(lp: torch.Tensor, total: int, row_cap: int) -> torch.Tensor:
    """bool[B, C]: the root of every row plus the `total` non-root columns of highest log P
    `lp` float64[B, C] over the whole batch (P > 0 only), at most row_cap - 1 per row."""
    b, c = lp.shape
    key = lp[:, 1:]
    valid = key > NEG / 2
    glob = _stable_rank(key.reshape(1, -1)).view(b, c - 1)  # row-major: earlier row, column
    row = _stable_rank(key)
    keep = torch.ones((b, c), dtype=torch.bool, device=lp.device)
    keep[:, 1:] = valid & (glob < total) & (row < row_cap - 1)
    return keep


def compact(
    cands: Candidates, keep: torch.Tensor, nodes: int, max_depth: int
) -> tuple[TreeBatch, torch.Tensor]:
    """The kept columns (keep bool[B, C], root kept, closed under parents, at most `nodes` per
    row) as trees [B, nodes]: kept nodes first in column order, then placeholders (PRUNED
    token, parent 0, depth 1, accept 0); and counts int64[B] (kept nodes, root included)."""
    b = keep.shape[0]
    dev = keep.device
    counts = keep.sum(dim=1)
    new = torch.where(keep, torch.cumsum(keep.long(), 1) - 1, nodes)  # old column -> slot
    sink = nodes + 1

    def put(src: torch.Tensor, fill: float | int) -> torch.Tensor:
        out = torch.full((b, sink), fill, dtype=src.dtype, device=dev)
        out.scatter_(1, new, src)
        return out[:, :nodes]

    par_old = torch.where(cands.parents >= 0, cands.parents, 0)
    par_new = torch.where(cands.parents >= 0, torch.gather(new, 1, par_old), -1)
    parents = put(par_new, 0)
    parents[:, 0] = -1
    tokens = put(cands.tokens, PRUNED)
    depth = put(cands.depth, 1)
    accept = put(cands.accept, 0.0)
    lo = put(cands.lo, 0.0)
    score = put(cands.score, 0.0)
    ids = put(cands.ids, 0)
    mask = ancestor_mask(parents, max_depth)
    return TreeBatch(parents, tokens, depth, accept, lo, mask, score, ids), counts


@dataclass
class GraftPlan:
    """Where one step's grafted chains go, per request: leaf int64[B, L] (tree slots of the
    L = min(graft_budget, N) kept leaves of highest P), length int64[B, L] (chain length under
    each), added int64[B] (tokens grafted)."""

    leaf: torch.Tensor
    length: torch.Tensor
    added: torch.Tensor


def best_leaves(
    tree: TreeBatch, counts: torch.Tensor, lp: torch.Tensor, n_leaves: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(leaf slots int64[B, L], their log P float64[B, L], NEG where fewer leaves exist): the
    kept nodes without a kept child, highest P(accepted) first (ties: lower slot)."""
    b, n = tree.parents.shape
    dev = tree.parents.device
    slot = torch.arange(n, device=dev).expand(b, n)
    live = slot < counts[:, None]
    has_child = torch.zeros((b, n + 1), dtype=torch.bool, device=dev)
    child_of = torch.where(live & (tree.parents >= 0), tree.parents, n)
    has_child.scatter_(1, child_of, True)
    is_leaf = live & ~has_child[:, :n]
    key = torch.where(is_leaf, lp, 2 * NEG)
    order = torch.sort(key, dim=1, descending=True, stable=True).indices[:, :n_leaves]
    return order, torch.where(torch.gather(is_leaf, 1, order), torch.gather(lp, 1, order), NEG)


def place_grafts(
    leaf_lp: torch.Tensor, rho: torch.Tensor, slots: torch.Tensor, graft_budget: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(length int64[B, L] of the chain under each leaf, added int64[B]): the min(slots[b],
    graft_budget) (leaf, position) pairs of largest gain P(leaf) x prod(rho[:j+1]) > 0.

    leaf_lp: float64[B, L] log P of the leaves (NEG: no leaf); rho: float32[B, G] per-request
    chain acceptances (0 past the match); slots: int64[B] free verify slots."""
    b, nl = leaf_lp.shape
    g = rho.shape[1]
    cum = torch.cumprod(rho.double(), dim=1)  # [B, G]
    gain = torch.exp(leaf_lp)[:, :, None] * cum[:, None, :]  # [B, L, G]
    flat = gain.reshape(b, nl * g)
    rank = _stable_rank(flat)  # ties: earlier leaf, earlier position
    allow = slots.clamp(min=0, max=graft_budget)
    chosen = (rank < allow[:, None]) & (flat > 0)
    length = chosen.view(b, nl, g).sum(dim=2)
    return length, length.sum(dim=1)


def attach_chains(
    tree: TreeBatch,
    counts: torch.Tensor,
    leaf: torch.Tensor,
    length: torch.Tensor,
    chain_tokens: torch.Tensor,
    rho: torch.Tensor,
    max_depth: int,
) -> tuple[TreeBatch, torch.Tensor]:
    """Trees [B, N] with each leaf[b, l]'s chain of length[b, l] appended after the counts[b]
    kept nodes (chains in leaf order; slots must suffice: counts + sum(length) <= N).

    chain_tokens: int64[B, L, G] the retrieved continuation of each leaf; rho: float32[B, G]
    the chain positions' conditional acceptances. Returns the new trees and counts."""
    b, n = tree.parents.shape
    nl, g = chain_tokens.shape[1], chain_tokens.shape[2]
    dev = tree.parents.device
    j = torch.arange(g, device=dev)
    on = j[None, None, :] < length[:, :, None]  # [B, L, G]
    start = counts[:, None] + torch.cumsum(length, 1) - length  # first slot of each chain
    dest = torch.where(on, start[:, :, None] + j, n).reshape(b, nl * g)
    leaf3 = leaf[:, :, None].expand(b, nl, g)
    parent = torch.where(j == 0, leaf3, start[:, :, None] + j - 1).reshape(b, nl * g)
    leaf_depth = torch.gather(tree.depth, 1, leaf)
    depth = (leaf_depth[:, :, None] + j + 1).reshape(b, nl * g)
    acc = rho[:, None, :].expand(b, nl, g).reshape(b, nl * g).to(tree.accept.dtype)
    ids = None
    if tree.ids is not None:
        leaf_id = torch.gather(tree.ids, 1, leaf)[:, :, None].expand(b, nl, g)
        ids_new = child_id(leaf_id, GRAFT_RANK + j).reshape(b, nl * g)

    def put(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
        out = torch.cat((old, old[:, :1]), dim=1).clone()
        out.scatter_(1, dest, new.to(old.dtype))
        return out[:, :n]

    parents = put(tree.parents, parent)
    tokens = put(tree.tokens, chain_tokens.reshape(b, nl * g))
    depth_t = put(tree.depth, depth)
    accept = put(tree.accept, acc)
    lo = put(tree.lo, torch.zeros_like(acc))
    score = tree.score
    if score is not None:
        score = put(score, torch.zeros_like(acc))
    if tree.ids is not None:
        ids = put(tree.ids, ids_new)
    mask = ancestor_mask(parents, max_depth)
    return TreeBatch(parents, tokens, depth_t, accept, lo, mask, score, ids), counts + length.sum(1)
