"""Attention of a few query tokens per sequence over a cached prefix plus a masked span of keys.

The drafter's forwards (EAGLE-3 head or draft model) and the target's verify without the tree
kernel attend like this: N new tokens per sequence see the whole prefix (C cached tokens) and,
through a bool mask [B, N, S], a span of S >= N new keys. A draft step's frontier tokens see
every earlier draft slot of their own path, so S counts all draft slots so far, not only the
step's own tokens.

Why this is not tree_attention (tree_attention.py): that kernel's layout puts the masked keys
exactly at the query tokens (tree K/V = the last N_b slots, one bitmask row per query over
those N_b keys) and reads a bitmask built once per verify. Here the masked span is larger than
the query set, and the mask is a dense bool matrix that the drafting loop rebuilds on the
device every draft level (sliced from the step's slot mask); the tensors are dense per-sequence
views [B, KVH, C, D] of a fixed-capacity cache. The span is small (<= MAX_FUSED_SPAN keys),
so one fused kernel computes the span part and merges the prefix partials.

Split in two and merged by log-sum-exp, so no [rows x context] mask is ever built:
- the prefix goes through flash-decoding splits (`_prefix_split_kernel`, few query rows) or a
  flash kernel (torch SDPA / FlashAttention's grouped forward) with the query heads of one KV
  group packed as rows, so each K/V byte is read once per group:
  bytes = B * C * KVH * D * 2 (K and V) * 2 B;
- the span (S <= a few hundred keys) attends with the mask in `_span_merge_kernel`, which also
  merges the prefix partials and unpacks the heads; on CPU, plain torch.

`BACKENDS` records which GPU paths agreed with the reference on this device (`self_check`).
The torch reference and the seeded input builder are in span_attention_reference.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from spectune.kernels.span_attention_reference import reference_span_attention


@dataclass
class SpanBackends:
    """Which GPU paths span_attention uses: the Triton kernels, and FlashAttention's grouped
    forward for the prefix (None: not tried yet; False: missing or disagreeing here)."""

    triton: bool = True
    grouped_flash: bool | None = None


BACKENDS = SpanBackends()


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


def _sm_count(device: torch.device) -> int:
    if device.type != "cuda":
        return 4  # the interpreter: a few programs
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def _prefix_attention_gqa(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """q: [B, N, H, D]; k, v: [B, C, KVH, D] (the cache layout, no copy) -> (out packed
    [B, KVH, G*N, D], lse packed [B, KVH, G*N]) through aten._flash_attention_forward, which
    takes grouped K/V as they are and splits long keys across programs at small batch; None
    where that op is unavailable (then the packed path runs)."""
    if BACKENDS.grouped_flash is False:
        return None
    b, n, h, _ = q.shape
    kvh = k.shape[2]
    try:
        res = torch.ops.aten._flash_attention_forward(
            q, k, v, None, None, n, k.shape[1], 0.0, False, False, scale=scale
        )
    except (RuntimeError, TypeError, AttributeError):
        if BACKENDS.grouped_flash is None:  # the op is missing here: never try it again
            BACKENDS.grouped_flash = False
            return None
        raise
    BACKENDS.grouped_flash = True
    out, lse = res[0], res[1]  # [B, N, H, D], [B, H, N]
    g = h // kvh
    return _pack(out, kvh), lse.reshape(b, kvh, g * n)


def _span_part(
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
def _span_merge_kernel(
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


def _span_merge(
    qp: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor,
    o1: torch.Tensor | None,
    lse1: torch.Tensor | None,
    n: int,
    scale: float,
) -> torch.Tensor:
    """One kernel for the span part, the log-sum-exp merge with the prefix partials and the
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
    _span_merge_kernel[grid](
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


def _check_span(
    q: torch.Tensor,
    k_prefix: torch.Tensor | None,
    v_prefix: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    mask: torch.Tensor,
) -> None:
    b, n, h, d = q.shape
    kvh, s = k_new.shape[1], k_new.shape[2]
    if k_new.shape != (b, kvh, s, d) or v_new.shape != k_new.shape:
        raise ValueError(f"k_new / v_new must be [{b}, KVH, S, {d}], got {tuple(k_new.shape)}")
    if h % kvh:
        raise ValueError(f"{h} query heads are not a multiple of {kvh} KV heads")
    if mask.dtype != torch.bool or mask.shape != (b, n, s):
        raise ValueError(f"mask must be bool[{b}, {n}, {s}], got {mask.dtype} {tuple(mask.shape)}")
    for name, t in (("k_prefix", k_prefix), ("v_prefix", v_prefix)):
        if t is not None and (t.shape[:2] != (b, kvh) or t.shape[3] != d):
            raise ValueError(f"{name} must be [{b}, {kvh}, C, {d}], got {tuple(t.shape)}")


MAX_FUSED_SPAN = 256  # span keys the fused span + merge kernel holds in one tile


def span_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor | None,
    v_prefix: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    mask: torch.Tensor,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """Attention of N query tokens per sequence over its prefix and, through mask, its span.

    q:        [B, N, H, D]      the new tokens' queries (RoPE applied)
    k_prefix: [B, KVH, C, D]    cached prefix keys (None or C == 0: no prefix); v_prefix alike
    k_new:    [B, KVH, S, D]    keys of the span (S >= N; e.g. all draft tokens so far)
    mask:     bool[B, N, S]     query n may see span key s (tree: s is n or an ancestor of n)
    use_triton: the Triton kernels (default: on CUDA tensors while BACKENDS.triton holds)
    returns   [B, N, H, D]
    """
    _check_span(q, k_prefix, v_prefix, k_new, v_new, mask)
    b, n, d = q.shape[0], q.shape[1], q.shape[3]
    kvh = k_new.shape[1]
    scale = 1.0 / math.sqrt(d)
    qp = _pack(q, kvh)
    fused = (q.is_cuda and BACKENDS.triton if use_triton is None else use_triton) and k_new.shape[
        2
    ] <= MAX_FUSED_SPAN
    no_prefix = k_prefix is None or v_prefix is None or k_prefix.shape[2] == 0
    if fused and no_prefix:
        return _span_merge(qp, k_new, v_new, mask, None, None, n, scale)
    if not fused:
        o2, lse2 = _span_part(qp, k_new, v_new, mask, scale)
    if no_prefix:
        return _unpack(o2.to(q.dtype), n)
    assert k_prefix is not None and v_prefix is not None
    if fused and qp.shape[2] <= MAX_SPLIT_ROWS:  # few rows (decode, drafting): split the prefix
        op, lp = _prefix_split(qp, k_prefix, v_prefix, scale)
        return _span_merge(qp, k_new, v_new, mask, op, lp, n, scale)
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
        return _span_merge(qp, k_new, v_new, mask, o1, lse1, n, scale)
    m = torch.maximum(lse1, lse2)
    w1 = torch.exp(lse1 - m)[..., None]
    w2 = torch.exp(lse2 - m)[..., None]
    o = (o1.float() * w1 + o2 * w2) / (w1 + w2)
    return _unpack(o.to(q.dtype), n)


def self_check(device: torch.device) -> float:
    """Relative error of span_attention against the float64 reference on random bf16 inputs at
    a small shape; switches BACKENDS' Triton paths off, then the grouped flash path, while the
    error exceeds 2e-2. Returns the final error."""
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
    ref = reference_span_attention(*args).double()

    def err() -> float:
        return float((span_attention(*args).double() - ref).norm() / ref.norm())

    e = err()
    if e > 2e-2:
        BACKENDS.triton = False
        e = err()
    if e > 2e-2 and BACKENDS.grouped_flash:
        BACKENDS.grouped_flash = False
        e = err()
    return e
