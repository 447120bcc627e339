"""Roofline prices of the operator kinds a transformer forward pass is made of.

Each function returns the time of one kernel (or one fused group of kernels) without its launch
cost, as a float64 array broadcast over its array arguments: max(FLOPs / achievable FLOP/s,
bytes / achievable bytes/s). The cost model adds one launch per kernel separately, so the
breakdown can show launch cost as its own class. Shapes are per tensor-parallel rank.

Sizes: M = tokens (rows), N = output features, K = input features; `wb` = bytes per weight
element, activations are bf16 (ACT_BYTES).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from spectune.specs.calibration import Calibration
from spectune.specs.hardware import HardwareSpec

F64 = NDArray[np.float64]

FLOPS_PER_MAC = 2  # one multiply-accumulate = 2 FLOPs
ACT_BYTES = 2  # activations, logits and attention inputs are bf16
LOGIT_BYTES = 4  # logits are upcast to fp32 for softmax / argmax / top-k
INDEX_BYTES = 4  # int32 token / expert ids
FP8_BYTES = 1  # weights stored at 1 byte run on the fp8 tensor cores where the GPU has them


@dataclass(frozen=True)
class Rates:
    """Achievable rates of one GPU: HardwareSpec peaks x (calibrated or default) efficiencies."""

    peak_bf16_flops: float  # FLOP/s
    peak_fp8_flops: float  # FLOP/s (0: no fp8 units, fp8 weights run at bf16 rate)
    sm_count: int
    weight_bytes_per_s: float  # weight-streaming GEMMs
    attention_bytes_per_s: float  # KV-cache reads
    attention_flops: float  # bf16 FLOP/s reached by attention when compute-bound
    elementwise_bytes_per_s: float
    link_bytes_per_s: float  # per-direction bus bandwidth a ring collective reaches
    link_latency_s: float
    link_step_latency_s: float  # added per ring step (2*(tp-1) per all-reduce, tp-1 per gather)
    launch_s: float  # one kernel inside a CUDA graph
    gemm_fixed_s: float  # one weight GEMM's fixed time beyond its launch
    attention_fixed_s: float  # one attention kernel's fixed time beyond its launch
    eager_launch_s: float  # one kernel without a graph
    gemm_tokens: F64  # [P] M grid of the GEMM efficiency curve (P may be 1)
    gemm_efficiency: F64  # [P] fraction of peak FLOP/s at each grid point
    gemm_tile_m: int
    gemm_tile_n: int
    attention_tile_m: int

    @classmethod
    def resolve(cls, hw: HardwareSpec, cal: Calibration) -> Rates:
        """Fill every None in `cal` from the HardwareSpec's public figures."""

        def pick(value: float | None, default: float) -> float:
            return default if value is None else value

        launch = pick(cal.launch_s, hw.launch_s)
        # eager launches cost at least what graph replays do (keeps time monotone in batch)
        eager = max(cal.eager_launch_s, launch)
        if cal.gemm_tokens:
            grid = np.asarray(cal.gemm_tokens, dtype=np.float64)
            eff = np.asarray(cal.gemm_flops_efficiency, dtype=np.float64)
        else:
            grid = np.ones(1)
            eff = np.array([hw.gemm_efficiency])
        return cls(
            peak_bf16_flops=hw.peak_bf16_flops,
            peak_fp8_flops=hw.peak_fp8_flops,
            sm_count=hw.sm_count,
            weight_bytes_per_s=hw.hbm_bytes_per_s
            * pick(cal.weight_bw_efficiency, hw.hbm_efficiency),
            attention_bytes_per_s=hw.hbm_bytes_per_s
            * pick(cal.attention_bw_efficiency, hw.hbm_efficiency),
            attention_flops=hw.peak_bf16_flops
            * pick(cal.attention_flops_efficiency, hw.gemm_efficiency),
            elementwise_bytes_per_s=hw.hbm_bytes_per_s
            * pick(cal.elementwise_bw_efficiency, hw.hbm_efficiency),
            link_bytes_per_s=hw.interconnect_bytes_per_s * cal.interconnect_efficiency,
            link_latency_s=pick(cal.allreduce_latency_s, hw.interconnect_latency_s),
            link_step_latency_s=cal.allreduce_step_latency_s,
            launch_s=launch,
            gemm_fixed_s=cal.gemm_fixed_s,
            attention_fixed_s=cal.attention_fixed_s,
            eager_launch_s=eager,
            gemm_tokens=grid,
            gemm_efficiency=eff,
            gemm_tile_m=cal.gemm_tile_m,
            gemm_tile_n=cal.gemm_tile_n,
            attention_tile_m=cal.attention_tile_m,
        )

    def gemm_peak(self, weight_bytes: float) -> float:
        """Tensor-core peak for weights of `weight_bytes` per element (fp8 where available)."""
        if weight_bytes <= FP8_BYTES and self.peak_fp8_flops > 0:
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def gemm_eff(self, m: F64) -> F64:
        """Fraction of peak a GEMM with `m` (padded) rows reaches: linear in M between points."""
        return np.interp(m, self.gemm_tokens, self.gemm_efficiency)


def pad_up(x: ArrayLike, tile: float) -> F64:
    """Round up to a multiple of `tile` (tile quantization)."""
    return np.ceil(np.asarray(x, dtype=np.float64) / tile) * tile


def gemm_effective_rows(r: Rates, m: ArrayLike, n: float) -> F64:
    """Rows a GEMM with `m` rows and `n` columns is charged for: M padded to the row tile and,
    once its tiles outnumber the SMs, rounded up so the tiles fill whole waves."""
    m_pad = pad_up(m, r.gemm_tile_m)
    n_tiles = float(np.ceil(n / r.gemm_tile_n))
    tiles = m_pad / r.gemm_tile_m * n_tiles
    waves = np.ceil(tiles / r.sm_count)
    m_wave = waves * r.sm_count / n_tiles * r.gemm_tile_m  # rows that fill those waves exactly
    return np.where(tiles >= r.sm_count, np.maximum(m_wave, m_pad), m_pad)


def gemm_time(r: Rates, m: ArrayLike, n: float, k: float, wb: float) -> F64:
    """One weight GEMM [M, K] x [K, N].

    time = max(FLOPs / (peak * eff(M_eff)), bytes / weight bandwidth) + gemm_fixed_s;
    FLOPs = 2 * M_eff * N * K, where M_eff is M padded to the row tile and, once the tiles
    outnumber the SMs, rounded up to whole waves (tiles = ceil(M/tm) * ceil(N/tn) over
    `sm_count` SMs; a partial last wave costs a full one). Fewer tiles than SMs cost no extra:
    libraries split K to fill the GPU.
    bytes = N*K*wb (weights, read once) + M*K*2 (input) + M*N*2 (output).
    """
    m = np.asarray(m, dtype=np.float64)
    m_eff = gemm_effective_rows(r, m, n)
    flops = FLOPS_PER_MAC * m_eff * n * k
    compute = flops / (r.gemm_peak(wb) * r.gemm_eff(m_eff))
    bytes_ = n * k * wb + m * (k + n) * ACT_BYTES
    memory = bytes_ / r.weight_bytes_per_s
    return np.where(m > 0, np.maximum(compute, memory) + r.gemm_fixed_s, 0.0)


def expected_experts(tokens: ArrayLike, experts: int, topk: int) -> F64:
    """Expected distinct experts that `tokens` tokens route to, each picking `topk` of `experts`
    uniformly: E * (1 - (1 - k/E)^T). 0 tokens touch none; many tokens touch all E."""
    t = np.asarray(tokens, dtype=np.float64)
    return (
        experts * -np.expm1(t * np.log1p(-topk / experts)) if topk < experts else 0.0 * t + experts
    )


def moe_experts_time(
    r: Rates, tokens: ArrayLike, experts: int, topk: int, hidden: int, ffn: float, wb: float
) -> F64:
    """Grouped SwiGLU GEMMs of the routed experts (gate+up: hidden -> 2*ffn, down: ffn -> hidden).

    D = expected distinct experts; each holds T*k/D rows on average, padded to the row tile.
    FLOPs = 2 * D * pad(T*k/D) * 3 * hidden * ffn.
    bytes = D * 3*hidden*ffn*wb (weights of touched experts only)
            + T*k*(hidden + 2*ffn + ffn + hidden)*2 (activations in/out of both GEMMs).
    """
    t = np.asarray(tokens, dtype=np.float64)
    d = expected_experts(t, experts, topk)
    rows = np.divide(t * topk, d, out=np.zeros_like(t), where=d > 0)
    rows_pad = pad_up(rows, r.gemm_tile_m)
    flops = FLOPS_PER_MAC * d * rows_pad * 3 * hidden * ffn
    compute = flops / (r.gemm_peak(wb) * r.gemm_eff(rows_pad))
    bytes_ = d * 3 * hidden * ffn * wb + t * topk * (2 * hidden + 3 * ffn) * ACT_BYTES
    busy = np.maximum(compute, bytes_ / r.weight_bytes_per_s) + 2 * r.gemm_fixed_s  # 2 GEMMs
    return np.where(t > 0, busy, 0.0)


def attention_time(r: Rates, kv_bytes: ArrayLike, flops: ArrayLike, io_bytes: ArrayLike) -> F64:
    """Attention over cached + new keys: max(FLOPs / attention FLOP/s, bytes / attention
    bytes/s) + attention_fixed_s. Callers count KV bytes once per KV-head group and FLOPs over
    padded query rows; io_bytes = Q read + O write."""
    kv = np.asarray(kv_bytes, dtype=np.float64) + np.asarray(io_bytes, dtype=np.float64)
    busy = np.maximum(
        np.asarray(flops, dtype=np.float64) / r.attention_flops, kv / r.attention_bytes_per_s
    )
    return np.where(kv > 0, busy + r.attention_fixed_s, 0.0)


def elementwise_time(r: Rates, bytes_: ArrayLike) -> F64:
    """A memory-bound kernel moving `bytes_` (norms, RoPE, activation, KV write, logits pass)."""
    return np.asarray(bytes_, dtype=np.float64) / r.elementwise_bytes_per_s


def allreduce_time(r: Rates, bytes_: ArrayLike, tp: int) -> F64:
    """Ring all-reduce of `bytes_` over `tp` ranks: each link carries 2*(tp-1)/tp * bytes,
    plus a fixed latency and one step latency per each of the 2*(tp-1) ring steps. Zero for
    tp = 1."""
    b = np.asarray(bytes_, dtype=np.float64)
    if tp == 1:
        return np.zeros_like(b)
    steps = 2 * (tp - 1)
    return steps / tp * b / r.link_bytes_per_s + r.link_latency_s + steps * r.link_step_latency_s


def allgather_time(r: Rates, bytes_: ArrayLike, tp: int) -> F64:
    """Ring all-gather of a tensor of `bytes_` total: (tp-1)/tp * bytes per link + latency
    (+ tp-1 step latencies)."""
    b = np.asarray(bytes_, dtype=np.float64)
    if tp == 1:
        return np.zeros_like(b)
    steps = tp - 1
    return steps / tp * b / r.link_bytes_per_s + r.link_latency_s + steps * r.link_step_latency_s
