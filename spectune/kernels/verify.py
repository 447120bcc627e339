"""Tree verification: which draft path the target accepts, and the bonus token.

Both rules are one walk down the tree with one target token per node:
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
    "verify_greedy",
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
