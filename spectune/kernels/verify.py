"""Tree verification: which draft path the target accepts, and the bonus token.

Both rules are one walk down the tree with one target token per node:
- greedy: the target token of node i is argmax(logits[i]);
- stochastic (lossless, target-only rule for deterministic top-k drafts): the target token of
  node i is one sample from softmax(logits[i] / T). From the root, move to the child whose token
  equals the current node's target token (the lowest-index one if several do), else stop; the
  emitted tokens are the accepted draft tokens plus the stopping node's target token, so every
  emitted token is a target sample given its prefix and the output distribution is the target's.

Kernels:
- `_sample_kernel`: per row of logits [rows, vocab], argmax of logits / T + Gumbel noise
  (Gumbel-max; noise from Triton's counter-based Philox, one call per 4 columns, so it is
  reproducible and nothing of size rows x vocab is written). T == 0 is a plain argmax. Bytes:
  one read of the logits; no probability tensor.
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

_BIG = tl.constexpr(1 << 30)  # "no child" sentinel inside the walk kernel


@dataclass(frozen=True)
class VerifyResult:
    accepted_nodes: torch.Tensor  # int32[B, P]
    num_accepted: torch.Tensor  # int32[B]
    next_token: torch.Tensor  # int64[B]
    emitted_tokens: torch.Tensor  # int64[B, P]


# ---- sampling --------------------------------------------------------------------------------


@triton.jit
def _argmax_update(best, best_idx, score, cols):
    """Fold one tile's row maxima into the running (best, best_idx); ties go to the lower index."""
    m = tl.max(score, 1)
    idx = tl.min(tl.where(score == m[:, None], cols[None, :], 2147483647), 1)
    take = (m > best) | ((m == best) & (idx < best_idx))
    return tl.where(take, m, best), tl.where(take, idx, best_idx)


@triton.jit
def _gumbel_tile(LOGITS, r64, r_ok, stride_r, cols, ok, u, inv_temp, best, best_idx):
    x = tl.load(LOGITS + r64[:, None] * stride_r + cols[None, :], mask=ok, other=0.0)
    g = -tl.log(-tl.log(u))  # Gumbel(0, 1); u == 0 gives -inf (never chosen)
    score = tl.where(ok, x.to(tl.float32) * inv_temp + g, float("-inf"))
    return _argmax_update(best, best_idx, score, cols)


@triton.jit
def _sample_kernel(
    LOGITS, OUT, rows, vocab, quarter, stride_r, inv_temp, seed,
    GREEDY: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_V: tl.constexpr,
):  # fmt: skip
    """Row argmax of logits (GREEDY) or of logits / T + Gumbel noise. Noise: one Philox call per
    counter (row * quarter + i) gives four uniforms, for columns i, quarter + i, 2 quarter + i and
    3 quarter + i (quarter = ceil(vocab / 4)): a quarter of the Philox work of one call per column."""
    pid = tl.program_id(0)
    r = pid * BLOCK_R + tl.arange(0, BLOCK_R)
    r_ok = r < rows
    r64 = r.to(tl.int64)
    best = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)
    best_idx = tl.full([BLOCK_R], 2147483647, dtype=tl.int32)
    if GREEDY:
        for v0 in range(0, vocab, BLOCK_V):
            cols = v0 + tl.arange(0, BLOCK_V)
            ok = r_ok[:, None] & (cols[None, :] < vocab)
            x = tl.load(LOGITS + r64[:, None] * stride_r + cols[None, :], mask=ok, other=0.0)
            score = tl.where(ok, x.to(tl.float32), float("-inf"))
            best, best_idx = _argmax_update(best, best_idx, score, cols)
    else:
        for i0 in range(0, quarter, BLOCK_V):
            i = i0 + tl.arange(0, BLOCK_V)
            u0, u1, u2, u3 = tl.rand4x(seed, r64[:, None] * quarter + i[None, :])
            in_q = r_ok[:, None] & (i[None, :] < quarter)
            c = i
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u0,
                inv_temp,
                best,
                best_idx,
            )
            c = i + quarter
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u1,
                inv_temp,
                best,
                best_idx,
            )
            c = i + 2 * quarter
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u2,
                inv_temp,
                best,
                best_idx,
            )
            c = i + 3 * quarter
            best, best_idx = _gumbel_tile(
                LOGITS,
                r64,
                r_ok,
                stride_r,
                c,
                in_q & (c[None, :] < vocab),
                u3,
                inv_temp,
                best,
                best_idx,
            )
    tl.store(OUT + r64, best_idx.to(tl.int64), mask=r_ok)


def sample_target(
    logits: torch.Tensor, temperature: float = 0.0, seed: int = 0, *, block_r: int | None = None
) -> torch.Tensor:
    """int64[rows]: argmax (temperature 0) or one Gumbel-max sample of softmax(logits / T) per row.

    logits: [rows, vocab] float32 / float16 / bfloat16, last dim contiguous. Deterministic for
    (seed, row, col): the same seed and logits give the same tokens on any launch shape.
    """
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be [rows, vocab] with a contiguous last dim, got {tuple(logits.shape)}"
        )
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 <= seed < 2**63:
        raise ValueError("seed must be in [0, 2**63)")
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device)
    if rows == 0:
        return out
    on_gpu = logits.device.type == "cuda"
    if block_r is None:
        block_r = 1 if on_gpu else min(8192, triton.next_power_of_2(rows))
    block_v = min(triton.next_power_of_2(vocab), 4096 if on_gpu else 1024)
    cap = 8192 if on_gpu else 65536  # interpreter: few big programs (numpy per-op overhead)
    if block_r * block_v > cap:
        block_v = max(16, cap // block_r)
    greedy = temperature == 0.0
    quarter = triton.cdiv(vocab, 4)
    if not greedy:  # four column tiles per Philox call
        block_v = min(block_v, max(16, triton.next_power_of_2(quarter)))
    _sample_kernel[(triton.cdiv(rows, block_r),)](
        logits, out, rows, vocab, quarter, logits.stride(0), 0.0 if greedy else 1.0 / temperature, seed,
        GREEDY=greedy, BLOCK_R=block_r, BLOCK_V=block_v, num_warps=8 if on_gpu else 4,
    )  # fmt: skip
    return out


def _philox_uniforms(seed: int, counters: np.ndarray) -> list[np.ndarray]:
    """The four float32 uniforms of Triton's tl.rand4x(seed, counters) (Philox4x32-10)."""
    mask32 = np.uint64(0xFFFFFFFF)
    off = counters.astype(np.uint64)
    c0 = off & mask32
    c1 = off >> np.uint64(32)
    c2 = np.zeros_like(c0)
    c3 = np.zeros_like(c0)
    k0 = np.uint64(seed & 0xFFFFFFFF)
    k1 = np.uint64((seed >> 32) & 0xFFFFFFFF)
    round_a, round_b = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    key_a, key_b = np.uint64(0x9E3779B9), np.uint64(0xBB67AE85)
    for _ in range(10):
        prod_b = round_b * c2  # < 2**64: exact in uint64
        prod_a = round_a * c0
        c0, c1, c2, c3 = (
            (prod_b >> np.uint64(32)) ^ c1 ^ k0,
            prod_b & mask32,
            (prod_a >> np.uint64(32)) ^ c3 ^ k1,
            prod_a & mask32,
        )
        k0 = (k0 + key_a) & mask32
        k1 = (k1 + key_b) & mask32
    out = []
    for c in (c0, c1, c2, c3):
        x = c.astype(np.uint32).view(np.int32)
        x = np.where(x < 0, ~x, x)
        out.append(x.astype(np.float32) * np.float32(4.6566127342e-10))
    return out


def reference_sample_target(
    logits: torch.Tensor, temperature: float = 0.0, seed: int = 0
) -> torch.Tensor:
    """numpy float32 replica of sample_target (same Philox stream, same Gumbel-max, same ties)."""
    x = logits.detach().float().cpu().numpy()
    if temperature == 0.0:
        return torch.from_numpy(x.argmax(1).astype(np.int64))
    rows, vocab = x.shape
    quarter = -(-vocab // 4)
    counters = (
        np.arange(rows, dtype=np.int64)[:, None] * quarter
        + np.arange(quarter, dtype=np.int64)[None, :]
    )
    u = np.concatenate(_philox_uniforms(seed, counters), axis=1)[:, :vocab]
    with np.errstate(divide="ignore"):
        g = -np.log(-np.log(u))
    score = x * np.float32(1.0 / temperature) + g
    return torch.from_numpy(score.argmax(1).astype(np.int64))


# ---- the walk --------------------------------------------------------------------------------


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
