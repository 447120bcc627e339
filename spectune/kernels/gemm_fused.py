"""Weight GEMMs that carry a decoder layer's elementwise work, for the batch-1 verify step.

At batch 1 with N = 64 tree tokens a Llama-3.1-8B layer is four weight streams (q|k|v 50 MB,
o 34 MB, gate|up 235 MB, down 117 MB in bf16) separated by small kernels: two add + RMSNorm,
silu * up, and for split-K GEMMs a partial-sum reduction and a cast. Each small kernel is a
launch plus a drain of the GEMM before it, time in which HBM streams nothing. `fused_linear`
folds that work into the GEMM:
- prologue RMSNorm (`norm_weight`): y = rmsnorm(x) * g @ W^T = rstd * ((x * g) @ W^T). Every
  program already streams its rows' whole K range of x, so it sums x^2 on the way and scales
  its accumulator by rstd = rsqrt(mean(x^2) + eps) at the end (no normed copy of x is written);
- epilogue residual add (`residual`): residual += x @ W^T in place (the o and down
  projections), so the stream never leaves the GEMM as a separate tensor;
- epilogue SwiGLU (`gated`): W = [gate; up] of 2F rows; each program multiplies the gate rows
  [n, n + BLOCK_N) and the up rows F + [n, n + BLOCK_N) and writes silu(gate) * up [M, F];
- split-K with the reduction inside the launch: each of S programs per output tile writes
  float32 partials, takes a ticket, and the last to arrive sums the S partials (L2-resident,
  S * BLOCK_M * BLOCK_N * 4 bytes) and runs the epilogue. No second kernel, no cast kernel;
- epilogue RoPE + K/V store (`rope`, the q|k|v projection): each program holds one head's two
  halves (paired weight rows h*D + [0, D/2) and + D/2), rotates q and k at each row's position,
  returns q and writes k and v into the cache (spectune.kernels.rope's rope_store_, fused);
- programmatic dependent launch (`pdl`, Hopper+): a launch may start while the kernel before
  it drains and waits in-kernel (griddepcontrol.wait) before its first read or write; before
  the wait a program may pull its weight rows into L2 (`prefetch_k`), as they depend on no
  kernel (the o projection's whole slice while attention runs, for one).

Launch configs, the per-layer plan and the tuner are in gemm_fused_config.py.

Bytes per call (bf16, M tokens): N*K*2 weights (2F*K*2 when gated) + M*K*2 of x (read once per
output tile, from L2 after the first) + M*N_out*2 out (+ M*N_out*2 residual read) + split-K
partials 2*S*M*W_rows*4 (L2). FLOPs: 2*M*K*W_rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from spectune.kernels.gemm_fused_config import FusedLinearConfig
from spectune.kernels.rope import rope_store_
from spectune.kernels.tree_attention import pdl_supported

EPI_PLAIN, EPI_RESIDUAL, EPI_GATED, EPI_ROPE = 0, 1, 2, 3


@triton.jit
def _fused_epilogue(
    acc_a, acc_b, ss, offs_m, offs_n, M, N_OUT, K, eps, OUT, RES, stride_om, stride_rm,
    POS, COS, SIN, KV, s_kv, s_b, s_pos, s_h, lo, n_tok, HQ, HK,
    NORM: tl.constexpr, EPILOGUE: tl.constexpr, BLOCK_N: tl.constexpr,
):  # fmt: skip
    """rstd scaling (NORM), then out = acc | residual + acc | silu(acc_a) * acc_b, or (ROPE)
    head program_id(0)'s two halves rotated at each row's position: q to out, k and v (v not
    rotated) to the cache."""
    if NORM:
        rstd = tl.rsqrt(ss / K + eps)
        acc_a = acc_a * rstd[:, None]
        acc_b = acc_b * rstd[:, None]
    if EPILOGUE == 3:
        _rope_epilogue(
            acc_a, acc_b, offs_m, M, OUT, stride_om, POS, COS, SIN, KV, s_kv, s_b, s_pos, s_h,
            lo, n_tok, HQ, HK, BLOCK_N,
        )  # fmt: skip
    else:
        ok = (offs_m[:, None] < M) & (offs_n[None, :] < N_OUT)
        y = acc_a
        if EPILOGUE == 2:
            y = acc_a / (1.0 + tl.exp(-acc_a)) * acc_b
        if EPILOGUE == 1:
            r = tl.load(RES + offs_m[:, None] * stride_rm + offs_n[None, :], mask=ok, other=0.0)
            y = y + r.to(tl.float32)
        tl.store(
            OUT + offs_m[:, None] * stride_om + offs_n[None, :],
            y.to(OUT.dtype.element_ty),
            mask=ok,
        )


@triton.jit
def _rope_epilogue(
    x1, x2, offs_m, M, OUT, stride_om, POS, COS, SIN, KV, s_kv, s_b, s_pos, s_h, lo, n_tok,
    HQ, HK, HALF: tl.constexpr,
):  # fmt: skip
    """x1, x2: [BM, HALF] the two halves of head h = program_id(0) for rows offs_m (Llama's
    rotate-half RoPE, spectune.kernels.rope). q heads (h < HQ) go to OUT[m, h*D:(h+1)*D];
    k heads (rotated) and v heads (as they are) to the cache kv[0 | 1, m // n_tok,
    lo + m % n_tok, head]."""
    h = tl.program_id(0)
    d = tl.arange(0, HALF)
    m_ok = offs_m < M
    if h < HQ + HK:
        pos = tl.load(POS + offs_m, mask=m_ok, other=0)
        cs = pos.to(tl.int64)[:, None] * HALF + d[None, :]
        c = tl.load(COS + cs, mask=m_ok[:, None], other=0.0)
        s = tl.load(SIN + cs, mask=m_ok[:, None], other=0.0)
        y1 = x1 * c - x2 * s
        y2 = x2 * c + x1 * s
    else:
        y1 = x1
        y2 = x2
    if h < HQ:
        dst = OUT + offs_m.to(tl.int64)[:, None] * stride_om + h * (2 * HALF) + d[None, :]
    else:
        is_v = (h >= HQ + HK).to(tl.int64)
        kvh = h - HQ - is_v * HK
        m64 = offs_m.to(tl.int64)
        row = KV + is_v * s_kv + (m64 // n_tok) * s_b + (lo + m64 % n_tok) * s_pos + kvh * s_h
        dst = row[:, None] + d[None, :]
    tl.store(dst, y1.to(OUT.dtype.element_ty), mask=m_ok[:, None])
    tl.store(dst + HALF, y2.to(OUT.dtype.element_ty), mask=m_ok[:, None])


@triton.jit
def _prefetch_rows(
    W, offs_n, N_OUT, K, k0, k_per_split, prefetch_k, stride_wn, pair, GATED: tl.constexpr
):  # fmt: skip
    """prefetch.global.L2 of one 128-byte line (64 bf16) per element: rows offs_n (and the
    rows `pair` below when GATED: paired tiles), columns [k0, k0 + min(prefetch_k,
    k_per_split)) clamped to K. A prefetch writes nothing, so clamped duplicates are harmless."""
    rows = tl.minimum(offs_n, N_OUT - 1).to(tl.int64)[:, None] * stride_wn
    hi = tl.minimum(k0 + tl.minimum(prefetch_k, k_per_split), K) - 1
    for j in range(0, tl.cdiv(tl.minimum(prefetch_k, k_per_split), 64), 16):  # 16 lines a row
        col = tl.minimum(k0 + (j + tl.arange(0, 16)) * 64, hi)
        tl.inline_asm_elementwise(
            "prefetch.global.L2 [$1]; // $0", "=r,l", [W + rows + col[None, :]],
            dtype=tl.int32, is_pure=False, pack=1,
        )  # fmt: skip
        if GATED:
            tl.inline_asm_elementwise(
                "prefetch.global.L2 [$1]; // $0", "=r,l",
                [W + pair * stride_wn + rows + col[None, :]], dtype=tl.int32, is_pure=False,
                pack=1,
            )  # fmt: skip


@triton.jit(do_not_specialize=["num_splits"])  # one compile serves every split count
def _fused_linear_kernel(
    X, W, NORM_W, OUT, RES, PART, SS, TICKET,
    M, N_OUT, K, k_per_split, num_splits, prefetch_k, eps,
    stride_xm, stride_wn, stride_om, stride_rm, stride_ps, stride_pm, stride_ss,
    POS, COS, SIN, KV, s_kv, s_b, s_pos, s_h, lo, n_tok, HQ, HK,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    NORM: tl.constexpr, EPILOGUE: tl.constexpr, PDL: tl.constexpr, PREFETCH: tl.constexpr,
    EVICT: tl.constexpr,
):  # fmt: skip
    """Program (n tile, split, m block): acc over its K range of x[m, :] @ W[n, :]^T, and of the
    paired rows n + pair (gated: the up rows, pair = N_OUT; rope: the head's second half,
    tile = one head of 2 * BLOCK_N rows, pair = BLOCK_N); with splits, the last arriving
    program of the tile sums the partials and runs the epilogue. PREFETCH: before waiting for
    the previous kernel, pull the first `prefetch_k` columns of this program's rows into L2."""
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    if EPILOGUE == 3:
        offs_n = pid_n * (2 * BLOCK_N) + tl.arange(0, BLOCK_N)
        pair = BLOCK_N
    else:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        pair = N_OUT
    offs_k = tl.arange(0, BLOCK_K)
    n_ok = offs_n < N_OUT
    k0 = pid_s * k_per_split
    if PDL:  # the next launch may start now
        tl.extra.cuda.gdc_launch_dependents()
    if PREFETCH:  # weights depend on no kernel: stream them into L2 while the previous one runs
        _prefetch_rows(
            W, offs_n, N_OUT, K, k0, k_per_split, prefetch_k, stride_wn, pair, EPILOGUE >= 2
        )
    if PDL:  # wait for the previous kernel's writes before touching x, out or the counters
        tl.extra.cuda.gdc_wait()
    acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
    w_rows = W + offs_n.to(tl.int64)[:, None] * stride_wn
    for kk in range(0, k_per_split, BLOCK_K):
        k = k0 + kk + offs_k
        k_ok = k < K
        x = tl.load(
            X + offs_m[:, None] * stride_xm + k[None, :],
            mask=(offs_m[:, None] < M) & k_ok[None, :],
            other=0.0,
        )
        if NORM:
            xf = x.to(tl.float32)
            ss += tl.sum(xf * xf, axis=1)
            g = tl.load(NORM_W + k, mask=k_ok, other=0.0).to(tl.float32)
            x = (xf * g[None, :]).to(W.dtype.element_ty)
        wa = tl.load(
            w_rows + k[None, :], mask=n_ok[:, None] & k_ok[None, :], other=0.0,
            eviction_policy="evict_first" if EVICT else "",
        )  # fmt: skip
        acc_a = tl.dot(x, tl.trans(wa), acc_a)
        if EPILOGUE >= 2:  # paired rows: the up rows (gated), the head's second half (rope)
            wb = tl.load(
                w_rows + pair * stride_wn + k[None, :], mask=n_ok[:, None] & k_ok[None, :],
                other=0.0, eviction_policy="evict_first" if EVICT else "",
            )  # fmt: skip
            acc_b = tl.dot(x, tl.trans(wb), acc_b)
    if num_splits == 1:
        _fused_epilogue(
            acc_a, acc_b, ss, offs_m, offs_n, M, N_OUT, K, eps, OUT, RES, stride_om, stride_rm,
            POS, COS, SIN, KV, s_kv, s_b, s_pos, s_h, lo, n_tok, HQ, HK,
            NORM, EPILOGUE, BLOCK_N,
        )  # fmt: skip
    else:
        # partials [S, M_pad, cols]: a tile's column = its weight row (paired rows at + pair);
        # row sums of squares [S, tiles * BM]
        tile = pid_m * tl.num_programs(0) + pid_n
        p = PART + pid_s * stride_ps + offs_m[:, None] * stride_pm + offs_n[None, :]
        tl.store(p, acc_a)
        if EPILOGUE >= 2:
            tl.store(p + pair, acc_b)
        if NORM:
            tl.store(SS + pid_s * stride_ss + tile * BLOCK_M + tl.arange(0, BLOCK_M), ss)
        # every thread's partial stores precede the release of the ticket
        tl.debug_barrier()
        arrived = tl.atomic_add(TICKET + tile, 1, sem="acq_rel", scope="gpu")
        if arrived == num_splits - 1:
            tl.atomic_xchg(TICKET + tile, 0)  # leave the counter at zero for the next call
            acc_a = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            acc_b = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            ss = tl.zeros((BLOCK_M,), dtype=tl.float32)
            q = PART + offs_m[:, None] * stride_pm + offs_n[None, :]
            # fixed order (a deterministic sum); pipelined, so the S tile loads overlap
            for s in tl.range(0, num_splits, num_stages=3):
                acc_a += tl.load(q + s * stride_ps, cache_modifier=".cg")
                if EPILOGUE >= 2:
                    acc_b += tl.load(q + s * stride_ps + pair, cache_modifier=".cg")
                if NORM:
                    ss += tl.load(
                        SS + s * stride_ss + tile * BLOCK_M + tl.arange(0, BLOCK_M),
                        cache_modifier=".cg",
                    )
            _fused_epilogue(
                acc_a, acc_b, ss, offs_m, offs_n, M, N_OUT, K, eps, OUT, RES, stride_om,
                stride_rm, POS, COS, SIN, KV, s_kv, s_b, s_pos, s_h, lo, n_tok, HQ, HK,
                NORM, EPILOGUE, BLOCK_N,
            )  # fmt: skip


_TICKETS: dict[torch.device, torch.Tensor] = {}


def _tickets(device: torch.device, n: int) -> torch.Tensor:
    """int32 arrival counters, one per output tile, cached per device and left at zero by every
    call (the reducing program resets its counter). Calls on one device must not overlap on two
    streams; the first call of a size must not happen during CUDA-graph capture."""
    buf = _TICKETS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "fused_linear: run one call of this size before CUDA-graph capture "
                "(the split-K counter buffer must grow outside the capture)"
            )
        buf = torch.zeros(max(n, 1 << 14), dtype=torch.int32, device=device)
        _TICKETS[device] = buf
    return buf


@dataclass(frozen=True)
class RopeStore:
    """The q|k|v projection's epilogue as spectune.kernels.rope.rope_store_: RoPE on the q and k
    heads, q returned, rotated k and v written into the cache at positions [lo, lo + tokens)
    of each sequence (row m of x is token m % tokens of sequence m // tokens).

    pos: int64[M]; cos, sin: float32[max_pos, D/2]; kv: [2, B, capacity, kv_heads, D] (this
    layer, head dim contiguous); w's rows are q_heads + 2 * kv_heads heads of D (q, k, v)."""

    pos: torch.Tensor
    cos: torch.Tensor
    sin: torch.Tensor
    kv: torch.Tensor
    lo: int
    tokens: int
    q_heads: int
    kv_heads: int


def reference_fused_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    norm_weight: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    eps: float = 1e-5,
    rope: RopeStore | None = None,
) -> torch.Tensor:
    """The unfused ops in float32: rmsnorm(x) * g (rounded to x's dtype, as add_rmsnorm writes
    it), @ w^T, then silu(gate) * up (gated), residual += (in place, returned), or rope_store_'s
    reference on the result (rope: returns the rotated q heads [M, q_heads * D])."""
    if norm_weight is not None:
        xf = x.float()
        xn = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()
        x = xn.to(x.dtype)
    y = x.float() @ w.float().T
    if gated:
        g, u = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(g) * u
    if residual is not None:
        residual.copy_((residual.float() + y).to(residual.dtype))
        return residual
    if rope is not None:
        qkv = y.to(x.dtype)
        r = rope
        kv = r.kv[:, : qkv.shape[0] // r.tokens]  # rope_store_ takes B from the cache
        rope_store_(qkv, r.q_heads, r.kv_heads, r.pos, r.cos, r.sin, kv, r.lo, use_triton=False)
        return qkv[:, : r.q_heads * r.kv.shape[-1]].contiguous()
    return y.to(x.dtype)


def _check_rope(rope: RopeStore, x: torch.Tensor, w: torch.Tensor) -> None:
    """RopeStore's shapes against x [M, K] and w [W_rows, K]; ValueError names the field."""
    kv, m = rope.kv, x.shape[0]
    d = kv.shape[-1] if kv.dim() == 5 else 0
    if kv.dim() != 5 or kv.shape[0] != 2 or kv.shape[3] != rope.kv_heads or kv.stride(-1) != 1:
        raise ValueError(
            f"rope.kv must be [2, B, capacity, {rope.kv_heads}, D], got {tuple(kv.shape)}"
        )
    if kv.dtype != x.dtype:
        raise ValueError(f"rope.kv must be {x.dtype} like x, got {kv.dtype}")
    if d % 2 or d < 2 or w.shape[0] != (rope.q_heads + 2 * rope.kv_heads) * d:
        raise ValueError(f"w must hold {rope.q_heads} + 2 x {rope.kv_heads} heads of D = {d} rows")
    if rope.cos.shape[1:] != (d // 2,) or rope.sin.shape != rope.cos.shape:
        raise ValueError(f"rope.cos / rope.sin must be [max_pos, {d // 2}]")
    if not (rope.cos.is_contiguous() and rope.sin.is_contiguous()):
        raise ValueError("rope.cos / rope.sin must be contiguous")
    if rope.pos.shape != (m,):
        raise ValueError(f"rope.pos must be int64[{m}], got {tuple(rope.pos.shape)}")
    if rope.tokens < 1 or m % rope.tokens or m // rope.tokens > kv.shape[1]:
        raise ValueError(
            f"rope.tokens {rope.tokens} must split the {m} rows into <= {kv.shape[1]} sequences"
        )
    if rope.lo < 0 or rope.lo + rope.tokens > kv.shape[2]:
        raise ValueError(
            f"positions [{rope.lo}, {rope.lo + rope.tokens}) exceed the cache capacity {kv.shape[2]}"
        )


def fused_linear(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    norm_weight: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    eps: float = 1e-5,
    config: FusedLinearConfig | None = None,
    pdl: bool = False,
    use_triton: bool | None = None,
    rope: RopeStore | None = None,
) -> torch.Tensor:
    """x: [M, K] (last dim contiguous); w: [W_rows, K] contiguous. Returns [M, N_out]:
    - N_out = W_rows: rmsnorm(x) * norm_weight (when given) @ w^T;
    - gated: w = [gate; up] (W_rows = 2F), returns silu(x @ gate^T) * (x @ up^T): [M, F];
    - residual [M, N_out] contiguous: residual += result in place, and returns residual;
    - rope: w = q|k|v heads; RoPE + K/V store (RopeStore) in the epilogue, returns the rotated
      q [M, q_heads * D]; one program per head and split (config.block_n is D / 2).
    pdl: launch as a programmatic dependent launch where the device supports it. The kernel
    runs on CUDA tensors and under the Triton interpreter; elsewhere the torch reference."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if not ((x.is_cuda or interpreted) if use_triton is None else use_triton):
        return reference_fused_linear(x, w, norm_weight, residual, gated, eps, rope)
    cfg = config or FusedLinearConfig()
    if rope is not None:
        _check_rope(rope, x, w)
        cfg = replace(cfg, block_n=rope.kv.shape[-1] // 2)
    if x.dim() != 2 or x.stride(1) != 1:
        raise ValueError(f"x must be [M, K] with a contiguous last dim, got {tuple(x.shape)}")
    m, k = x.shape
    rows = w.shape[0]
    if w.dim() != 2 or w.shape[1] != k or not w.is_contiguous():
        raise ValueError(f"w must be a contiguous [N, {k}] tensor, got {tuple(w.shape)}")
    if gated and rows % 2:
        raise ValueError(f"gated w must have an even row count (gate then up), got {rows}")
    n_out = rows // 2 if gated else rows
    if norm_weight is not None and norm_weight.shape != (k,):
        raise ValueError(f"norm_weight must be [{k}], got {tuple(norm_weight.shape)}")
    if residual is not None and (residual.shape != (m, n_out) or not residual.is_contiguous()):
        raise ValueError(f"residual must be a contiguous [{m}, {n_out}] tensor")
    if sum((gated, residual is not None, rope is not None)) > 1:
        raise ValueError("the gated, residual and rope epilogues do not combine")
    block_m = max(16, min(64, triton.next_power_of_2(m)))
    k_per = triton.cdiv(triton.cdiv(k, max(cfg.splits, 1)), cfg.block_k) * cfg.block_k
    splits = triton.cdiv(k, k_per)
    n_tiles = rows // (2 * cfg.block_n) if rope is not None else triton.cdiv(n_out, cfg.block_n)
    grid = (n_tiles, splits, triton.cdiv(m, block_m))
    if rope is not None:
        out = x.new_empty((m, rope.q_heads * 2 * cfg.block_n))
    else:
        out = residual if residual is not None else x.new_empty((m, n_out))
    if splits > 1:
        tiles = grid[0] * grid[2]
        m_pad = grid[2] * block_m
        n_pad = grid[0] * cfg.block_n
        # partial columns = weight rows: gate (or plain) tiles [0, n_pad), up tiles at
        # [n_out, n_out + n_pad); rope: every row of w
        cols = rows if rope is not None else n_out + n_pad if gated else n_pad
        part = torch.empty((splits, m_pad, cols), dtype=torch.float32, device=x.device)
        ss = torch.empty((splits, tiles * block_m), dtype=torch.float32, device=x.device)
        ticket = _tickets(x.device, tiles)
    else:
        # unused by an unsplit launch, but typed as the split path reads them: the split branch
        # is a runtime branch, so Triton compiles its atomics on TICKET's element type (int32)
        part = ss = torch.empty(1, dtype=torch.float32, device=x.device)
        ticket = _tickets(x.device, 1)
    pdl_on = pdl and pdl_supported(x.device)
    prefetch = pdl_on and cfg.prefetch_k > 0  # inline PTX: a GPU only, never the interpreter
    if rope is not None:
        kv = rope.kv
        rope_args = (
            rope.pos, rope.cos, rope.sin, kv, kv.stride(0), kv.stride(1), kv.stride(2),
            kv.stride(3), rope.lo, rope.tokens, rope.q_heads, rope.kv_heads,
        )  # fmt: skip
        epilogue = EPI_ROPE
    else:
        rope_args = (out, out, out, out, 0, 0, 0, 0, 0, 1, 0, 0)
        epilogue = EPI_GATED if gated else EPI_RESIDUAL if residual is not None else EPI_PLAIN
    _fused_linear_kernel[grid](
        x, w, norm_weight if norm_weight is not None else w, out,
        residual if residual is not None else out, part, ss, ticket,
        m, rows if rope is not None else n_out, k, k_per, splits, cfg.prefetch_k, eps,
        x.stride(0), w.stride(0), out.stride(0), out.stride(0),
        part.stride(0) if splits > 1 else 0, part.stride(1) if splits > 1 else 0,
        ss.stride(0) if splits > 1 else 0, *rope_args,
        BLOCK_M=block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        NORM=norm_weight is not None, EPILOGUE=epilogue,
        PDL=pdl_on, PREFETCH=prefetch, EVICT=cfg.evict_first,
        num_warps=cfg.warps, num_stages=cfg.stages,
        **({"launch_pdl": True} if pdl_on else {}),
    )  # fmt: skip
    return out


def make_fused_linear_inputs(
    m: int,
    rows: int,
    k: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded (x [M, K], w [rows, K] at the executor's weight scale, norm weight [K] around 1,
    residual [M, rows])."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn((m, k), generator=gen)
    w = torch.rand((rows, k), generator=gen) * 0.04 - 0.02
    g = torch.rand(k, generator=gen) + 0.5
    r = torch.randn((m, rows), generator=gen)
    return tuple(t.to(device=device, dtype=dtype) for t in (x, w, g, r))  # type: ignore[return-value]
