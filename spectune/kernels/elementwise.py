"""Fused elementwise work of a decoder layer: residual add + RMSNorm, and SwiGLU's silu * up.

Unfused, RMSNorm + residual add and silu(gate) * up are several tiny kernels per layer; at
batch 1 each one costs a launch and a round trip through HBM, which is what keeps a plain
PyTorch decode step far above the weight-streaming floor. Each op here is one Triton kernel on
CUDA tensors (or under the interpreter when asked) and its plain torch `reference_*` elsewhere.

Bytes per call (bf16, T tokens): add_rmsnorm reads 2*T*H and writes 2*T*H elements (T*H
without a residual); silu_mul reads 2*T*F and writes T*F.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


def _check_rows(name: str, t: torch.Tensor, width: int) -> None:
    if t.shape[-1] != width or not t.is_contiguous():
        raise ValueError(f"{name} must be a contiguous [..., {width}] tensor, got {tuple(t.shape)}")


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
    _check_rows("x", x, h)
    if residual is not None:
        _check_rows("residual", residual, h)
        if residual.shape != x.shape:
            raise ValueError(f"residual {tuple(residual.shape)} and x {tuple(x.shape)} differ")
    if weight.shape != (h,):
        raise ValueError(f"weight must be [{h}], got {tuple(weight.shape)}")
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
    _check_rows("gate_up", gate_up, 2 * f)
    rows = gate_up.numel() // (2 * f)
    out = torch.empty(*gate_up.shape[:-1], f, dtype=gate_up.dtype, device=gate_up.device)
    block = 1024
    _silu_mul_kernel[(rows, triton.cdiv(f, block))](gate_up, out, f, BLOCK=block, num_warps=4)
    return out


@dataclass
class ElementwiseInputs:
    """x, residual: [T, H]; weight: [H]; gate_up: [T, 2F] (gate first)."""

    x: torch.Tensor
    residual: torch.Tensor
    weight: torch.Tensor
    gate_up: torch.Tensor


def make_elementwise_inputs(
    tokens: int,
    hidden: int,
    ffn: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> ElementwiseInputs:
    """Seeded random inputs for add_rmsnorm and silu_mul (norm weights around 1)."""
    gen = torch.Generator(device=device).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device).to(dtype)

    weight = (torch.rand(hidden, generator=gen, device=device) + 0.5).to(dtype)
    return ElementwiseInputs(
        randn(tokens, hidden), randn(tokens, hidden), weight, randn(tokens, 2 * ffn)
    )
