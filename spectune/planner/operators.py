"""Roofline prices of the operator kinds a transformer forward pass is made of.

Each function returns the time of one kernel (or one fused group of kernels) without its launch
cost, as a float64 array broadcast over its array arguments: max(FLOPs / achievable FLOP/s,
bytes / achievable bytes/s). The cost model adds one launch per kernel separately, so the
breakdown can show launch cost as its own class. Shapes are per tensor-parallel rank.

Sizes: M = tokens (rows), N = output features, K = input features; a weight GEMM's
`GemmFormat` says how its weights are stored and multiplied (bytes per weight element with the
group scales, which tensor cores, what in-register dequantization costs: specs.quant);
activations are bf16 (ACT_BYTES).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from spectune.specs.calibration import Calibration, link_factor, link_law_time
from spectune.specs.errors import SpecError
from spectune.specs.hardware import HardwareSpec
from spectune.specs.quant import linear_weight_bytes, tensor_units

F64 = NDArray[np.float64]

FLOPS_PER_MAC = 2  # one multiply-accumulate = 2 FLOPs
ACT_BYTES = 2  # activations, logits and attention inputs are bf16
LOGIT_BYTES = 4  # logits are upcast to fp32 for softmax / argmax / top-k
INDEX_BYTES = 4  # int32 token / expert ids
FP8_BYTES = 1  # weights stored at 1 byte run on the fp8 tensor cores where the GPU has them


@dataclass(frozen=True)
class GemmFormat:
    """How one weight GEMM stores and multiplies its weights (Rates.gemm_format builds it).

    weight_bytes:  bytes per weight element, group scales included
    peak_flops:    FLOP/s of the tensor cores its MMAs run on
    flops_scale:   multiplies the GEMM efficiency curve: 1 for native formats; for weight-only
                   formats the share of the bf16 rate left after dequantizing every weight in
                   registers (Calibration.weight_only_flops_efficiency)
    bw_scale:      multiplies the weight-streaming bandwidth (1; weight-only formats:
                   Calibration.weight_only_bw_efficiency)
    tile_m:        row tile M is padded to
    act_bytes:     bytes per activation element an input-quantization kernel writes before
                   the GEMM (fp8/int8: 1, fp4: 0.5); 0: none (the GEMM reads bf16 directly)
    """

    weight_bytes: float
    peak_flops: float
    flops_scale: float
    bw_scale: float
    tile_m: int
    act_bytes: float

    @property
    def kernels(self) -> int:
        """Kernels one GEMM launches: the GEMM, plus the input quantization where there is one."""
        return 2 if self.act_bytes else 1


@dataclass(frozen=True)
class Rates:
    """Achievable rates of one GPU: HardwareSpec peaks x (calibrated or default) efficiencies."""

    peak_bf16_flops: float  # FLOP/s
    peak_fp8_flops: float  # FLOP/s (0: no fp8 units, fp8 weights run at bf16 rate)
    peak_int8_ops: float  # OP/s (0: no int8 tensor cores)
    peak_fp4_flops: float  # FLOP/s (0: no fp4 tensor cores)
    weight_only_flops_scale: float  # share of the bf16 GEMM rate a dequantizing GEMM keeps
    weight_only_bw_scale: float  # share of the weight bandwidth a dequantizing GEMM reaches
    weight_only_tile_m: int  # row tile of dequantizing (Marlin-class) GEMMs
    sm_count: int
    weight_bytes_per_s: float  # weight-streaming GEMMs
    attention_bytes_per_s: float  # KV-cache reads
    attention_flops: float  # bf16 FLOP/s reached by attention when compute-bound
    elementwise_bytes_per_s: float
    link_bytes_per_s: float  # per-direction bus bandwidth a ring collective reaches
    link_latency_s: float
    link_step_latency_s: float  # added per ring step (2*(tp-1) per all-reduce, tp-1 per gather)
    allreduce_law: tuple[tuple[float, ...], ...]  # fitted regimes per tp (Calibration's)
    allgather_law: tuple[tuple[float, ...], ...]
    tp_gemm_scale: tuple[tuple[float, ...], ...]  # (tp, hidden, rows, factor) (Calibration's)
    launch_s: float  # one kernel inside a CUDA graph
    gemm_fixed_s: float  # one weight GEMM's fixed time beyond its launch
    gemm_exposed_compute: float  # share of a streaming GEMM's math at peak its stream adds
    attention_fixed_s: float  # one attention kernel's fixed time beyond its launch
    attention_split_s: float  # what a split (flash-decoding) attention launch adds
    elementwise_floor_s: float  # least time of one memory-bound kernel
    eager_launch_s: float  # one kernel without a graph
    gemm_tokens: F64  # [P] M grid of the GEMM efficiency curve (P may be 1)
    gemm_efficiency: F64  # [P] fraction of peak FLOP/s at each grid point
    gemm_tile_m: int
    gemm_tile_n: int
    gemm_wave_tail: float  # share of a partial last wave charged whole (Calibration)
    attention_tile_m: int
    attention_tile_max_m: int
    ragged_tile_m: int  # query-row tile of a ragged verify's attention (Calibration)

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
            peak_int8_ops=hw.peak_int8_ops,
            peak_fp4_flops=hw.peak_fp4_flops,
            weight_only_flops_scale=cal.weight_only_flops_efficiency,
            weight_only_bw_scale=cal.weight_only_bw_efficiency,
            weight_only_tile_m=cal.weight_only_tile_m,
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
            allreduce_law=_bounded(cal.allreduce_law, "allreduce_law", hw),
            allgather_law=_bounded(cal.allgather_law, "allgather_law", hw),
            tp_gemm_scale=cal.tp_gemm_scale,
            launch_s=launch,
            gemm_fixed_s=cal.gemm_fixed_s,
            gemm_exposed_compute=cal.gemm_exposed_compute,
            attention_fixed_s=cal.attention_fixed_s,
            attention_split_s=cal.attention_split_s,
            elementwise_floor_s=cal.elementwise_floor_s,
            eager_launch_s=eager,
            gemm_tokens=grid,
            gemm_efficiency=eff,
            gemm_tile_m=cal.gemm_tile_m,
            gemm_tile_n=cal.gemm_tile_n,
            gemm_wave_tail=cal.gemm_wave_tail,
            attention_tile_m=cal.attention_tile_m,
            attention_tile_max_m=cal.attention_tile_max_m,
            ragged_tile_m=cal.ragged_tile_m,
        )

    def gemm_peak(self, weight_bytes: float) -> float:
        """Tensor-core peak for weights of `weight_bytes` per element (fp8 where available)."""
        if weight_bytes <= FP8_BYTES and self.peak_fp8_flops > 0:
            return self.peak_fp8_flops
        return self.peak_bf16_flops

    def dense_format(self, weight_bytes: float) -> GemmFormat:
        """A dense weight GEMM: bf16 weights on bf16 tensor cores, or 1-byte weights on the fp8
        units where the GPU has them (quantizing their bf16 input per token first)."""
        fp8 = weight_bytes <= FP8_BYTES and self.peak_fp8_flops > 0
        return GemmFormat(
            weight_bytes=float(weight_bytes),
            peak_flops=self.gemm_peak(weight_bytes),
            flops_scale=1.0,
            bw_scale=1.0,
            tile_m=self.gemm_tile_m,
            act_bytes=FP8_BYTES if fp8 else 0.0,
        )

    def gemm_format(self, weight_format: str, group: int, dtype_bytes: float) -> GemmFormat:
        """The GemmFormat of a ModelSpec's linear layers (specs.quant): native fp8/int8/fp4
        GEMMs on their units, where the GPU has them, behind a per-token input quantization;
        weight-only formats (w4a16, and fp4/int8 without their units) on bf16 tensor cores at
        the dequantization's share of the rate and Marlin's 16-row tile; '' dense."""
        if not weight_format:
            return self.dense_format(dtype_bytes)
        wb = linear_weight_bytes(weight_format, group, dtype_bytes)
        units = tensor_units(
            weight_format,
            fp8=self.peak_fp8_flops > 0,
            int8=self.peak_int8_ops > 0,
            fp4=self.peak_fp4_flops > 0,
        )
        if units == "weight-only":
            return GemmFormat(
                weight_bytes=wb,
                peak_flops=self.peak_bf16_flops,
                flops_scale=self.weight_only_flops_scale,
                bw_scale=self.weight_only_bw_scale,
                tile_m=self.weight_only_tile_m,
                act_bytes=0.0,
            )
        peak = {"fp8": self.peak_fp8_flops, "int8": self.peak_int8_ops}.get(
            units, self.peak_fp4_flops
        )
        return GemmFormat(
            weight_bytes=wb,
            peak_flops=peak,
            flops_scale=1.0,
            bw_scale=1.0,
            tile_m=self.gemm_tile_m,
            act_bytes=0.5 if units == "fp4" else 1.0,
        )

    def gemm_eff(self, m: F64) -> F64:
        """Fraction of peak a GEMM with `m` (padded) rows reaches: linear in M between points."""
        return np.interp(m, self.gemm_tokens, self.gemm_efficiency)


def _bounded(
    rows: tuple[tuple[float, ...], ...], name: str, hw: HardwareSpec
) -> tuple[tuple[float, ...], ...]:
    """`rows` of a fitted collective law, checked against the GPU's published link: no regime's
    bus bandwidth may pass HardwareSpec.interconnect_bytes_per_s (SpecError naming the field)."""
    for r in rows:
        if r[3] > hw.interconnect_bytes_per_s * (1 + 1e-9):
            raise SpecError(
                f"calibration field {name!r}: a tp {int(r[0])} regime reaches "
                f"{r[3] / 1e9:.0f} GB/s, past {hw.name}'s published link bandwidth "
                f"{hw.interconnect_bytes_per_s / 1e9:.0f} GB/s per direction (refit, or "
                "check the calibration's hardware)"
            )
    return rows


def pad_up(x: ArrayLike, tile: ArrayLike) -> F64:
    """Round up to a multiple of `tile` (tile quantization)."""
    t = np.asarray(tile, dtype=np.float64)
    return np.ceil(np.asarray(x, dtype=np.float64) / t) * t


#: (sequence, KV head) groups up to which a tree attention launch caps its row tile at 64
FEW_GROUPS = 16


def attention_row_tile(r: Rates, rows_per_group: ArrayLike, groups: ArrayLike) -> F64:
    """Query-row tile of one tree attention launch over `groups` (sequence, KV head) groups of
    `rows_per_group` packed (token, head) rows each: the next power of two from
    r.attention_tile_m up to r.attention_tile_max_m, at most 64 over FEW_GROUPS groups or
    fewer (spectune's executor: kernels/tree_attention_config.py default_config, where few
    groups prefer 64-row tiles that give the KV splits more programs)."""
    rows = np.maximum(np.asarray(rows_per_group, dtype=np.float64), 1.0)
    t = np.exp2(np.ceil(np.log2(rows)))
    top = np.where(np.asarray(groups) <= FEW_GROUPS, min(64, r.attention_tile_max_m),
                   r.attention_tile_max_m)  # fmt: skip
    return np.clip(t, r.attention_tile_m, np.maximum(top, r.attention_tile_m))


#: shared memory per SM that tree attention programs may take, bytes (Hopper's 228 KiB less
#: the 1 KiB reserved per block: kernels/tree_attention_config.py SM_SMEM_BYTES)
SM_SMEM_BYTES = 233472
#: prefix keys from which attention_splits prices a split launch: from here on the kernels'
#: split chooser splits every launch of at most half the resident slots (checked over batch
#: 1-64, 1-64 tree tokens, 1-8 KV heads of 1-8 query heads each by
#: tests/test_ragged_verify_cost.py); over shorter prefixes it weighs the merge and the partials
#: against the shorter chunks, and 45 of 758 such launches run whole at 1024 keys
SPLIT_MIN_PREFIX = 2048


def attention_slots(
    r: Rates, tile: ArrayLike, rows_per_group: ArrayLike, head_dim: int, kv_bytes: float
) -> F64:
    """Tree attention programs resident on the whole GPU at once for a launch of `tile`-row
    tiles over groups of `rows_per_group` rows: sm_count x min(by shared memory, by registers,
    4). Groups of up to 64 rows run 64-key blocks in 4 pipeline stages on 4 warps; larger ones 3
    stages, in 64-row tiles of 64-key blocks on 4 warps or 128-row tiles of 128-key blocks on 8
    warps; a program holds its stages' K and V blocks and its Q tile, (stages * 2 * block_n + tile) *
    head_dim * kv_bytes + 1 KiB, and 128 registers per thread of a 64K-register file
    (kernels/tree_attention_config.py default_config, resident_programs)."""
    t = np.asarray(tile, dtype=np.float64)
    big = t > 64
    stages = np.where(np.asarray(rows_per_group) > 64, 3, 4)
    block_n = np.where(big, 128, 64)
    warps = np.where(big, 8, 4)
    smem = (stages * 2 * block_n + t) * head_dim * kv_bytes + 1024
    by_smem = np.maximum(1, np.floor(SM_SMEM_BYTES / smem))
    by_regs = np.maximum(1, np.floor(65536 / (warps * 32 * 128)))
    return r.sm_count * np.minimum(np.minimum(by_smem, by_regs), 4)


def attention_splits(
    r: Rates,
    programs: ArrayLike,
    prefix: ArrayLike,
    tile: ArrayLike,
    rows_per_group: ArrayLike,
    head_dim: int,
    kv_bytes: float,
) -> np.ndarray:
    """Whether a tree attention launch of `programs` (sequence, KV head, row tile) programs over
    `prefix` cached keys each cuts the prefix into splits: where the programs fill at most half
    the resident slots (attention_slots) over a prefix of SPLIT_MIN_PREFIX keys or more. There
    two splits still run in one round, so the kernels' split chooser
    (kernels/tree_attention_config.py choose_splits) always splits; above half it splits only
    where that evens out the rounds, which the bandwidth price already assumes full."""
    slots = attention_slots(r, tile, rows_per_group, head_dim, kv_bytes)
    return (2 * np.asarray(programs) <= slots) & (np.asarray(prefix) >= SPLIT_MIN_PREFIX)


#: standard deviations past the mean up to which spread_padded_rows sums its tiles
SPREAD_SIGMAS = 6.0


def spread_padded_rows(
    tokens: ArrayLike, cv: ArrayLike, rows_per_token: int, tile: ArrayLike, cap: ArrayLike = np.inf
) -> F64:
    """E[pad(rows_per_token * n, tile)] over requests whose token counts n (integers, >= 1, at
    most `cap`) have mean `tokens` and coefficient of variation `cv`, under a normal law with a
    continuity correction:

        E[ceil(G n / T)] = 1 + sum_{k >= 1, kT/G < cap} P(n >= floor(kT / G) + 1)
        P(n >= j + 1) = Phi((mean - j - 0.5) / (cv * mean))

    (mass above `cap` is the cap's: a request's row holds at most cap tokens). cv = 0 gives
    pad_up(rows_per_token * tokens, tile), fractional means included. Arrays broadcast."""
    from scipy.special import ndtr

    n = np.asarray(tokens, dtype=np.float64)
    s = np.asarray(cv, dtype=np.float64) * n
    cap_ = np.asarray(cap, dtype=np.float64)
    t = np.asarray(tile, dtype=np.float64)
    uniform = pad_up(rows_per_token * np.minimum(n, cap_), t)
    if not (s > 0).any():
        return uniform
    per_tile = t / rows_per_token  # tokens one tile holds
    top = np.minimum(n + SPREAD_SIGMAS * s, cap_)
    kmax = int(np.ceil(np.max(top / per_tile))) + 1
    ndim = np.broadcast(n, s, t, cap_).ndim
    k = np.arange(1, kmax + 1, dtype=np.float64).reshape((-1,) + (1,) * ndim)
    j = np.floor(k * per_tile)  # n > j needs tile k + 1
    p = ndtr((n - j - 0.5) / np.maximum(s, 1e-12))
    tiles = 1.0 + np.where(j < cap_, p, 0.0).sum(axis=0)
    # padding never leaves fewer rows than the tokens hold: where the spread is under a token,
    # the rounded normal law puts a fractional mean's mass on its floor, so the rows are held
    # at the mean's own
    rows = np.maximum(tiles * t, rows_per_token * np.minimum(n, cap_))
    return np.where(s > 0, rows, uniform)


def gemm_effective_rows(r: Rates, m: ArrayLike, n: float, tile_m: int | None = None) -> F64:
    """Rows a GEMM with `m` rows and `n` columns is charged for: M padded to the row tile
    (`tile_m`, default Rates.gemm_tile_m) and, once its tiles outnumber the SMs, moved toward
    the rows that fill whole waves by Rates.gemm_wave_tail (1: a partial last wave costs a
    whole one; 0: the padded rows only)."""
    tm = r.gemm_tile_m if tile_m is None else tile_m
    m_pad = pad_up(m, tm)
    n_tiles = float(np.ceil(n / r.gemm_tile_n))
    tiles = m_pad / tm * n_tiles
    waves = np.ceil(tiles / r.sm_count)
    if n_tiles == 0:  # an absent weight (e.g. a module with no MLP): nothing to tile
        return m_pad
    m_wave = waves * r.sm_count / n_tiles * tm  # rows that fill those waves exactly
    tail = r.gemm_wave_tail * np.maximum(m_wave - m_pad, 0.0)
    return np.where(tiles >= r.sm_count, m_pad + tail, m_pad)


def gemm_time(r: Rates, m: ArrayLike, n: float, k: float, fmt: GemmFormat) -> F64:
    """One weight GEMM [M, K] x [K, N] with weights stored as `fmt` says.

    time = max(FLOPs / (peak * eff(M_eff) * flops_scale),
               bytes / (weight bw * bw_scale) + gemm_fixed_s
               + gemm_exposed_compute * 2*M*N*K / (peak * flops_scale));
    FLOPs = 2 * M_eff * N * K, where M_eff is M padded to the format's row tile and, once the
    tiles outnumber the SMs, moved toward whole waves (tiles = ceil(M/tm) * ceil(N/tn) over
    `sm_count` SMs; gemm_wave_tail of the partial last wave is charged as a whole one: 1 in the
    presets, 0 where `spectune calibrate` fitted). Fewer tiles than SMs cost no extra:
    libraries split K to fill the GPU.
    bytes = N*K*wb (weights with their group scales, read once) + M*K*2 (input) + M*N*2
    (output); a quantized input (fmt.act_bytes) is charged as bf16, an overcount of M*K*(2-a)
    bytes: M*(2-a)/(N*wb) of the weight bytes, under 2% at M = 64 for N >= 4096, wb = 1.
    A weight-only 4-bit GEMM (wb ~ 0.52) therefore stays at its memory floor up to
    M* = peak * eff * flops_scale * wb / (2 * bw * bw_scale) rows (CostModel.knee_tokens):
    the crossover where dequantize-and-multiply becomes the bound.
    gemm_fixed_s is paid by the weight stream only (pipeline fill and tail of a streaming
    GEMM, split-K reduce): a compute-bound GEMM hides it. It is the intercept of time vs bytes
    of the weight-streaming GEMM micro-benchmarks (validate.fit.gemm_stream_line), which a
    fit to whole forwards cannot tell from the weight bandwidth; a tensor-parallel shard
    halves the bytes but keeps every GEMM's fixed part.
    gemm_exposed_compute is the share of the math (at the unpadded M, timed at peak) that the
    stream does not hide: a streaming GEMM's rate falls with M (on an H100 3.07 TB/s at M = 1,
    2.95 at M = 64), so the stream side grows with M before the compute side takes over.
    """
    m = np.asarray(m, dtype=np.float64)
    m_eff = gemm_effective_rows(r, m, n, fmt.tile_m)
    flops = FLOPS_PER_MAC * m_eff * n * k
    compute = flops / (fmt.peak_flops * r.gemm_eff(m_eff) * fmt.flops_scale)
    bytes_ = n * k * fmt.weight_bytes + m * (k + n) * ACT_BYTES
    exposed = (
        r.gemm_exposed_compute * FLOPS_PER_MAC * m * n * k / (fmt.peak_flops * fmt.flops_scale)
    )
    memory = bytes_ / (r.weight_bytes_per_s * fmt.bw_scale) + r.gemm_fixed_s + exposed
    return np.where(m > 0, np.maximum(compute, memory), 0.0)


def expected_experts(tokens: ArrayLike, experts: int, topk: int) -> F64:
    """Expected distinct experts that `tokens` tokens route to, each picking `topk` of `experts`
    uniformly: E * (1 - (1 - k/E)^T). 0 tokens touch none; many tokens touch all E."""
    t = np.asarray(tokens, dtype=np.float64)
    return (
        experts * -np.expm1(t * np.log1p(-topk / experts)) if topk < experts else 0.0 * t + experts
    )


def moe_experts_time(
    r: Rates, tokens: ArrayLike, experts: int, topk: int, hidden: int, ffn: float, fmt: GemmFormat
) -> F64:
    """Grouped SwiGLU GEMMs of the routed experts (gate+up: hidden -> 2*ffn, down: ffn -> hidden).

    D = expected distinct experts; each holds T*k/D rows on average, padded to the row tile.
    FLOPs = 2 * D * pad(T*k/D) * 3 * hidden * ffn (pad: the format's row tile).
    bytes = D * 3*hidden*ffn*wb (weights of touched experts only, in `fmt`)
            + T*k*(hidden + 2*ffn + ffn + hidden)*2 (activations in/out of both GEMMs);
    the memory term carries both GEMMs' gemm_fixed_s and the exposed share of their unpadded
    math, 2 * T*k * 3*hidden*ffn FLOPs (gemm_time's form).
    """
    t = np.asarray(tokens, dtype=np.float64)
    d = expected_experts(t, experts, topk)
    rows = np.divide(t * topk, d, out=np.zeros_like(t), where=d > 0)
    rows_pad = pad_up(rows, fmt.tile_m)
    flops = FLOPS_PER_MAC * d * rows_pad * 3 * hidden * ffn
    compute = flops / (fmt.peak_flops * r.gemm_eff(rows_pad) * fmt.flops_scale)
    bytes_ = d * 3 * hidden * ffn * fmt.weight_bytes + t * topk * (2 * hidden + 3 * ffn) * ACT_BYTES
    exposed = (
        r.gemm_exposed_compute
        * FLOPS_PER_MAC * t * topk * 3 * hidden * ffn
        / (fmt.peak_flops * fmt.flops_scale)
    )  # fmt: skip
    memory = (
        bytes_ / (r.weight_bytes_per_s * fmt.bw_scale) + 2 * r.gemm_fixed_s + exposed
    )  # 2 GEMMs
    return np.where(t > 0, np.maximum(compute, memory), 0.0)


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
    """One memory-bound kernel moving `bytes_` (norms, RoPE, activation, KV write, logits pass):
    max(bytes / elementwise rate, Rates.elementwise_floor_s); no bytes, no kernel (0)."""
    b = np.asarray(bytes_, dtype=np.float64)
    return np.where(b > 0, np.maximum(b / r.elementwise_bytes_per_s, r.elementwise_floor_s), 0.0)


def allreduce_time(r: Rates, bytes_: ArrayLike, tp: int) -> F64:
    """All-reduce of `bytes_` over `tp` ranks, without its kernel launch (the caller counts
    one). Where the calibration fitted a law for this tp (Calibration.allreduce_law: one
    latency + bus bandwidth per message-size regime, specs.calibration.link_law_time), that
    law; else the ring's: each link carries 2*(tp-1)/tp * bytes at the link's bus bandwidth,
    plus a fixed latency and one step latency per each of the 2*(tp-1) ring steps. Zero for
    tp = 1."""
    return _collective_time(r, r.allreduce_law, "all_reduce", bytes_, tp)


def allgather_time(r: Rates, bytes_: ArrayLike, tp: int) -> F64:
    """All-gather of a tensor of `bytes_` total (gathered size) over `tp` ranks, without its
    launch: Calibration.allgather_law where fitted for this tp, else the ring's (tp-1)/tp *
    bytes per link + latency (+ tp-1 step latencies)."""
    return _collective_time(r, r.allgather_law, "all_gather", bytes_, tp)


def _collective_time(
    r: Rates, law: tuple[tuple[float, ...], ...], op: str, bytes_: ArrayLike, tp: int
) -> F64:
    b = np.asarray(bytes_, dtype=np.float64)
    if tp == 1:
        return np.zeros_like(b)
    if any(int(row[0]) == tp for row in law):
        return link_law_time(law, op, tp, b)
    steps = link_factor(op, tp) * tp  # ring steps: 2*(tp-1) all-reduce, tp-1 all-gather
    return steps / tp * b / r.link_bytes_per_s + r.link_latency_s + steps * r.link_step_latency_s
