"""Rotary position embedding (Llama's rotate-half convention), alone or fused with the K/V store.

A decoder layer's fused q|k|v projection gives rows [T, (Hq + 2 * Hk) * D]. `rope_` rotates the
q and k heads in place; `rope_store_` does that and writes the rotated k and the v heads into
the KV cache in the same pass (one kernel instead of RoPE + two strided copies), at contiguous
positions per sequence; `rope_scatter_` does the same for packed (ragged) tokens, each to its
own flat cache slot. Each is one Triton kernel on CUDA tensors (or under the interpreter when
asked) and plain torch elsewhere.

Bytes per call (bf16, T tokens): rope_ rewrites the T * (Hq + Hk) * D q/k elements in place;
rope_store_ / rope_scatter_ read qkv once, write q back and K/V into the cache.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from spectune.kernels.tree_attention import pdl_supported


@triton.jit
def _rope_kernel(x_ptr, pos_ptr, cos_ptr, sin_ptr, row_stride, HALF: tl.constexpr):
    t = tl.program_id(0)
    h = tl.program_id(1)
    pos = tl.load(pos_ptr + t)
    d = tl.arange(0, HALF)
    base = x_ptr + t * row_stride + h * 2 * HALF
    x1 = tl.load(base + d).to(tl.float32)
    x2 = tl.load(base + HALF + d).to(tl.float32)
    c = tl.load(cos_ptr + pos * HALF + d)
    s = tl.load(sin_ptr + pos * HALF + d)
    tl.store(base + d, (x1 * c - x2 * s).to(x_ptr.dtype.element_ty))
    tl.store(base + HALF + d, (x2 * c + x1 * s).to(x_ptr.dtype.element_ty))


def rope_tables(
    max_pos: int, head_dim: int, theta: float, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: float32[max_pos, head_dim // 2] (Llama's rotate-half convention)."""
    inv = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, dtype=torch.float64, device=device) / head_dim
    )
    ang = torch.arange(max_pos, dtype=torch.float64, device=device)[:, None] * inv[None, :]
    return ang.cos().float(), ang.sin().float()


def reference_rope_(
    x: torch.Tensor, heads: int, pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> None:
    """Rotate the first `heads` heads of x: [T, W] (W >= heads * D) in place at positions pos: int64[T]."""
    half = cos.shape[1]
    v = x[:, : heads * 2 * half].view(x.shape[0], heads, 2, half)
    c, s = cos[pos][:, None, :], sin[pos][:, None, :]
    x1, x2 = v[:, :, 0].float(), v[:, :, 1].float()
    out = torch.stack((x1 * c - x2 * s, x2 * c + x1 * s), dim=2).to(x.dtype)
    v.copy_(out)


def rope_(
    x: torch.Tensor,
    heads: int,
    pos: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    use_triton: bool | None = None,
) -> None:
    """In place on the first `heads` heads of each row of x: [T, W] (the fused q|k|v projection
    output, q and k heads first). pos: int64[T]."""
    if not (x.is_cuda if use_triton is None else use_triton):
        reference_rope_(x, heads, pos, cos, sin)
        return
    half = cos.shape[1]
    if x.dim() != 2 or x.stride(-1) != 1 or x.shape[1] < heads * 2 * half:
        raise ValueError(f"x must be [T, >= {heads * 2 * half}] with a contiguous last dim")
    if pos.shape != (x.shape[0],):
        raise ValueError(f"pos must be int64[{x.shape[0]}], got {tuple(pos.shape)}")
    _rope_kernel[(x.shape[0], heads)](x, pos, cos, sin, x.stride(0), HALF=half, num_warps=1)


# ---- RoPE + K/V store in one pass ----------------------------------------------------------------
#: heads one rope_store program handles (at most; fewer when the row has fewer): a block of
#: heads per program moves HEADS_PER_PROGRAM * head_dim * 2 * 2 bytes (read + write), 8 KiB
#: for 16 heads of 128 bf16, and runs at the copy bandwidth from a few hundred tokens on; one
#: head per program (256 bytes) reaches a quarter of it at 4096 tokens (H100: 34 vs 129 us a
#: layer, benchmarks/results/forward_curve_h100)
HEADS_PER_PROGRAM = 16


def _heads_block(heads: int) -> int:
    """The head block of a rope_store launch over rows of `heads` heads (a power of two)."""
    return min(HEADS_PER_PROGRAM, triton.next_power_of_2(heads))


@triton.jit
def _rope_store_kernel(
    x_ptr, pos_ptr, dst_ptr, cos_ptr, sin_ptr, kv_ptr, row_stride, n_tok, lo, HQ, HK,
    s_kv, s_b, s_pos, s_h, HALF: tl.constexpr, SCATTER: tl.constexpr, BLOCK_H: tl.constexpr,
    PDL: tl.constexpr = False,
):  # fmt: skip
    """Token t, heads [BLOCK_H * j, BLOCK_H * (j + 1)) of its q|k|v row per program (t, j): RoPE
    on the q and k heads (q written back), k and v into the cache: token t of sequence
    t // n_tok at position lo + t % n_tok, or (SCATTER) at flat slot dst[t] of a [B * cap]
    cache, none where dst[t] < 0 (a padding token). Heads past HQ + 2 * HK are masked. PDL:
    launched early (programmatic dependent launch), it waits for the previous kernel before any
    access."""
    t = tl.program_id(0)
    h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)  # [BLOCK_H] head of the row
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    d = tl.arange(0, HALF)
    live = h < HQ + 2 * HK
    hd = h[:, None] * (2 * HALF) + d[None, :]  # [BLOCK_H, HALF] offsets in the row
    m2 = live[:, None] & (d[None, :] < HALF)
    base = x_ptr + t * row_stride
    x1 = tl.load(base + hd, mask=m2, other=0.0)
    x2 = tl.load(base + hd + HALF, mask=m2, other=0.0)
    pos = tl.load(pos_ptr + t)
    c = tl.load(cos_ptr + pos * HALF + d)[None, :]
    s = tl.load(sin_ptr + pos * HALF + d)[None, :]
    rot = (h < HQ + HK)[:, None]  # q and k heads rotate; v heads are copied as they are
    y1 = tl.where(rot, x1.to(tl.float32) * c - x2.to(tl.float32) * s, x1.to(tl.float32))
    y2 = tl.where(rot, x2.to(tl.float32) * c + x1.to(tl.float32) * s, x2.to(tl.float32))
    y1 = y1.to(x_ptr.dtype.element_ty)
    y2 = y2.to(x_ptr.dtype.element_ty)
    q = (h < HQ)[:, None] & m2
    tl.store(base + hd, y1, mask=q)
    tl.store(base + hd + HALF, y2, mask=q)
    cached = (h >= HQ)[:, None] & m2
    if SCATTER:
        slot = tl.load(dst_ptr + t)
        cached = cached & ((d.to(tl.int64) + slot) >= d)[None, :]  # slot >= 0, as a [1, HALF] mask
        row = kv_ptr + tl.maximum(slot, 0).to(tl.int64) * s_pos
    else:
        row = kv_ptr + (t // n_tok).to(tl.int64) * s_b + (lo + t % n_tok).to(tl.int64) * s_pos
    # k heads HQ .. HQ+HK-1 -> cache K head h - HQ; v heads -> cache V head h - HQ - HK
    is_v = h >= HQ + HK
    kvh = tl.where(is_v, h - HQ - HK, h - HQ)
    kvh = tl.maximum(kvh, 0)  # q lanes (masked) point at head 0
    dst = row + tl.where(is_v, s_kv, 0)[:, None] + kvh[:, None] * s_h + d[None, :]
    tl.store(dst, y1, mask=cached)
    tl.store(dst + HALF, y2, mask=cached)


def rope_store_(
    qkv: torch.Tensor,
    hq: int,
    hk: int,
    pos: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: torch.Tensor,
    lo: int,
    use_triton: bool | None = None,
    pdl: bool = False,
) -> None:
    """RoPE on the q heads of qkv: [B*N, (hq + 2*hk) * D] (in place) and on the k heads, whose
    rotated values go with the v heads into the cache kv: [2, B, cap, hk, D] at positions
    [lo, lo + N) of each sequence. One kernel instead of RoPE + two strided copies; bytes: read
    qkv once, write q back and K/V into the cache. pdl: a programmatic dependent launch where
    the device supports it (spectune.kernels.tree_attention.pdl_supported)."""
    b = kv.shape[1]
    n = qkv.shape[0] // b
    d = kv.shape[-1]
    if not (qkv.is_cuda if use_triton is None else use_triton):
        reference_rope_(qkv, hq + hk, pos, cos, sin)
        kv[:, :, lo : lo + n].copy_(qkv[:, hq * d :].view(b, n, 2, hk, d).permute(2, 0, 1, 3, 4))
        return
    if kv.stride(-1) != 1 or qkv.stride(-1) != 1:
        raise ValueError("rope_store_ needs a contiguous head dim")
    pdl_on = pdl and pdl_supported(qkv.device)
    bh = _heads_block(hq + 2 * hk)
    _rope_store_kernel[(qkv.shape[0], triton.cdiv(hq + 2 * hk, bh))](
        qkv, pos, pos, cos, sin, kv, qkv.stride(0), n, lo, hq, hk,
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), HALF=cos.shape[1], SCATTER=False,
        BLOCK_H=bh, PDL=pdl_on, num_warps=4, **({"launch_pdl": True} if pdl_on else {}),
    )  # fmt: skip


def rope_scatter_(
    qkv: torch.Tensor,
    hq: int,
    hk: int,
    pos: torch.Tensor,
    dst: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    kv: torch.Tensor,
    use_triton: bool | None = None,
) -> None:
    """rope_store_ for packed (ragged) tokens: RoPE on the q and k heads of qkv: [T, (hq + 2*hk)
    * D] (q in place) and K/V of token t into flat slot dst[t] of kv: [2, B, cap, hk, D] (slot =
    b * cap + position; dst < 0: not stored). pos, dst: int64[T]. Same kernel and bytes."""
    b, cap = kv.shape[1], kv.shape[2]
    if kv.stride(1) != cap * kv.stride(2) or kv.stride(-1) != 1 or qkv.stride(-1) != 1:
        raise ValueError("rope_scatter_ needs a [2, B, cap, KVH, D] cache with flat slots")
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if qkv.is_cuda or interpreted if use_triton is None else use_triton:
        bh = _heads_block(hq + 2 * hk)
        _rope_store_kernel[(qkv.shape[0], triton.cdiv(hq + 2 * hk, bh))](
            qkv, pos, dst, cos, sin, kv, qkv.stride(0), 1, 0, hq, hk,
            kv.stride(0), 0, kv.stride(2), kv.stride(3), HALF=cos.shape[1], SCATTER=True,
            BLOCK_H=bh, num_warps=4,
        )  # fmt: skip
        return
    d = kv.shape[-1]
    reference_rope_(qkv, hq + hk, pos, cos, sin)
    ok = dst >= 0  # the torch path (CPU tests) may sync with the host
    flat = kv.view(2, b * cap, hk, d)
    flat[:, dst[ok]] = qkv[:, hq * d :].view(-1, 2, hk, d)[ok].transpose(0, 1)


@dataclass
class RopeInputs:
    """qkv: [B*N, (hq + 2*hk) * D]; pos: int64[B*N]; cos, sin: float32[max_pos, D/2];
    kv: [2, B, capacity, hk, D] (zeros); dst: int64[B*N] flat cache slots (-1: not stored)."""

    qkv: torch.Tensor
    pos: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    kv: torch.Tensor
    dst: torch.Tensor
    hq: int
    hk: int


def make_rope_inputs(
    batch: int,
    tokens: int,
    hq: int,
    hk: int,
    head_dim: int,
    capacity: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    max_pos: int = 64,
) -> RopeInputs:
    """Seeded random inputs for the three RoPE ops: positions below max_pos, and for the scatter
    distinct slots of each sequence's row with about a quarter of the tokens not stored."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    t = batch * tokens
    qkv = torch.randn((t, (hq + 2 * hk) * head_dim), generator=gen).to(dtype)
    pos = torch.randint(0, max_pos, (t,), generator=gen)
    slots = torch.stack(
        [b * capacity + torch.randperm(capacity, generator=gen)[:tokens] for b in range(batch)]
    )
    keep = torch.rand((batch, tokens), generator=gen) >= 0.25
    dst = torch.where(keep, slots, -1).reshape(-1)
    cos, sin = rope_tables(max_pos, head_dim, 10000.0, torch.device("cpu"))
    kv = torch.zeros((2, batch, capacity, hk, head_dim), dtype=dtype)
    return RopeInputs(
        qkv.to(device),
        pos.to(device),
        cos.to(device),
        sin.to(device),
        kv.to(device),
        dst.to(device),
        hq,
        hk,
    )
