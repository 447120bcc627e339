"""Tree verification: which draft path the target accepts, and the bonus token.

The greedy and target-only rules are one walk down the tree with one target token per node
(the rules of specs.tree.VERIFY_RULES on probability rows are `verify_rule`, below):
- greedy: the target token of node i is argmax(logits[i]);
- stochastic (lossless, target-only rule for deterministic top-k drafts): the target token of
  node i is one sample from softmax(logits[i] / T). From the root, move to the child whose token
  equals the current node's target token (the lowest-index one if several do), else stop; the
  emitted tokens are the accepted draft tokens plus the stopping node's target token, so every
  emitted token is a target sample given its prefix and the output distribution is the target's.

Kernels:
- `sample_target` (sampling.py): the target token of every node from logits in one read, by
  fused argmax or Gumbel-max with counter-based Philox noise; no probability tensor.
- `_tree_walk_kernel`: BLOCK_B sequences per program, each tree held in registers as
  [BLOCK_B, BLOCK_N] tiles of parents / tokens / target tokens; a step is two masked reductions,
  the loop ends when every sequence in the program has stopped (max depth + 1 steps).

Outputs (VerifyResult), P = path width (>= max depth + 1):
    accepted_nodes: int32[B, P]  local node indices root first (path[0] == 0), -1 padded
    num_accepted:   int32[B]     accepted DRAFT nodes (path length - 1)
    next_token:     int64[B]     the bonus token (target token of the last accepted node)
    emitted_tokens: int64[B, P]  accepted draft tokens then the bonus token (num_accepted + 1
                                 entries), -1 padded
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from spectune.kernels.layout import PackedTrees, pack_trees, random_trees
from spectune.kernels.sampling import reference_sample_target, sample_target

__all__ = [
    "VerifyInputs",
    "VerifyResult",
    "make_verify_inputs",
    "reference_sample_target",
    "reference_walk_tree",
    "sample_target",
    "tree_links",
    "verify_greedy",
    "verify_rule",
    "verify_stochastic",
    "walk_tree",
]

_BIG = tl.constexpr(1 << 30)  # "no child" sentinel inside the walk kernel


@dataclass(frozen=True)
class VerifyResult:
    accepted_nodes: torch.Tensor  # int32[B, P]
    num_accepted: torch.Tensor  # int32[B]
    next_token: torch.Tensor  # int64[B]
    emitted_tokens: torch.Tensor  # int64[B, P]


@triton.jit
def _tree_walk_kernel(
    TOKENS, PARENTS, TARGET, QO_INDPTR, PATH, NUM_ACC, NEXT, EMIT, batch, path_width,
    BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_P: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    b = pid * BLOCK_B + tl.arange(0, BLOCK_B)
    b_ok = b < batch
    start = tl.load(QO_INDPTR + b, mask=b_ok, other=0)
    n = tl.load(QO_INDPTR + b + 1, mask=b_ok, other=0) - start
    j = tl.arange(0, BLOCK_N)
    node_ok = j[None, :] < n[:, None]
    offs = start[:, None] + j[None, :]
    par = tl.load(PARENTS + offs, mask=node_ok, other=-2)
    tok = tl.load(TOKENS + offs, mask=node_ok, other=-1)
    tgt = tl.load(TARGET + offs, mask=node_ok, other=-1)
    pcol = tl.arange(0, BLOCK_P)

    cur = tl.zeros([BLOCK_B], dtype=tl.int32)
    count = tl.zeros([BLOCK_B], dtype=tl.int32)
    active = n > 0
    path = tl.where((pcol[None, :] == 0) & active[:, None], 0, -1)
    emit = tl.full([BLOCK_B, BLOCK_P], -1, dtype=tl.int64)
    t_cur = tl.sum(tl.where(j[None, :] == 0, tgt, 0), 1)  # target token at the root
    while tl.max(active.to(tl.int32), 0) > 0:
        match = (par == cur[:, None]) & (tok == t_cur[:, None]) & node_ok
        nxt = tl.min(tl.where(match, j[None, :], _BIG), 1)
        found = active & (nxt < _BIG)
        # accepted draft token count -> emitted slot `count`; its path slot is count + 1
        emit = tl.where(found[:, None] & (pcol[None, :] == count[:, None]), t_cur[:, None], emit)
        count = count + found.to(tl.int32)
        path = tl.where(found[:, None] & (pcol[None, :] == count[:, None]), nxt[:, None], path)
        cur = tl.where(found, nxt, cur)
        t_cur = tl.sum(tl.where(j[None, :] == cur[:, None], tgt, 0), 1)
        active = found
    # bonus token: the target token of the last accepted node
    live = n > 0
    emit = tl.where(live[:, None] & (pcol[None, :] == count[:, None]), t_cur[:, None], emit)
    out_ok = b_ok[:, None] & (pcol[None, :] < path_width)
    out_offs = b.to(tl.int64)[:, None] * path_width + pcol[None, :]
    tl.store(PATH + out_offs, path, mask=out_ok)
    tl.store(EMIT + out_offs, emit, mask=out_ok)
    tl.store(NUM_ACC + b, count, mask=b_ok)
    tl.store(NEXT + b, tl.where(live, t_cur, -1), mask=b_ok)


def walk_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    qo_indptr: torch.Tensor,
    target_tokens: torch.Tensor,
    *,
    max_nodes: int | None = None,
    block_b: int | None = None,
) -> VerifyResult:
    """Accept the longest root path whose tokens equal the target token of their parent.

    tokens: int64[total_q]; parents: int32[total_q] (local, root -1); qo_indptr: int32[B+1];
    target_tokens: int64[total_q] (argmax or sampled target token of each node).
    max_nodes: host bound of N_b (also the path width P); pass it to avoid a device sync.
    """
    if tokens.dtype != torch.int64 or target_tokens.dtype != torch.int64:
        raise ValueError("tokens and target_tokens must be int64")
    if parents.dtype != torch.int32 or qo_indptr.dtype != torch.int32:
        raise ValueError("parents and qo_indptr must be int32")
    if not (tokens.shape == parents.shape == target_tokens.shape) or tokens.dim() != 1:
        raise ValueError("tokens, parents, target_tokens must be 1-D of one length")
    for t in (tokens, parents, target_tokens, qo_indptr):
        if not t.is_contiguous():
            raise ValueError("walk_tree needs contiguous inputs")
    batch = qo_indptr.numel() - 1
    if max_nodes is None:
        max_nodes = int((qo_indptr[1:] - qo_indptr[:-1]).max().item()) if batch > 0 else 1
    width = max(1, max_nodes)
    dev = tokens.device
    res = VerifyResult(
        accepted_nodes=torch.empty((batch, width), dtype=torch.int32, device=dev),
        num_accepted=torch.empty(batch, dtype=torch.int32, device=dev),
        next_token=torch.empty(batch, dtype=torch.int64, device=dev),
        emitted_tokens=torch.empty((batch, width), dtype=torch.int64, device=dev),
    )
    if batch == 0:
        return res
    block_n = max(16, triton.next_power_of_2(width))
    if block_b is None:
        block_b = 4 if dev.type == "cuda" else 4096
    block_b = max(1, min(block_b, triton.next_power_of_2(batch)))
    _tree_walk_kernel[(triton.cdiv(batch, block_b),)](
        tokens, parents, target_tokens, qo_indptr, res.accepted_nodes, res.num_accepted,
        res.next_token, res.emitted_tokens, batch, width,
        BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_P=block_n, num_warps=4,
    )  # fmt: skip
    return res


def verify_greedy(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    qo_indptr: torch.Tensor,
    *,
    target_tokens: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    max_nodes: int | None = None,
) -> VerifyResult:
    """Greedy verification from the target's argmax tokens (int64[total_q]) or its logits
    ([total_q, vocab], argmax fused in `_sample_kernel`)."""
    if (target_tokens is None) == (logits is None):
        raise ValueError("pass exactly one of target_tokens and logits")
    if target_tokens is None:
        assert logits is not None
        target_tokens = sample_target(logits, 0.0)
    return walk_tree(tokens, parents, qo_indptr, target_tokens, max_nodes=max_nodes)


def verify_stochastic(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    qo_indptr: torch.Tensor,
    logits: torch.Tensor,
    temperature: float,
    seed: int,
    *,
    max_nodes: int | None = None,
) -> VerifyResult:
    """Lossless verification at `temperature` (> 0; 0 falls back to greedy): one Gumbel-max
    target sample per node, then the walk. logits: [total_q, vocab]."""
    target = sample_target(logits, temperature, seed)
    return walk_tree(tokens, parents, qo_indptr, target, max_nodes=max_nodes)


def reference_walk_tree(
    tokens: torch.Tensor,
    parents: torch.Tensor,
    qo_indptr: torch.Tensor,
    target_tokens: torch.Tensor,
    path_width: int | None = None,
) -> VerifyResult:
    """Plain Python walk, one sequence at a time (same outputs as walk_tree)."""
    tok = tokens.cpu().numpy()
    par = parents.cpu().numpy()
    tgt = target_tokens.cpu().numpy()
    ptr = qo_indptr.cpu().numpy()
    batch = ptr.size - 1
    width = path_width or max(1, int(np.diff(ptr).max()) if batch else 1)
    path = np.full((batch, width), -1, dtype=np.int32)
    emit = np.full((batch, width), -1, dtype=np.int64)
    count = np.zeros(batch, dtype=np.int32)
    nxt = np.full(batch, -1, dtype=np.int64)
    for b in range(batch):
        s, e = int(ptr[b]), int(ptr[b + 1])
        if e == s:
            continue
        cur, k = 0, 0
        path[b, 0] = 0
        while True:
            want = tgt[s + cur]
            kids = [i for i in range(e - s) if par[s + i] == cur and tok[s + i] == want]
            if not kids:
                break
            emit[b, k] = want
            k += 1
            cur = kids[0]
            path[b, k] = cur
        emit[b, k] = tgt[s + cur]
        count[b], nxt[b] = k, tgt[s + cur]
    return VerifyResult(
        torch.from_numpy(path),
        torch.from_numpy(count),
        torch.from_numpy(nxt),
        torch.from_numpy(emit),
    )


@dataclass
class VerifyInputs:
    tokens: torch.Tensor  # int64[total_q]
    parents: torch.Tensor  # int32[total_q]
    qo_indptr: torch.Tensor  # int32[B+1]
    logits: torch.Tensor  # [total_q, vocab]
    target_tokens: torch.Tensor  # int64[total_q], argmax of logits
    packed: PackedTrees


def make_verify_inputs(
    tree_sizes: list[int],
    vocab: int = 32,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    max_depth: int = 16,
    match_prob: float = 0.9,
) -> VerifyInputs:
    """Seeded random trees whose draft tokens often equal the target's argmax (so paths are long):
    each node's logits peak, with probability `match_prob`, at the token of one of its children."""
    rng = np.random.default_rng(seed)
    trees = random_trees(rng, tree_sizes, max_depth=max_depth, vocab=vocab)
    packed = pack_trees(trees, device)
    total = int(packed.qo_indptr[-1].item())
    logits = rng.standard_normal((total, vocab)).astype(np.float32)
    row = 0
    for t in trees:
        for i in range(t.num_nodes):
            kids = np.flatnonzero(t.parents == i)
            if kids.size and rng.random() < match_prob:
                logits[row + i, int(t.tokens[rng.choice(kids)])] += 6.0
        row += t.num_nodes
    lg = torch.from_numpy(logits).to(dtype).to(device)
    return VerifyInputs(
        tokens=packed.tokens,
        parents=packed.parents,
        qo_indptr=packed.qo_indptr,
        logits=lg,
        target_tokens=lg.float().argmax(1),
        packed=packed,
    )


# ---- verification rules on probability rows (specs.tree.VERIFY_RULES) --------------------------
# Inputs shared by the rule kernels, for B trees packed by qo_indptr (local node indices):
#   TOK int64[total_q], PAR / FC / NS int32[total_q]: token, parent, first child, next sibling
#   P float32[total_q, V]: the target's distribution after each node
#   Q float32[total_q, V]: the distribution each node's token was drawn from (one-hot for top-k
#     drafts; the parent's draft row for i.i.d. drafts); root row unused
# Outputs: ACC int32[B] (local accepted node), BONUS int64[B]. Each row of a program runs its own
# state machine (one event per loop trip); every V-wide row operation loops over the vocabulary
# in BLOCK_V tiles (a residual is two passes: its sum, then the normalised row; a draw is two:
# the total, then a running prefix sum), so V is unbounded (real vocabularies: 128k-152k).
# Bytes: each event reads/writes O(1) rows of V floats (SpecTr: 2 rows x (BISECT + 3) passes,
# from L2 at these sizes), so a tree costs O(N * V * 4) bytes, the order of reading its target
# rows once. Uniforms: Philox tl.rand(seed, row * _STRIDE + trip), distinct per (row, trip).

RULE_TILE = 4096
"""Vocabulary tile of the rule kernels (floats per row per pass)."""
_STRIDE = tl.constexpr(1 << 12)


@triton.jit
def _draw_stored(X, base, live, u, V, BLOCK_V: tl.constexpr):
    """Index drawn from the unnormalised rows X[base : base + V] (base int64[BLOCK_B]) of the
    `live` program rows with uniforms u, tile by tile: the total, then the count of positions
    whose running prefix sum stays <= u * total, capped at V - 1."""
    v = tl.arange(0, BLOCK_V)
    total = u * 0.0
    for v0 in range(0, V, BLOCK_V):
        m = live[:, None] & ((v0 + v)[None, :] < V)
        total += tl.sum(tl.load(X + base[:, None] + v0 + v[None, :], mask=m, other=0.0), 1)
    thr = u * total
    run = u * 0.0
    count = (u * 0.0).to(tl.int32)
    for v0 in range(0, V, BLOCK_V):
        vm = (v0 + v)[None, :] < V
        row = tl.load(X + base[:, None] + v0 + v[None, :], mask=live[:, None] & vm, other=0.0)
        cum = run[:, None] + tl.cumsum(row, 1)
        count += tl.sum(((cum <= thr[:, None]) & vm).to(tl.int32), 1)
        run += tl.sum(row, 1)
    return tl.minimum(count, V - 1)


@triton.jit
def _traversal_kernel(
    TOK, PAR, FC, NS, QO_INDPTR, P, Q, T, MASS, ACC, BONUS, batch, V, seed,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = b < batch
    start = tl.load(QO_INDPTR + b, mask=ok, other=0)
    n = tl.load(QO_INDPTR + b + 1, mask=ok, other=0) - start
    v = tl.arange(0, BLOCK_V)
    live = ok & (n > 0)
    base0 = start.to(tl.int64)[:, None] * V + v[None, :]
    for v0 in range(0, V, BLOCK_V):
        m = live[:, None] & ((v0 + v)[None, :] < V)
        tl.store(T + base0 + v0, tl.load(P + base0 + v0, mask=m, other=0.0), mask=m)
    tl.store(MASS + start, tl.full([BLOCK_B], 1.0, tl.float32), mask=live)
    fc0 = tl.load(FC + start, mask=live, other=-1)
    cur = tl.where(fc0 >= 0, fc0, 0)
    mode = tl.where(fc0 >= 0, 0, 1)  # 0: enter cur, 1: leave cur
    acc = tl.zeros([BLOCK_B], dtype=tl.int32)
    trip = 0
    tl.debug_barrier()
    while tl.max(live.to(tl.int32), 0) > 0:
        g = (start + cur).to(tl.int64)
        par = tl.load(PAR + g, mask=live, other=0)
        gp = (start + tl.maximum(par, 0)).to(tl.int64)
        x = tl.load(TOK + g, mask=live, other=0)
        ent = live & (mode == 0)
        t_x = tl.load(T + gp * V + x, mask=ent, other=0.0)
        q_x = tl.load(Q + g * V + x, mask=ent, other=1.0)
        w = tl.minimum(t_x / tl.maximum(q_x, 1e-30), 1.0)
        rg = g[:, None] * V + v[None, :]
        for v0 in range(0, V, BLOCK_V):
            em = ent[:, None] & ((v0 + v)[None, :] < V)
            prow = tl.load(P + rg + v0, mask=em, other=0.0)
            tl.store(T + rg + v0, w[:, None] * prow, mask=em)
        tl.store(MASS + g, w, mask=ent)
        fc = tl.load(FC + g, mask=ent, other=-1)
        lv = live & (mode == 1)
        m = tl.load(MASS + g, mask=lv, other=0.0)
        u = tl.rand(seed, b * _STRIDE + trip)
        take = lv & ((u < m) | (cur == 0))
        acc = tl.where(take, cur, acc)
        rej = lv & ~take
        rp = gp[:, None] * V + v[None, :]
        r = u * 0.0
        for v0 in range(0, V, BLOCK_V):
            rm = rej[:, None] & ((v0 + v)[None, :] < V)
            tb = tl.load(T + rp + v0, mask=rm, other=0.0)
            qc = tl.load(Q + rg + v0, mask=rm, other=0.0)
            r += tl.sum(tl.maximum(tb - qc, 0.0), 1)
        mb = tl.load(MASS + gp, mask=rej, other=0.0)
        denom = 1.0 - mb + r
        okd = rej & (denom > 0)
        sd = tl.where(okd, denom, 1.0)
        for v0 in range(0, V, BLOCK_V):
            om = okd[:, None] & ((v0 + v)[None, :] < V)
            tb = tl.load(T + rp + v0, mask=om, other=0.0)
            qc = tl.load(Q + rg + v0, mask=om, other=0.0)
            tl.store(T + rp + v0, tl.maximum(tb - qc, 0.0) / sd[:, None], mask=om)
        tl.store(MASS + gp, r / sd, mask=okd)
        ns = tl.load(NS + g, mask=rej, other=-1)
        nxt_ent = tl.where(fc >= 0, fc, cur)
        mode_ent = tl.where(fc >= 0, 0, 1)
        nxt_lv = tl.where(ns >= 0, ns, par)
        mode_lv = tl.where(ns >= 0, 0, 1)
        cur = tl.where(ent, nxt_ent, tl.where(rej, nxt_lv, cur))
        mode = tl.where(ent, mode_ent, tl.where(rej, mode_lv, mode))
        live = live & ~take
        trip += 1
        tl.debug_barrier()
    fin = ok & (n > 0)
    ga = (start + acc).to(tl.int64) * V
    bonus = _draw_stored(T, ga, fin, tl.rand(seed + 1, b), V, BLOCK_V)
    tl.store(ACC + b, acc, mask=ok)
    tl.store(BONUS + b, bonus.to(tl.int64), mask=ok)


@triton.jit
def _token_rule_kernel(
    TOK, FC, NS, QO_INDPTR, P, Q, R, ACC, BONUS, batch, V, seed,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = b < batch
    start = tl.load(QO_INDPTR + b, mask=ok, other=0)
    n = tl.load(QO_INDPTR + b + 1, mask=ok, other=0) - start
    v = tl.arange(0, BLOCK_V)
    live = ok & (n > 0)
    rb = b.to(tl.int64) * V
    rrow = rb[:, None] + v[None, :]
    row0 = start.to(tl.int64)[:, None] * V + v[None, :]
    for v0 in range(0, V, BLOCK_V):
        m = live[:, None] & ((v0 + v)[None, :] < V)
        tl.store(R + rrow + v0, tl.load(P + row0 + v0, mask=m, other=0.0), mask=m)
    c = tl.load(FC + start, mask=live, other=-1)
    cur = tl.zeros([BLOCK_B], dtype=tl.int32)
    trip = 0
    tl.debug_barrier()
    while tl.max((live & (c >= 0)).to(tl.int32), 0) > 0:
        tr = live & (c >= 0)
        g = (start + tl.maximum(c, 0)).to(tl.int64)
        x = tl.load(TOK + g, mask=tr, other=0)
        q_x = tl.load(Q + g * V + x, mask=tr, other=1.0)
        r_x = tl.load(R + rb + x, mask=tr, other=0.0)
        u = tl.rand(seed, b * _STRIDE + trip)
        take = tr & (u < tl.minimum(r_x / tl.maximum(q_x, 1e-30), 1.0))
        rg = g[:, None] * V + v[None, :]
        s = u * 0.0
        for v0 in range(0, V, BLOCK_V):
            tm = tr[:, None] & ((v0 + v)[None, :] < V)
            res = tl.load(R + rrow + v0, mask=tm, other=0.0) - tl.load(
                Q + rg + v0, mask=tm, other=0.0
            )
            s += tl.sum(tl.maximum(res, 0.0), 1)
        sd = tl.where(s > 0, s, 1.0)
        for v0 in range(0, V, BLOCK_V):
            vm = (v0 + v)[None, :] < V
            tm = tr[:, None] & vm
            res = tl.maximum(
                tl.load(R + rrow + v0, mask=tm, other=0.0)
                - tl.load(Q + rg + v0, mask=tm, other=0.0),
                0.0,
            )
            prow = tl.load(P + rg + v0, mask=take[:, None] & vm, other=0.0)
            tl.store(R + rrow + v0, tl.where(take[:, None], prow, res / sd[:, None]), mask=tm)
        fc = tl.load(FC + g, mask=take, other=-1)
        ns = tl.load(NS + g, mask=tr & ~take, other=-1)
        cur = tl.where(take, c, cur)
        c = tl.where(take, fc, tl.where(tr, ns, c))
        trip += 1
        tl.debug_barrier()
    bonus = _draw_stored(R, rb, live, tl.rand(seed + 1, b), V, BLOCK_V)
    tl.store(ACC + b, cur, mask=ok)
    tl.store(BONUS + b, bonus.to(tl.int64), mask=ok)


@triton.jit
def _overlap(P, Q, pg, qg, rows, hasq, inv, V, BLOCK_V: tl.constexpr):
    """sum_v min(Q[qg + v], P[pg + v] * inv) per program row (float32[BLOCK_B]): the overlap
    beta(rho) of SpecTr at inv = 1 / rho, tile by tile; Q rows only where `hasq`."""
    v = tl.arange(0, BLOCK_V)
    out = inv * 0.0
    for v0 in range(0, V, BLOCK_V):
        vm = rows[:, None] & ((v0 + v)[None, :] < V)
        prow = tl.load(P + pg[:, None] + v0 + v[None, :], mask=vm, other=0.0)
        qrow = tl.load(Q + qg[:, None] + v0 + v[None, :], mask=vm & hasq[:, None], other=0.0)
        out += tl.sum(tl.minimum(qrow, prow * inv[:, None]), 1)
    return out


@triton.jit
def _spectr_kernel(
    TOK, FC, NS, NK, QO_INDPTR, P, Q, ACC, BONUS, batch, V, seed,
    BLOCK_B: tl.constexpr, BLOCK_V: tl.constexpr, BISECT: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    ok = b < batch
    start = tl.load(QO_INDPTR + b, mask=ok, other=0)
    n = tl.load(QO_INDPTR + b + 1, mask=ok, other=0) - start
    v = tl.arange(0, BLOCK_V)
    live = ok & (n > 0)
    cur = tl.zeros([BLOCK_B], dtype=tl.int32)
    bonus = tl.zeros([BLOCK_B], dtype=tl.int32)
    trip = 0
    while tl.max(live.to(tl.int32), 0) > 0:
        g = (start + cur).to(tl.int64)
        c0 = tl.load(FC + g, mask=live, other=-1)
        k = tl.load(NK + g, mask=live, other=0).to(tl.float32)
        hasc = c0 >= 0
        gc0 = (start + tl.maximum(c0, 0)).to(tl.int64)
        pg = g * V
        qg = gc0 * V
        one = tl.full([BLOCK_B], 1.0, tl.float32)
        # rho: the least in [1, k] with rho * beta >= 1 - (1 - beta)^k (bisection)
        lo = one
        hi = tl.maximum(k, 1.0)
        beta1 = _overlap(P, Q, pg, qg, live, hasc, one, V, BLOCK_V)
        ok1 = beta1 - (1.0 - tl.exp(k * tl.log(tl.maximum(1.0 - beta1, 1e-30)))) >= 0
        for _ in tl.static_range(BISECT):
            mid = 0.5 * (lo + hi)
            bm = _overlap(P, Q, pg, qg, live & ~ok1, hasc, 1.0 / mid, V, BLOCK_V)
            up = mid * bm - (1.0 - tl.exp(k * tl.log(tl.maximum(1.0 - bm, 1e-30)))) >= 0
            hi = tl.where(up, mid, hi)
            lo = tl.where(up, lo, mid)
        rho = tl.where(ok1, 1.0, hi)
        beta = _overlap(P, Q, pg, qg, live, hasc, 1.0 / rho, V, BLOCK_V)
        # try the children in index order
        c = c0
        moved = tl.zeros([BLOCK_B], dtype=tl.int32) > 0
        tr = live & (c >= 0)
        while tl.max(tr.to(tl.int32), 0) > 0:
            gcc = (start + tl.maximum(c, 0)).to(tl.int64)
            x = tl.load(TOK + gcc, mask=tr, other=0)
            p_x = tl.load(P + g * V + x, mask=tr, other=0.0)
            q_x = tl.load(Q + gcc * V + x, mask=tr, other=1.0)
            u = tl.rand(seed, b * _STRIDE + trip)
            trip += 1
            take = tr & (u < tl.minimum(p_x / tl.maximum(rho * q_x, 1e-30), 1.0))
            cur = tl.where(take, c, cur)
            moved = moved | take
            ns = tl.load(NS + gcc, mask=tr & ~take, other=-1)
            c = tl.where(take, c, tl.where(tr, ns, c))
            tr = live & ~moved & (c >= 0)
        stop = live & ~moved
        bsafe = tl.maximum(beta, 1e-30)
        scale = (1.0 - tl.exp(k * tl.log(tl.maximum(1.0 - bsafe, 1e-30)))) / bsafe
        # the residual max(p - min(q, p / rho) * scale, 0) (p without children), drawn from
        # tile by tile: its total, then the running prefix sum against u * total
        inv = 1.0 / rho
        u = tl.rand(seed + 1, b * _STRIDE + trip)
        trip += 1
        total = u * 0.0
        for v0 in range(0, V, BLOCK_V):
            vm = stop[:, None] & ((v0 + v)[None, :] < V)
            prow = tl.load(P + pg[:, None] + v0 + v[None, :], mask=vm, other=0.0)
            qrow = tl.load(Q + qg[:, None] + v0 + v[None, :], mask=vm & hasc[:, None], other=0.0)
            resid = tl.maximum(prow - tl.minimum(qrow, prow * inv[:, None]) * scale[:, None], 0.0)
            total += tl.sum(tl.where(hasc[:, None], resid, prow), 1)
        thr = u * total
        run = u * 0.0
        count = tl.zeros([BLOCK_B], dtype=tl.int32)
        for v0 in range(0, V, BLOCK_V):
            vv = (v0 + v)[None, :] < V
            vm = stop[:, None] & vv
            prow = tl.load(P + pg[:, None] + v0 + v[None, :], mask=vm, other=0.0)
            qrow = tl.load(Q + qg[:, None] + v0 + v[None, :], mask=vm & hasc[:, None], other=0.0)
            resid = tl.maximum(prow - tl.minimum(qrow, prow * inv[:, None]) * scale[:, None], 0.0)
            resid = tl.where(hasc[:, None], resid, prow)
            cum = run[:, None] + tl.cumsum(resid, 1)
            count += tl.sum(((cum <= thr[:, None]) & vv).to(tl.int32), 1)
            run += tl.sum(resid, 1)
        drawn = tl.minimum(count, V - 1)
        bonus = tl.where(stop, drawn, bonus)
        live = live & moved
    tl.store(ACC + b, cur, mask=ok)
    tl.store(BONUS + b, bonus.to(tl.int64), mask=ok)


def tree_links(parents: torch.Tensor, qo_indptr: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """(first_child, next_sibling, num_children) int32[total_q], local indices (-1: none), from
    packed local parents (root -1): torch ops on the tensors' device, no host sync (so a CUDA
    graph can hold them)."""
    total = parents.numel()
    dev = parents.device
    counts = (qo_indptr[1:] - qo_indptr[:-1]).long()
    seq = torch.repeat_interleave(
        torch.arange(counts.numel(), device=dev), counts, output_size=total
    )
    start = qo_indptr[:-1].long()[seq]
    local = torch.arange(total, device=dev) - start
    gpar = torch.where(parents >= 0, parents.long() + start, torch.full_like(start, -1))
    kid = gpar >= 0
    sink = torch.where(kid, gpar, torch.full_like(gpar, total))  # non-children write slot total
    big = torch.full((total + 1,), 1 << 30, dtype=torch.long, device=dev)
    fc = big.scatter_reduce(0, sink, local, reduce="amin")[:total]
    first = torch.where(fc < (1 << 30), fc, torch.full_like(fc, -1)).to(torch.int32)
    nk = torch.zeros(total + 1, dtype=torch.int32, device=dev)
    nk.scatter_add_(0, sink, kid.to(torch.int32))
    order = torch.argsort(gpar * (total + 1) + torch.arange(total, device=dev), stable=True)
    valid = (gpar[order[:-1]] == gpar[order[1:]]) & (gpar[order[:-1]] >= 0)
    nxt = torch.full((total + 1,), -1, dtype=torch.int32, device=dev)
    dest = torch.where(valid, order[:-1], torch.full_like(order[:-1], total))
    nxt.scatter_(0, dest, torch.where(valid, local[order[1:]], -1).to(torch.int32))
    return first, nxt[:total], nk[:total]


def verify_rule(
    rule: str,
    tokens: torch.Tensor,
    parents: torch.Tensor,
    qo_indptr: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    seed: int,
    *,
    block_b: int | None = None,
    block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(accepted node int32[B] local, bonus token int64[B]) of one verification by `rule`
    (specs.tree.VERIFY_RULES) per tree. target_probs, draft_probs: float32[total_q, V] (see the
    rule kernels' comment), any V; tokens int64, parents int32 (local, root -1), qo_indptr
    int32[B+1]. 'greedy' walks the argmax of target_probs (kernels' walk_tree). block_v: the
    vocabulary tile (a power of two, default min(next power of two of V, RULE_TILE))."""
    if target_probs.shape != draft_probs.shape or target_probs.dim() != 2:
        raise ValueError("target_probs and draft_probs must be [total_q, V] of one shape")
    if target_probs.dtype != torch.float32 or draft_probs.dtype != torch.float32:
        raise ValueError("target_probs and draft_probs must be float32")
    total, vocab = target_probs.shape
    if vocab < 1 or total * vocab >= 1 << 62:
        raise ValueError(f"rule kernels take 1 <= V and total_q x V < 2**62, got {total} x {vocab}")
    if block_v is not None and (block_v < 1 or block_v & (block_v - 1)):
        raise ValueError(f"block_v must be a power of two, got {block_v}")
    if tokens.shape != (total,) or parents.shape != (total,):
        raise ValueError("tokens and parents must be 1-D with one entry per probability row")
    batch = qo_indptr.numel() - 1
    dev = tokens.device
    acc = torch.zeros(batch, dtype=torch.int32, device=dev)
    bonus = torch.zeros(batch, dtype=torch.int64, device=dev)
    if batch == 0:
        return acc, bonus
    if rule == "greedy":
        res = walk_tree(tokens, parents, qo_indptr, target_probs.argmax(dim=1))
        last = res.accepted_nodes.gather(1, res.num_accepted.long()[:, None])[:, 0]
        return last.to(torch.int32), res.next_token
    first, nxt, nk = tree_links(parents, qo_indptr)
    if block_v is None:
        block_v = min(triton.next_power_of_2(vocab), RULE_TILE)
    if dev.type == "cuda":
        block_v = max(block_v, 16)
    if block_b is None:
        block_b = 1 if dev.type == "cuda" else 4096
    block_b = 1 << (max(1, min(block_b, triton.next_power_of_2(batch))).bit_length() - 1)
    grid = (triton.cdiv(batch, block_b),)
    warps = 8 if block_b * block_v >= 4096 else 4
    p = target_probs.contiguous()
    q = draft_probs.contiguous()
    if rule == "traversal":
        t = torch.empty_like(p)
        mass = torch.empty(total, dtype=torch.float32, device=dev)
        _traversal_kernel[grid](
            tokens, parents, first, nxt, qo_indptr, p, q, t, mass, acc, bonus, batch, vocab,
            seed, BLOCK_B=block_b, BLOCK_V=block_v, num_warps=warps,
        )  # fmt: skip
    elif rule == "token":
        r = torch.empty((batch, vocab), dtype=torch.float32, device=dev)
        _token_rule_kernel[grid](
            tokens, first, nxt, qo_indptr, p, q, r, acc, bonus, batch, vocab, seed,
            BLOCK_B=block_b, BLOCK_V=block_v, num_warps=warps,
        )  # fmt: skip
    elif rule == "spectr":
        _spectr_kernel[grid](
            tokens, first, nxt, nk, qo_indptr, p, q, acc, bonus, batch, vocab, seed,
            BLOCK_B=block_b, BLOCK_V=block_v, BISECT=30, num_warps=warps,
        )  # fmt: skip
    else:
        raise ValueError(f"unknown verification rule {rule!r}")
    return acc, bonus
