"""Fused elementwise work of a decoder layer, so a decode step is a handful of kernels per layer.

Unfused, RMSNorm + residual add, SwiGLU's silu(gate) * up and RoPE are ~15 tiny kernels per
layer; at batch 1 each one costs a launch and a round trip through HBM, which is what keeps a
plain PyTorch decode step far above the weight-streaming floor. Each op here is one Triton
kernel on CUDA tensors and a plain torch expression elsewhere (`reference_*`, also the CPU path).

Bytes per call (bf16, T tokens): add_rmsnorm reads 2*T*H and writes 2*T*H elements; silu_mul
reads 2*T*F and writes T*F; rope rewrites the T*(Hq+Hk)*D query/key elements in place.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


# ---- add + RMSNorm -------------------------------------------------------------------------
@triton.jit
def _add_rmsnorm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, H, eps, HAS_RES: tl.constexpr, BLOCK: tl.constexpr
):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < H
    x = tl.load(x_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
    if HAS_RES:
        x += tl.load(res_ptr + row * H + cols, mask=m, other=0.0).to(tl.float32)
        tl.store(res_ptr + row * H + cols, x.to(res_ptr.dtype.element_ty), mask=m)
    var = tl.sum(x * x, axis=0) / H
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(var + eps) * w
    tl.store(out_ptr + row * H + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def reference_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """residual += x (in place, when given); return rmsnorm(residual or x) * weight."""
    if residual is not None:
        residual.add_(x)
        x = residual
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype)


def add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float = 1e-5,
    use_triton: bool | None = None,
) -> torch.Tensor:
    """x, residual: [..., H] contiguous; weight: [H]. Updates residual in place (residual += x)
    and returns rmsnorm(residual) * weight; without a residual, rmsnorm(x) * weight."""
    if not (x.is_cuda if use_triton is None else use_triton):
        return reference_add_rmsnorm(x, residual, weight, eps)
    h = x.shape[-1]
    rows = x.numel() // h
    out = torch.empty_like(x)
    res = residual if residual is not None else x
    _add_rmsnorm_kernel[(rows,)](
        x,
        res,
        weight,
        out,
        h,
        eps,
        HAS_RES=residual is not None,
        BLOCK=triton.next_power_of_2(h),
        num_warps=8 if h >= 4096 else 4,
    )
    return out


# ---- SwiGLU ----------------------------------------------------------------------------------
@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, F, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    m = cols < F
    g = tl.load(gu_ptr + row * 2 * F + cols, mask=m, other=0.0).to(tl.float32)
    u = tl.load(gu_ptr + row * 2 * F + F + cols, mask=m, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * F + cols, y.to(out_ptr.dtype.element_ty), mask=m)


def reference_silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """gate_up: [..., 2F] (gate first) -> silu(gate) * up: [..., F]."""
    g, u = gate_up.chunk(2, dim=-1)
    return (torch.nn.functional.silu(g.float()) * u.float()).to(gate_up.dtype)


def silu_mul(gate_up: torch.Tensor, use_triton: bool | None = None) -> torch.Tensor:
    """gate_up: [T, 2F] contiguous -> [T, F]."""
    if not (gate_up.is_cuda if use_triton is None else use_triton):
        return reference_silu_mul(gate_up)
    f = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * f)
    out = torch.empty(*gate_up.shape[:-1], f, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(f, block))](gate_up, out, f, BLOCK=block, num_warps=4)
    return out


# ---- rotary position embedding ----------------------------------------------------------------
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
    _rope_kernel[(x.shape[0], heads)](x, pos, cos, sin, x.stride(0), HALF=half, num_warps=1)


# ---- RoPE + K/V store in one pass ----------------------------------------------------------------
@triton.jit
def _rope_store_kernel(
    x_ptr, pos_ptr, dst_ptr, cos_ptr, sin_ptr, kv_ptr, row_stride, n_tok, lo, HQ, HK,
    s_kv, s_b, s_pos, s_h, HALF: tl.constexpr, SCATTER: tl.constexpr,
):  # fmt: skip
    """One (token, head) per program: RoPE on the q and k heads (q written back), k and v into
    the cache: token t of sequence t // n_tok at position lo + t % n_tok, or (SCATTER) at flat
    slot dst[t] of a [B * cap] cache, none where dst[t] < 0 (a padding token)."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, HALF)
    base = x_ptr + t * row_stride + h * 2 * HALF
    x1 = tl.load(base + d)
    x2 = tl.load(base + HALF + d)
    if SCATTER:
        slot = tl.load(dst_ptr + t)
        keep = (d.to(tl.int64) + slot) >= d  # slot >= 0, as a [HALF] mask
        row = kv_ptr + tl.maximum(slot, 0).to(tl.int64) * s_pos
    else:
        keep = d < HALF
        row = kv_ptr + (t // n_tok).to(tl.int64) * s_b + (lo + t % n_tok).to(tl.int64) * s_pos
    if h < HQ + HK:  # q or k head: rotate
        pos = tl.load(pos_ptr + t)
        c = tl.load(cos_ptr + pos * HALF + d)
        s = tl.load(sin_ptr + pos * HALF + d)
        y1 = (x1.to(tl.float32) * c - x2.to(tl.float32) * s).to(x_ptr.dtype.element_ty)
        y2 = (x2.to(tl.float32) * c + x1.to(tl.float32) * s).to(x_ptr.dtype.element_ty)
        if h < HQ:
            tl.store(base + d, y1)
            tl.store(base + HALF + d, y2)
        else:  # k: into the cache
            dst = row + (h - HQ) * s_h
            tl.store(dst + d, y1, mask=keep)
            tl.store(dst + HALF + d, y2, mask=keep)
    else:  # v: copied into the cache as is
        dst = row + s_kv + (h - HQ - HK) * s_h
        tl.store(dst + d, x1, mask=keep)
        tl.store(dst + HALF + d, x2, mask=keep)


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
) -> None:
    """RoPE on the q heads of qkv: [B*N, (hq + 2*hk) * D] (in place) and on the k heads, whose
    rotated values go with the v heads into the cache kv: [2, B, cap, hk, D] at positions
    [lo, lo + N) of each sequence. One kernel instead of RoPE + two strided copies; bytes: read
    qkv once, write q back and K/V into the cache."""
    b = kv.shape[1]
    n = qkv.shape[0] // b
    d = kv.shape[-1]
    if not (qkv.is_cuda if use_triton is None else use_triton):
        reference_rope_(qkv, hq + hk, pos, cos, sin)
        kv[:, :, lo : lo + n].copy_(qkv[:, hq * d :].view(b, n, 2, hk, d).permute(2, 0, 1, 3, 4))
        return
    if kv.stride(-1) != 1 or qkv.stride(-1) != 1:
        raise ValueError("rope_store_ needs a contiguous head dim")
    _rope_store_kernel[(qkv.shape[0], hq + 2 * hk)](
        qkv, pos, pos, cos, sin, kv, qkv.stride(0), n, lo, hq, hk,
        kv.stride(0), kv.stride(1), kv.stride(2), kv.stride(3), HALF=cos.shape[1], SCATTER=False,
        num_warps=1,
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
        _rope_store_kernel[(qkv.shape[0], hq + 2 * hk)](
            qkv, pos, dst, cos, sin, kv, qkv.stride(0), 1, 0, hq, hk,
            kv.stride(0), 0, kv.stride(2), kv.stride(3), HALF=cos.shape[1], SCATTER=True,
            num_warps=1,
        )  # fmt: skip
        return
    d = kv.shape[-1]
    reference_rope_(qkv, hq + hk, pos, cos, sin)
    ok = dst >= 0  # the torch path (CPU tests) may sync with the host
    flat = kv.view(2, b * cap, hk, d)
    flat[:, dst[ok]] = qkv[:, hq * d :].view(-1, 2, hk, d)[ok].transpose(0, 1)
