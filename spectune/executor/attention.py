"""Attention of tree (or chain, or single) query tokens over a cached prefix plus the new tokens.

Split in two and merged by log-sum-exp, so no [rows x context] mask is ever built:
- the prefix (C cached tokens, every query sees all of them) goes through a flash kernel with
  the query heads of one KV group packed as rows, so each K/V byte is read once per group:
  bytes = B * C * KVH * D * 2 (K and V) * 2 B;
- the new tokens (S <= a few hundred) attend with the tree's ancestor mask in plain torch,
  a [B, KVH, G*N, S] score tensor that is tiny next to the prefix.

`spectune.kernels` (the Triton tree-attention kernel, owned by the kernels helper) is used when
it exposes `tree_attention`; this module is the fallback and the CPU path.
"""

from __future__ import annotations

import math
import os
from typing import Any

import torch
import triton
import triton.language as tl

from spectune.executor.fused import rope_scatter_


def _pack(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q: [B, N, H, D] -> [B, KVH, G*N, D] with row = g * N + n (one KV group per 'head')."""
    b, n, h, d = q.shape
    g = h // kv_heads
    return q.view(b, n, kv_heads, g, d).permute(0, 2, 3, 1, 4).reshape(b, kv_heads, g * n, d)


def _unpack(o: torch.Tensor, n: int) -> torch.Tensor:
    """[B, KVH, G*N, D] -> [B, N, H, D]."""
    b, kvh, gn, d = o.shape
    g = gn // n
    return o.view(b, kvh, g, n, d).permute(0, 3, 1, 2, 4).reshape(b, n, kvh * g, d)


def _prefix_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, KVH, R, D]; k, v: [B, KVH, C, D] -> (out [B, KVH, R, D], lse float32[B, KVH, R])."""
    if q.is_cuda:
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, False, False, scale=scale
        )
        return res[0], res[1]
    s = torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale
    lse = torch.logsumexp(s, dim=-1)
    o = torch.matmul(torch.exp(s - lse[..., None]), v.float())
    return o.to(q.dtype), lse


_FA_VARLEN: list[bool] = []


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


# [works] once tried: FlashAttention-2's GQA forward with split-KV


def _prefix_attention_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """q: [B, N, H, D]; k, v: [B, C, KVH, D] (the cache layout, no copy) -> (out packed
    [B, KVH, G*N, D], lse packed [B, KVH, G*N]) through aten._flash_attention_forward, which
    takes grouped K/V as they are and splits long keys across programs at small batch; None
    where that op is unavailable (then the packed path runs)."""
    if _FA_VARLEN and not _FA_VARLEN[0]:
        return None
    b, n, h, _ = q.shape
    kvh = k.shape[2]
    try:
        res = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, n, k.shape[1], 0.0, False, False, scale=scale
        )
    except (RuntimeError, TypeError, AttributeError):
        if not _FA_VARLEN:
            _FA_VARLEN.append(False)
            return None
        raise
    if not _FA_VARLEN:
        _FA_VARLEN.append(True)
    out, lse = res[0], res[1]  # [B, N, H, D], [B, H, N]
    g = h // kvh
    return _pack(out, kvh), lse.reshape(b, kvh, g * n)


def self_check(device: torch.device) -> float:
    """Relative error of tree_attention against the float64 reference on random bf16 inputs at
    a small shape; the grouped flash path is switched off if it disagrees (> 2e-2)."""
    g = torch.Generator(device=device).manual_seed(0)
    b, n, h, kvh, d, c = 2, 7, 8, 2, 64, 300

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=g, device=device).to(torch.bfloat16)

    q, kp, vp, kn, vn = (
        r(b, n, h, d),
        r(b, c, kvh, d),
        r(b, c, kvh, d),
        r(b, kvh, n, d),
        r(b, kvh, n, d),
    )
    mask = torch.ones((n, n), dtype=torch.bool, device=device).tril().expand(b, n, n)
    args = (q, kp.transpose(1, 2), vp.transpose(1, 2), kn, vn, mask)
    out = tree_attention(*args).double()
    ref = reference_tree_attention(*args).double()
    err = float((out - ref).norm() / ref.norm())
    if err > 2e-2:  # switch the Triton paths off, then the grouped flash path, until it agrees
        _FUSED_OK[0] = False
        err = float((tree_attention(*args).double() - ref).norm() / ref.norm())
    if err > 2e-2 and _FA_VARLEN and _FA_VARLEN[0]:
        _FA_VARLEN[0] = False
        err = float((tree_attention(*args).double() - ref).norm() / ref.norm())
    return err


_FUSED_OK = [True]  # the Triton tree-merge / split-prefix kernels agreed with the reference


def _tree_part(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, KVH, G*N, D]; k, v: [B, KVH, S, D]; mask: bool[B, N, S] -> (out float32, lse)."""
    b, kvh, gn, _ = q.shape
    n = mask.shape[1]
    s = torch.matmul(q, k.transpose(-1, -2)).float() * scale  # [B, KVH, G*N, S]
    s = s.view(b, kvh, gn // n, n, -1).masked_fill(~mask[:, None, None], float("-inf"))
    s = s.view(b, kvh, gn, -1)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None])
    return torch.matmul(p.to(v.dtype), v).float(), lse


@triton.jit
def _tree_merge_kernel(
    Q, K, V, MASK, O1, LSE1, OUT,
    sq_b, sq_h, sq_r, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s, sm_b, sm_n, sm_s,
    so1_s, so1_b, so1_h, so1_r, sl_s, sl_b, sl_h, so_b, so_n, so_h,
    R, N, S, G, NS, scale,
    HAS_PREFIX: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    rok = r < R
    sok = s < S
    n = r % N
    q = tl.load(
        Q + b * sq_b + h * sq_h + r[:, None] * sq_r + d[None, :], mask=rok[:, None], other=0.0
    )
    k = tl.load(
        K + b * sk_b + h * sk_h + s[:, None] * sk_s + d[None, :], mask=sok[:, None], other=0.0
    )
    v = tl.load(
        V + b * sv_b + h * sv_h + s[:, None] * sv_s + d[None, :], mask=sok[:, None], other=0.0
    )
    seen = tl.load(
        MASK + b * sm_b + n[:, None] * sm_n + s[None, :] * sm_s,
        mask=rok[:, None] & sok[None, :],
        other=0,
    )
    sc = tl.dot(q, tl.trans(k)) * scale
    sc = tl.where((seen != 0) & sok[None, :], sc, float("-inf"))
    m2 = tl.max(sc, 1)
    m2 = tl.where(m2 == float("-inf"), 0.0, m2)
    p = tl.exp(sc - m2[:, None])
    l2 = tl.sum(p, 1)
    o = tl.dot(p.to(v.dtype), v)
    lse2 = m2 + tl.log(l2)
    o = o / l2[:, None]
    if HAS_PREFIX:  # merge the NS prefix partials (each normalised, with its log-sum-exp)
        mm = lse2
        for sp in range(NS):
            mm = tl.maximum(
                mm, tl.load(LSE1 + sp * sl_s + b * sl_b + h * sl_h + r, mask=rok, other=0.0)
            )
        tot = tl.exp(lse2 - mm)
        o = o * tot[:, None]
        for sp in range(NS):
            w1 = tl.exp(
                tl.load(LSE1 + sp * sl_s + b * sl_b + h * sl_h + r, mask=rok, other=0.0) - mm
            )
            o1 = tl.load(
                O1 + sp * so1_s + b * so1_b + h * so1_h + r[:, None] * so1_r + d[None, :],
                mask=rok[:, None],
                other=0.0,
            )
            o += o1.to(tl.float32) * w1[:, None]
            tot += w1
        o = o / tot[:, None]
    head = h * G + r // N
    tl.store(
        OUT + b * so_b + n[:, None] * so_n + head[:, None] * so_h + d[None, :],
        o.to(OUT.dtype.element_ty),
        mask=rok[:, None],
    )


@triton.jit
def _prefix_split_kernel(
    Q, K, V, OP, LP,
    sq_b, sq_h, sq_r, sk_b, sk_h, sk_s, sv_b, sv_h, sv_s,
    sop_s, sop_b, sop_h, sop_r, slp_s, slp_b, slp_h,
    R, C, chunk, scale,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    sp = tl.program_id(2)
    r = tl.arange(0, BLOCK_R)
    d = tl.arange(0, D)
    rok = r < R
    q = tl.load(
        Q + b * sq_b + h * sq_h + r[:, None] * sq_r + d[None, :], mask=rok[:, None], other=0.0
    )
    start = sp * chunk
    end = tl.minimum(start + chunk, C)
    m_i = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, D), tl.float32)
    for n0 in range(start, end, BLOCK_N):
        nn = n0 + tl.arange(0, BLOCK_N)
        nok = nn < end
        k = tl.load(
            K + b * sk_b + h * sk_h + nn[:, None] * sk_s + d[None, :], mask=nok[:, None], other=0.0
        )
        v = tl.load(
            V + b * sv_b + h * sv_h + nn[:, None] * sv_s + d[None, :], mask=nok[:, None], other=0.0
        )
        sc = tl.dot(q, tl.trans(k)) * scale
        sc = tl.where(nok[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    o = acc / l_i[:, None]
    tl.store(
        OP + sp * sop_s + b * sop_b + h * sop_h + r[:, None] * sop_r + d[None, :],
        o,
        mask=rok[:, None],
    )
    tl.store(LP + sp * slp_s + b * slp_b + h * slp_h + r, m_i + tl.log(l_i), mask=rok)


MAX_SPLIT_ROWS = 64  # packed query rows (G x tokens) the split-prefix kernel holds in one tile


def _prefix_split(
    qp: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Flash-decoding over the prefix for few query rows: qp [B, KVH, R <= 64, D], k/v
    [B, KVH, C, D] (strided cache views) -> normalised partials [S, B, KVH, R, D] (float32) and
    their log-sum-exps [S, B, KVH, R]; S splits of the prefix fill the GPU at any batch.
    Bytes: K and V once (2 * B * C * KVH * D * 2) + S * B * KVH * R * (D + 1) * 4 of partials."""
    b, kvh, r, d = qp.shape
    c = k.shape[2]
    block_n = 64
    want = max(1, -(-2 * _sm_count(qp.device) // (b * kvh)))
    chunk = max(256, -(-c // want))
    chunk = -(-chunk // block_n) * block_n
    splits = -(-c // chunk)
    op = torch.empty((splits, b, kvh, r, d), dtype=torch.float32, device=qp.device)
    lp = torch.empty((splits, b, kvh, r), dtype=torch.float32, device=qp.device)
    _prefix_split_kernel[(b, kvh, splits)](
        qp, k, v, op, lp,
        qp.stride(0), qp.stride(1), qp.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        op.stride(0), op.stride(1), op.stride(2), op.stride(3), lp.stride(0), lp.stride(1), lp.stride(2),
        r, c, chunk, scale,
        BLOCK_R=max(16, triton.next_power_of_2(r)), BLOCK_N=block_n, D=d, num_warps=4, num_stages=3,
    )  # fmt: skip
    return op, lp


def _tree_merge(
    qp: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    o1: torch.Tensor | None,
    lse1: torch.Tensor | None,
    n: int,
    scale: float,
) -> torch.Tensor:
    """One kernel for the tree part, the log-sum-exp merge with the prefix partial and the
    unpacking: qp [B, KVH, G*N, D] -> out [B, N, H, D]."""
    b, kvh, r, d = qp.shape
    s = k.shape[2]
    g = r // n
    out = torch.empty((b, n, kvh * g, d), dtype=qp.dtype, device=qp.device)
    m = mask.view(torch.int8) if mask.dtype == torch.bool else mask  # same itemsize: a view
    block_r = 64 if r > 32 else max(16, triton.next_power_of_2(r))
    block_s = max(16, triton.next_power_of_2(s))
    has = o1 is not None and lse1 is not None
    o1_ = o1 if has else qp[None]
    l1_ = lse1 if has else qp[None, ..., 0]
    assert o1_ is not None and l1_ is not None
    if o1_.dim() == 4:  # one partial: a split axis of length 1
        o1_, l1_ = o1_[None], l1_[None]
    grid = (b, kvh, triton.cdiv(r, block_r))
    _tree_merge_kernel[grid](
        qp, k, v, m, o1_, l1_, out,
        qp.stride(0), qp.stride(1), qp.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), m.stride(0), m.stride(1), m.stride(2),
        o1_.stride(0), o1_.stride(1), o1_.stride(2), o1_.stride(3),
        l1_.stride(0), l1_.stride(1), l1_.stride(2),
        out.stride(0), out.stride(1), out.stride(2),
        r, n, s, g, o1_.shape[0], scale,
        HAS_PREFIX=has, BLOCK_R=block_r, BLOCK_S=block_s, D=d, num_warps=4,
    )  # fmt: skip
    return out


MAX_FUSED_TREE = 256  # tree keys the fused tree+merge kernel holds in one tile


def tree_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor | None,
    v_prefix: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    mask: torch.Tensor,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Attention of N query tokens per sequence.

    q:        [B, N, H, D]      the new tokens' queries (RoPE applied)
    k_prefix: [B, KVH, C, D]    cached prefix keys (None or C == 0: no prefix); v_prefix alike
    k_new:    [B, KVH, S, D]    keys of the new tokens (S >= N; e.g. all draft tokens so far)
    mask:     bool[B, N, S]     query n may see new key s (tree: s is n or an ancestor of n)
    returns   [B, N, H, D]
    """
    b, n, d = q.shape[0], q.shape[1], q.shape[3]
    kvh = k_new.shape[1]
    scale = 1.0 / math.sqrt(d)
    qp = _pack(q, kvh)
    fused = (q.is_cuda and _FUSED_OK[0] if use_triton is None else use_triton) and k_new.shape[
        2
    ] <= MAX_FUSED_TREE
    no_prefix = k_prefix is None or v_prefix is None or k_prefix.shape[2] == 0
    if fused and no_prefix:
        return _tree_merge(qp, k_new, v_new, mask, None, None, n, scale)
    if not fused:
        o2, lse2 = _tree_part(qp, k_new, v_new, mask, scale)
    if no_prefix:
        return _unpack(o2.to(q.dtype), n)
    assert k_prefix is not None and v_prefix is not None
    if fused and qp.shape[2] <= MAX_SPLIT_ROWS:  # few rows (decode, drafting): split the prefix
        op, lp = _prefix_split(qp, k_prefix, v_prefix, scale)
        return _tree_merge(qp, k_new, v_new, mask, op, lp, n, scale)
    # the grouped flash path re-reads K/V once per query head but splits long prefixes across
    # programs: it wins only where the packed path leaves most SMs idle (small batch x group)
    few = q.is_cuda and b * kvh * -(-qp.shape[2] // 128) < _sm_count(q.device) // 2
    fa = (
        _prefix_attention_gqa(q, k_prefix.transpose(1, 2), v_prefix.transpose(1, 2), scale)
        if few
        else None
    )
    o1, lse1 = fa if fa is not None else _prefix_attention(qp, k_prefix, v_prefix, scale)
    if fused:
        return _tree_merge(qp, k_new, v_new, mask, o1, lse1, n, scale)
    m = torch.maximum(lse1, lse2)
    w1 = torch.exp(lse1 - m)[..., None]
    w2 = torch.exp(lse2 - m)[..., None]
    o = (o1.float() * w1 + o2 * w2) / (w1 + w2)
    return _unpack(o.to(q.dtype), n)


def reference_tree_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor | None,
    v_prefix: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """The same function by one masked softmax over [prefix; new] in float64 (tests only)."""
    b, n, h, d = q.shape
    kvh = k_new.shape[1]
    g = h // kvh
    if k_prefix is None or v_prefix is None:
        k_prefix = k_new[:, :, :0]
        v_prefix = v_new[:, :, :0]
    c = k_prefix.shape[2]
    k = torch.cat((k_prefix, k_new), dim=2).double().repeat_interleave(g, dim=1)  # [B, H, C+S, D]
    v = torch.cat((v_prefix, v_new), dim=2).double().repeat_interleave(g, dim=1)
    full = torch.cat((torch.ones(b, n, c, dtype=torch.bool, device=mask.device), mask), dim=2)
    s = torch.einsum("bnhd,bhsd->bhns", q.double(), k) / math.sqrt(d)
    s = s.masked_fill(~full[:, None], float("-inf"))
    return torch.einsum("bhns,bhsd->bnhd", torch.softmax(s, dim=-1), v).to(q.dtype)


def kernels_ready() -> bool:
    """Whether spectune.kernels offers the Triton tree attention (owned by the kernels helper)."""
    import importlib

    try:  # the package re-exports a function of the module's name: import the module itself
        mod = importlib.import_module("spectune.kernels.tree_attention")
    except ImportError:
        return False
    return callable(getattr(mod, "tree_attention", None))


def _word_bits(words: int, device: torch.device) -> torch.Tensor:
    """int64[words, 64]: the value of bit j of each mask word (bit 63 is the sign bit)."""
    j = torch.arange(words * 64, device=device)
    bits = torch.where(j % 64 == 63, torch.iinfo(torch.int64).min, 1 << (j % 64).clamp(max=62))
    return bits.view(words, 64)


def _mask_words(rows: torch.Tensor, word_bits: torch.Tensor) -> torch.Tensor:
    """bool[R, n] mask rows -> int64[R, words] bitmask words (the kernels' tree_mask layout;
    a sum of distinct bits is their OR). Fixed shapes, no host sync."""
    r, n = rows.shape
    words = word_bits.shape[0]
    full = torch.zeros((r, words * 64), dtype=torch.int64, device=rows.device)
    full[:, :n] = rows.long()
    return (full.view(r, words, 64) * word_bits).sum(-1)


class KernelLayout:
    """The flat layout spectune.kernels' tree attention reads, for B sequences of N tree tokens
    over `context` cached tokens in a [B, capacity, KVH, D] cache; built once per captured
    (batch, tokens) bucket. `bitmask` int64[B*N, W] is refreshed in place each step from the
    tree's ancestor matrix (set_mask)."""

    def __init__(self, batch: int, tokens: int, context: int, capacity: int, device: torch.device):
        i32 = torch.int32
        self.batch, self.tokens, self.context, self.capacity = batch, tokens, context, capacity
        self.qo_indptr = torch.arange(batch + 1, dtype=i32, device=device) * tokens
        self.kv_indptr = torch.arange(batch + 1, dtype=i32, device=device) * capacity
        self.kv_lens = torch.full((batch,), context + tokens, dtype=i32, device=device)
        self.prefix = torch.full((batch,), context, dtype=i32, device=device)
        words = (tokens + 63) // 64
        self.bitmask = torch.zeros((batch * tokens, words), dtype=torch.int64, device=device)
        self._bit = _word_bits(words, device)

    def set_mask(self, mask: torch.Tensor) -> None:
        """mask: bool[B, N, N] ancestor matrix -> the bitmask rows (sum of distinct bits = OR)."""
        b, n, _ = mask.shape
        self.bitmask.copy_(_mask_words(mask.reshape(b * n, n), self._bit))

    def attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q: [B, N, Hq, D]; kv: [2, B, capacity, KVH, D] -> [B, N, Hq, D]."""
        from spectune.kernels.tree_attention import tree_attention as kernel_tree_attention

        b, n, hq, d = q.shape
        kvh = kv.shape[3]
        config, splits = _TUNED.get((self.batch, self.tokens, self.context), (None, None))
        out = kernel_tree_attention(
            q.reshape(b * n, hq, d),
            kv[0].reshape(b * self.capacity, kvh, d),
            kv[1].reshape(b * self.capacity, kvh, d),
            self.qo_indptr,
            self.kv_indptr,
            self.bitmask,
            self.kv_lens,
            max_q_len=n,
            max_kv_len=self.context + n,
            config=config,
            num_splits=splits,
        )
        return out.view(b, n, hq, d)


# (batch, tree tokens, context) -> the fastest TreeAttentionConfig measured (tune_attention)
_TUNED: dict[tuple[int, int, int], Any] = {}
# (block_m, block_n, num_warps, num_stages, prefix splits per KV group and m-block: None = the
# kernel's own choice)
_CANDIDATES = (
    (64, 128, 4, 3, None),
    (64, 128, 4, 3, 32),
    (128, 64, 8, 3, None),
    (128, 64, 8, 3, 32),
    (32, 128, 4, 3, None),
    (16, 128, 4, 3, None),
    (64, 64, 4, 4, None),
    (128, 128, 8, 2, None),
)


def tune_attention(
    batch: int, tokens: int, context: int, kv: torch.Tensor, heads: int
) -> list[dict[str, object]]:
    """Time the kernels' tree attention under each candidate config for one shape (CUDA graph
    replays) and keep the fastest for KernelLayout.attend. kv: [2, B, capacity, KVH, D]."""
    from spectune.executor.timing import graph_time
    from spectune.kernels.tree_attention import TreeAttentionConfig

    key = (batch, tokens, context)
    if key in _TUNED:
        return []
    dev = kv.device
    lay = KernelLayout(batch, tokens, context, kv.shape[2], dev)
    causal = torch.ones((tokens, tokens), dtype=torch.bool, device=dev).tril()
    lay.set_mask(causal.expand(batch, tokens, tokens))
    q = torch.randn((batch, tokens, heads, kv.shape[-1]), device=dev, dtype=kv.dtype)
    rows: list[dict[str, object]] = []
    best, best_t = None, float("inf")
    group = heads // kv.shape[3]
    for bm, bn, warps, stages, splits in _CANDIDATES:
        if bm > 2 * max(16, group * tokens):
            continue
        sp = None if splits is None else max(1, min(splits, context // 256))
        cfg = (TreeAttentionConfig(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages), sp)
        _TUNED[key] = cfg
        try:
            t = graph_time(lambda: lay.attend(q, kv), dev, 10)
        except Exception as e:  # a config that does not compile is skipped
            rows.append({"config": [bm, bn, warps, stages, splits], "error": repr(e)[:160]})
            continue
        rows.append({"config": [bm, bn, warps, stages, splits], "seconds": t})
        if t < best_t:
            best, best_t = cfg, t
    if best is None:
        del _TUNED[key]
    else:
        _TUNED[key] = best
    return rows


# ---- ragged verify of pruned trees ---------------------------------------------------------------
#: a pruned batch's T verify tokens are padded up to a multiple of this (one CUDA graph per
#: bucket). The cost model charges weight GEMMs at B x (mean tree tokens) with no token
#: rounding, so the rounding is kept fine; 16 also keeps every bucket's integer arguments
#: divisible by 16 (one Triton specialisation for all buckets but the top one, B x N).
TOKEN_BUCKET = 16


def token_bucket(total: int, cap: int) -> int:
    """Verify tokens a step of `total` kept tokens runs at: the next multiple of TOKEN_BUCKET,
    at most `cap` (the layout's B x N rows; padding rows < TOKEN_BUCKET either way)."""
    return min(-(-max(total, 1) // TOKEN_BUCKET) * TOKEN_BUCKET, cap)


def route_buckets(cost_s: dict[int, float], reach: int = 4, margin: float = 0.02) -> dict[int, int]:
    """Bucket -> the bucket its steps run at: the cheapest of it and the next `reach` larger
    buckets in `cost_s` (measured seconds per bucket), when that one is at least `margin`
    cheaper; otherwise itself. A larger bucket only adds padding rows, so any bucket >= the
    step's kept tokens is a valid verify; library GEMM heuristics make cost jump non-smoothly
    with M (H200, Llama-3.1-8B: M = 704 took 1.3 ms more per verify than M = 696)."""
    sizes = sorted(cost_s)
    route = {}
    for i, b in enumerate(sizes):
        best = min(sizes[i : i + reach + 1], key=lambda c: (cost_s[c], c))
        route[b] = best if cost_s[best] < (1.0 - margin) * cost_s[b] else b
    return route


class RaggedLayout:
    """Packed verify of B pruned trees: sequence b's counts[b] kept nodes (compacted to the front
    of its [N] row by tree_build.prune_tree) become rows qo[b] .. qo[b+1]-1 of T = sum(counts)
    tokens, each with its position (context + depth), cache slot (b * capacity + context +
    local index: the kernels' "tree K/V in the last N_b slots") and ancestor bitmask row.

    The buffers hold B*N (+ bucket padding) rows so that `set_trees` is fixed-shape (one CUDA
    graph); rows past T are padding: token 0, position `context`, no cache slot (not stored),
    empty mask. A verify at bucket T_b >= T reads the first T_b rows through `view(T_b)`, which
    adds a scratch sequence B owning rows T .. T_b-1 with no prefix, so padding attends to
    nothing real and writes nothing (see RaggedView). `dest` maps each row back to its [B, N]
    slot (b * N + i; padding -> the sink B * N) for scattering outputs to the padded layout.
    """

    def __init__(
        self, batch: int, nodes: int, context: int, capacity: int, device: torch.device
    ) -> None:
        self.batch, self.nodes, self.context, self.capacity = batch, nodes, context, capacity
        self.device = device
        # the top bucket is B x N itself (not rounded up): a step that keeps every node runs at
        # the dense verify's M (library GEMMs pick kernels per M: on an H200 M = 704 cost 1.3 ms
        # more per Llama-3.1-8B verify than M = 696, B = 8 x 87 nodes)
        self.max_tokens = batch * nodes
        size = self.max_tokens + 1  # + the sink row that dropped slots scatter into
        self.sink = self.max_tokens
        i64: dict[str, Any] = {"dtype": torch.int64, "device": device}
        self.tokens = torch.zeros(size, **i64)
        self.pos = torch.full((size,), context, **i64)
        self.dst = torch.full((size,), -1, **i64)
        self.dest = torch.full((size,), batch * nodes, **i64)
        self.max_q_len = max(nodes, TOKEN_BUCKET)  # a scratch sequence holds < TOKEN_BUCKET rows
        words = (self.max_q_len + 63) // 64
        self.bitmask = torch.zeros((size, words), **i64)
        self.qo = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.total = torch.zeros((), **i64)
        self._bit = _word_bits(words, device)
        ar = torch.arange(nodes, device=device)
        self._local = ar.expand(batch, nodes)
        self._slot = torch.arange(batch, device=device)[:, None] * capacity + context + ar
        self._bn = torch.arange(batch * nodes, device=device).view(batch, nodes)
        self._views: dict[int, RaggedView] = {}

    def set_trees(
        self, tokens: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor
    ) -> None:
        """Pack the first counts[b] nodes of each row (no host sync; fixed shapes).

        tokens, depth: int64[B, N]; mask: bool[B, N, N] ancestor matrix; counts: int64[B] >= 1."""
        b, n = tokens.shape
        words = self.bitmask.shape[1]
        ends = torch.cumsum(counts, 0)
        self.qo[1:].copy_(ends)
        self.total.copy_(ends[-1])
        self.kv_lens.copy_(self.context + counts)
        live = self._local < counts[:, None]
        row = torch.where(live, (ends - counts)[:, None] + self._local, self.sink).view(-1)
        for buf, fill in ((self.tokens, 0), (self.pos, self.context), (self.dst, -1)):
            buf.fill_(fill)
        self.dest.fill_(b * n)
        self.bitmask.zero_()
        self.tokens.scatter_(0, row, tokens.reshape(-1))
        self.pos.scatter_(0, row, (self.context + depth).reshape(-1))
        self.dst.scatter_(0, row, self._slot.reshape(-1))
        self.dest.scatter_(0, row, self._bn.reshape(-1))
        bits = _mask_words(mask.reshape(b * n, n), self._bit)
        self.bitmask.scatter_(0, row[:, None].expand(b * n, words), bits)
        # the sink row took every dropped slot's values: reset it to padding
        # (slice fills, not `buf[i] = x`: a Python scalar assignment copies from the host,
        # which CUDA-graph capture forbids)
        s = slice(self.sink, self.sink + 1)
        self.tokens[s].fill_(0)
        self.pos[s].fill_(self.context)
        self.dst[s].fill_(-1)
        self.bitmask[s].zero_()

    def bucket(self, total: int) -> int:
        return token_bucket(total, self.max_tokens)

    def view(self, tokens: int) -> RaggedView:
        """The kernel arguments of a verify over the first `tokens` rows (a bucket); built once
        per bucket, outside any CUDA-graph capture."""
        v = self._views.get(tokens)
        if v is None:
            v = RaggedView(self, tokens)
            self._views[tokens] = v
        return v


class RaggedView:
    """One token bucket T_b of a RaggedLayout: qo_indptr int32[B+2] (the B sequences, then the
    scratch sequence of the T_b - T padding rows), kv_indptr int32[B+2] (sequence b at slot
    b * capacity; the scratch at 0 with kv_len = its own rows and no prefix: its rows see only
    their own, all-zero, mask words, so they read nothing and output 0), kv_lens int32[B+1]."""

    def __init__(self, layout: RaggedLayout, tokens: int) -> None:
        b, dev = layout.batch, layout.device
        self.layout, self.tokens, self.batch = layout, tokens, b
        self.qo = torch.full((b + 2,), tokens, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.zeros(b + 2, dtype=torch.int32, device=dev)
        self.kv_indptr[: b + 1] = torch.arange(b + 1, dtype=torch.int32, device=dev) * (
            layout.capacity
        )
        self.kv_indptr[b] = 0
        self.kv_lens = torch.zeros(b + 1, dtype=torch.int32, device=dev)

    def prepare(self) -> None:
        """Copy this step's offsets in (device ops: part of the bucket's graph)."""
        lay, b = self.layout, self.batch
        self.qo[: b + 1].copy_(lay.qo)
        self.kv_lens[:b].copy_(lay.kv_lens)
        self.kv_lens[b:].copy_(self.tokens - lay.qo[b:])

    def store(
        self,
        qkv: torch.Tensor,
        hq: int,
        hk: int,
        pos: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: torch.Tensor,
    ) -> None:
        """RoPE + K/V store of the T_b rows into their cache slots (padding: none)."""
        rope_scatter_(qkv, hq, hk, pos, self.layout.dst[: self.tokens], *rope, kv)

    def attend(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q: [1, T_b, Hq, D]; kv: [2, B, capacity, KVH, D] -> [1, T_b, Hq, D]."""
        lay = self.layout
        t, hq, d = q.shape[1], q.shape[2], q.shape[3]
        kvh = kv.shape[3]
        args = (
            q.reshape(t, hq, d),
            kv[0].reshape(self.batch * lay.capacity, kvh, d),
            kv[1].reshape(self.batch * lay.capacity, kvh, d),
            self.qo,
            self.kv_indptr,
            lay.bitmask[:t],
            self.kv_lens,
        )
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        if q.is_cuda or interpreted:
            from spectune.kernels.tree_attention import tree_attention as kernel_tree_attention

            config, splits = _TUNED.get((self.batch, lay.nodes, lay.context), (None, None))
            out = kernel_tree_attention(
                *args,
                # no sequence holds more rows than the bucket (at batch 1 a pruned tree is the
                # whole bucket): fewer m-blocks and the split choice of the tree actually kept
                max_q_len=min(lay.max_q_len, t),
                max_kv_len=lay.context + lay.nodes,
                config=config,
                num_splits=splits,
                split_batch=self.batch,  # the scratch (padding) sequence does not count
            )
        else:  # CPU without the interpreter: the kernels' torch reference (host syncs)
            from spectune.kernels.tree_attention_reference import reference_tree_attention as ref

            out = ref(*args).to(q.dtype)
        return out.view(1, t, hq, d)
