"""Fitted efficiencies and overheads that turn the roofline into a prediction for one GPU.

The cost model prices every operator as max(FLOPs / (peak * eff_c), bytes / (bandwidth * eff_m))
plus launch cost. Without a calibration, the efficiencies are the public measured fractions in
HardwareSpec (gemm_efficiency, hbm_efficiency) and the overheads are the defaults below. A
calibration replaces them with figures fitted to measurements on the actual GPU (`spectune
calibrate`: spectune.validate.fit fits the executor's verify grid, GEMM rows and loop phases).

Fields left at None fall back to the HardwareSpec figure named in their help text, so a
calibration file may hold only what was measured.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from spectune.specs.errors import SpecError
from spectune.specs.io import from_mapping, help_field, read_mapping, write_json_atomic
from spectune.specs.tree import BUILDERS

US = 1e-6  # seconds in one microsecond

# SGLang's default CUDA-graph capture list for decode (server_args / cuda_graph_runner):
# 1, 2, 4, 8, then every 8 up to 256. Batches are padded up to the next captured size; larger
# batches run eagerly.
SGLANG_GRAPH_BATCH_SIZES: tuple[int, ...] = (1, 2, 4, 8, *range(16, 257, 8))

SCHEMA = "spectune.calibration/v1"
MIN_FRACTION = 1e-3
"""Smallest efficiency a calibration may give (a fraction of peak; below it is a unit slip)."""
MAX_FIXED_S = 10.0
"""Largest fixed time a calibration may give, s (per launch, step or request: far past any)."""
MAX_BUS_BYTES_PER_S = 1e15
"""Largest bus bandwidth a link-law row may give, bytes/s (past any interconnect: a unit slip)."""
TP_GEMM_SCALE_MIN = 0.5
TP_GEMM_SCALE_MAX = 2.0
"""Bounds of a Calibration.tp_gemm_scale factor: split grids move a shard's GEMM time by
0.87..1.10 (benchmarks/results/tp_gemm_scale_cpu); past [0.5, 2] the fit or the file is wrong,
not the GEMMs."""
MAX_GEMM_ROWS = 1e7
"""Largest GEMM row count a tp_gemm_scale row may name (tokens of one forward)."""

# Uncalibrated static draft-step cost as a fraction of the dynamic one: the static step runs
# the per-row top-k and the slot gathers but not the k*k frontier sort and the pool scatters.
# Fitted: the median of static_draft_step_s / draft_step_s over the 20 one-GPU calibrate runs
# that include static trees (benchmarks/bench_refit.py, its FOLDERS with static runs, 14 H100
# and 6 H200: 0.78-0.91, median 0.834), each static run priced over its shape's drafted nodes
# per level (CostModel.iteration's draft_widths)
STATIC_STEP_FRACTION = 0.83
# Uncalibrated fixed cost of building a static tree, s (at most the calibration's tree_build_s):
# its mask and positions are precomputed per shape, so what remains is a few launches that do
# not depend on the GPU. Fitted: the median static_tree_build_s of the committed one-GPU
# calibrations that measured static trees (measurements/h100-newuser..12, h200-newuser..5 and
# benchmarks/results/new_gpu_*: 23-48 us, 17 of 21 within 34.5-38.7 us)
STATIC_TREE_BUILD_S = 36e-6


@dataclass(frozen=True)
class Calibration:
    """Per-GPU efficiencies and fixed costs of the cost model (None: the HardwareSpec figure)."""

    hardware: str = help_field(
        "", help="name of the HardwareSpec this was fitted on ('': not tied to one GPU)"
    )
    gemm_tokens: tuple[float, ...] = help_field(
        (),
        help="GEMM row counts M (tokens after tile padding), ascending, at which "
        "gemm_flops_efficiency is given; linear interpolation in M between points, clamped "
        "outside; empty: HardwareSpec.gemm_efficiency at every M",
    )
    gemm_flops_efficiency: tuple[float, ...] = help_field(
        (),
        help="achieved fraction of peak tensor FLOP/s of a weight GEMM with M rows, one value per "
        "gemm_tokens entry; M/eff must not decrease with M (time never falls as M grows)",
    )
    weight_bw_efficiency: float | None = help_field(
        None,
        help="fraction of peak HBM bytes/s a weight-streaming (small-M) GEMM reaches; "
        "None: HardwareSpec.hbm_efficiency",
    )
    attention_bw_efficiency: float | None = help_field(
        None,
        help="fraction of peak HBM bytes/s attention reaches reading the KV cache; "
        "None: HardwareSpec.hbm_efficiency",
    )
    attention_flops_efficiency: float | None = help_field(
        None,
        help="fraction of peak bf16 FLOP/s attention reaches when compute-bound (long trees / "
        "prefill); None: HardwareSpec.gemm_efficiency",
    )
    elementwise_bw_efficiency: float | None = help_field(
        None,
        help="fraction of peak HBM bytes/s of norms, RoPE, activations, KV writes, logits "
        "processing; None: HardwareSpec.hbm_efficiency",
    )
    interconnect_efficiency: float = help_field(
        0.80,
        help="fraction of HardwareSpec.interconnect_bytes_per_s a ring all-reduce reaches (bus "
        "bandwidth); default: nccl-tests all_reduce busbw on 8x H100 SXM, ~360 of 450 GB/s",
    )
    allreduce_latency_s: float | None = help_field(
        None,
        help="fixed latency of one all-reduce or all-gather, s; "
        "None: HardwareSpec.interconnect_latency_s",
    )
    allreduce_step_latency_s: float = help_field(
        0.0,
        help="latency each step of a ring collective adds, s: an all-reduce over tp ranks "
        "takes 2*(tp-1) steps, an all-gather tp-1 (NCCL's own model, src/graph/tuning.cc: "
        "latency = base + steps x per-hop latency); default 0: one latency at every tp",
    )
    allreduce_law: tuple[tuple[float, ...], ...] = help_field(
        (),
        help="fitted all-reduce law per tp degree, one row per message-size regime: (tp, "
        "from_bytes, latency_s, bus_bytes_per_s); an all-reduce of b bytes over tp ranks, in "
        "the regime with the largest from_bytes <= b, takes latency_s + 2*(tp-1)/tp * b / "
        "bus_bytes_per_s beyond its kernel launch (NCCL switches protocol, LL / LL128 / "
        "Simple, with message size: src/graph/tuning.cc). A tp without rows: the single "
        "law above (interconnect_efficiency, allreduce_latency_s, allreduce_step_latency_s)",
    )
    allgather_law: tuple[tuple[float, ...], ...] = help_field(
        (),
        help="the same for the all-gather (b: the gathered bytes; (tp-1)/tp * b crosses each "
        "link): rows (tp, from_bytes, latency_s, bus_bytes_per_s)",
    )
    tp_gemm_scale: tuple[tuple[float, ...], ...] = help_field(
        (),
        help="weight-GEMM time at a tensor-parallel degree, scaled by GEMM rows: rows (tp, "
        "hidden, gemm_rows, scale) for every model of that hidden size (a target and its "
        "EAGLE-3 head share their layers' shapes), interpolated in log rows between its rows "
        "and held at their ends; 1 where no row has that tp and hidden. What a split grid's "
        "target forwards cost beyond (or short of) their price, per row count, as a share of "
        "their weight-GEMM time (validate.fit.fit_tp_gemm_scale): the GEMM libraries pick "
        "kernels per row count and shape, and a shard's shapes are not the one-GPU fit's",
    )
    launch_s: float | None = help_field(
        None,
        help="cost of one kernel inside a CUDA graph (launch gap + ramp), s; "
        "None: HardwareSpec.launch_s",
    )
    gemm_fixed_s: float = help_field(
        0.0,
        help="fixed time of one weight GEMM beyond its launch (pipeline fill, tail), s: what a "
        "GEMM keeps inside a forward when a tensor-parallel shard halves its bytes, which a "
        "fitted calibration holds (validate.fit.FIT_KERNEL_COSTS; a GEMM timed alone keeps more); "
        "default 0, as the HardwareSpec launch_s already stands for launch + ramp",
    )
    gemm_exposed_compute: float = help_field(
        0.0,
        help="share of a weight-streaming GEMM's math, timed at the tensor cores' peak, that its "
        "weight stream does not hide: the stream side of operators.gemm_time adds this x "
        "2*M*N*K / peak. Measured, not fitted to forwards: the GEMM micro-benchmarks' stream rate "
        "falls with M (validate.fit.gemm_stream_line): 0.18-0.23 on H100 SXM "
        "(measurements/h100-newuser to -newuser11), 0.13-0.16 on the H100 TP hosts "
        "(benchmarks/results/tp_h100*), 0.27-0.34 on H200 (measurements/h200-newuser to "
        "-newuser3, benchmarks/results/tp_h200x4_b), from their calibrate-run.json. Default 0: "
        "the stream hides all of it (a plain roofline)",
    )
    attention_fixed_s: float = help_field(
        0.0,
        help="fixed time of every attention kernel beyond its launch (ramp), s: what a layer's "
        "tree attention keeps inside a forward when a shard halves its KV heads, which a "
        "fitted calibration holds (validate.fit.FIT_KERNEL_COSTS); default 0 (see gemm_fixed_s; the "
        "merge of a split launch is attention_split_s)",
    )
    elementwise_floor_s: float = help_field(
        0.0,
        help="least time of one memory-bound kernel (norm, RoPE + KV store, activation, "
        "embedding gather, logits pass), s: operators.elementwise_time prices each at "
        "max(bytes / elementwise rate, this). Inside a verify forward a fused add + RMSNorm "
        "over one token takes 2.9 us and SiLU x mul 1.5 us on H200, their bytes 0.01 us "
        "(benchmarks/results/tp_classes_h200/host_b). Default 0 (calibrations fitted without "
        "it); a fitted calibration holds validate.fit.FIT_KERNEL_COSTS's",
    )
    attention_split_s: float = help_field(
        0.0,
        help="time an attention launch adds when it cuts each sequence's prefix into splits "
        "(flash-decoding): the partials' writes, the merge launch and its reads, s; paid by "
        "the target's tree attention where its programs fill at most half the GPU's resident "
        "slots (operators.attention_splits) and by every drafter pass (span_attention always "
        "splits). Default 0 (calibrations fitted without it); calibrate fits it from the "
        "verify grid and the speculative runs: 2.6-4.6 us on H100 SXM (measurements/"
        "h100-newuser to -newuser4, benchmarks/results/new_gpu_h100_repeat), 3.3-5.6 us on "
        "H200 (measurements/h200-newuser, benchmarks/results/new_gpu_h200_rerun), determined "
        "in one of those seven fits (benchmarks/bench_refit.py)",
    )
    eager_launch_s: float = help_field(
        10.0 * US,
        help="cost of one kernel launched eagerly (no CUDA graph: batch above the largest "
        "captured size, or a ragged/prefill forward), s; must be >= the graph launch cost. "
        "Default: order of a PyTorch eager op's CPU dispatch + launch",
    )
    gemm_tile_m: int = help_field(
        64, help="row tile of weight GEMMs (M is padded to it); 64 = one Hopper wgmma M"
    )
    gemm_tile_n: int = help_field(
        128, help="column tile of weight GEMMs, for wave quantization over the SMs"
    )
    gemm_wave_tail: float = help_field(
        1.0,
        help="share of a weight GEMM's partial last wave charged as a whole one, 0..1, once its "
        "tiles (gemm_tile_m x gemm_tile_n) outnumber the SMs: 1 rounds the rows up to whole "
        "waves, 0 charges the padded rows only. Default 1, the form the presets were fitted "
        "under. `spectune calibrate` fits with 0.5 (validate.fit.FIT_WAVE_TAIL): cuBLAS picks "
        "its tile per M, so the executor's GEMMs between whole waves cost less than a whole "
        "wave, while the split-K plan's fixed tiles do fill waves; over the committed one-GPU "
        "and TP folders it priced the goal rows best (benchmarks/results/wave_tail_cpu.txt)",
    )
    attention_tile_m: int = help_field(
        16,
        help="smallest query-row tile of a tree attention launch: the query rows per KV-head "
        "group are padded to the next power of two from this up to attention_tile_max_m "
        "(16: the mma.sync M that tensor-core decode/tree attention kernels use)",
    )
    attention_tile_max_m: int = help_field(
        128,
        help="largest query-row tile of a tree attention launch (rows beyond it are padded to "
        "its multiples; launches over at most 16 (sequence, KV head) groups stop at 64). "
        "Default 128: spectune's executor (kernels/tree_attention_config.py default_config: "
        "16/32/64-row tiles up to 64 rows, then 128 x 128 tiles, 64 over few groups); "
        "operators.attention_row_tile applies it",
    )
    ragged_tile_m: int = help_field(
        128,
        help="query rows per KV-head group that each request of a ragged verify (trees of "
        "unequal size per request: pruned, or ECHO's shared budget) is padded to: the tile "
        "of an attention launch planned for the batch's largest tree, whose every request runs "
        "ceil(G x n_i / tile) tiles over its own keys. Default 128: spectune's executor "
        "(kernels/tree_attention_config.py default_config: 128-row tiles once G x row cap > 64 "
        "at batch x KV heads > 16; ECHO rows hold 4 x budget); fitted by spectune.validate.fit "
        "from a calibration's ragged runs",
    )
    ragged_token_bucket: int = help_field(
        16,
        help="a pruned tree's packed verify runs at the next multiple of this many tokens "
        "(the whole batch's kept tokens, padded with rows that read nothing; at most B x "
        "budget): its weight GEMMs see the padded count. Default 16: spectune's executor "
        "(kernels/ragged_plan.py TOKEN_BUCKET); at batch 1 a 17-token pruned tree runs as 32",
    )
    graph_batch_sizes: tuple[int, ...] = help_field(
        SGLANG_GRAPH_BATCH_SIZES,
        help="CUDA-graph capture batch sizes, ascending; a batch is padded up to the next one "
        "and runs eagerly above the largest (default: SGLang's capture list)",
    )
    step_overhead_s: float = help_field(
        50.0 * US,
        help="fixed per-iteration cost outside the forward passes (scheduler, sampling launch, "
        "output processing), s; placeholder of the order seen in engine profiles until fitted",
    )
    per_request_overhead_s: float = help_field(
        2.0 * US, help="per-request per-iteration CPU cost (bookkeeping, detokenize), s"
    )
    tree_build_s: float = help_field(
        30.0 * US,
        help="per-iteration cost of building draft trees (top-k rerank, mask/position "
        "kernels) when speculating, s",
    )
    tree_build_per_node_s: float = help_field(
        0.05 * US,
        help="tree-building cost per verified tree node of every sequence (batch x tree "
        "tokens), s: the global rerank sorts each sequence's candidate pool, the kept nodes are "
        "gathered and the bool[N, N] ancestor mask is written row by row, work that grows with "
        "the tree. Default: ~50 ns/node, the order fitted on the H200 (measurements/h200)",
    )
    tree_build_per_level_s: float = help_field(
        0.0,
        help="tree-building cost per level of a dynamic (EAGLE-2) tree, s: the ancestor mask of "
        "the selected nodes is built by one gather round per level (executor.tree_build."
        "ancestor_mask, ~5 small kernels each), whatever the batch and the tree's width, so a "
        "depth-7 tree pays it 7 times and a depth-3 chain 3 (the static builder's mask is "
        "precomputed per shape: not charged). Default 0 (calibrations fitted without it); "
        "calibrate fits it from speculative runs of two depths or more: the tree phase of the "
        "committed H100 runs grows ~20 us a level at batch 1 (depth 2 0.10 ms, 3 0.13, 5 0.16, "
        "6 0.20, 7 0.22)",
    )
    draft_step_s: float = help_field(
        40.0 * US,
        help="fixed cost of each drafting step beyond the drafter's forward pass, s: top-k of "
        "every drafted row over the draft vocabulary (a multi-pass radix select, ~4 kernels), "
        "the sort of the k*k child scores that picks the next frontier, and the gathers/"
        "scatters into the candidate pool and its mask rows: ~15 small dependent kernels that "
        "take a few microseconds each whatever their size. Default: ~15 x 2.5 us, the kernel "
        "count and durations of one draft step in the H200 profile (measurements/h200/"
        "bench-log.txt)",
    )
    draft_select_bytes_per_s: float = help_field(
        1.7e11,
        help="rate at which a draft step's selection consumes the drafter's bf16 logits, "
        "bytes/s: the top-k over each drafted row's vocabulary (torch.topk's radix select, "
        "several passes and a histogram per row) and the candidate sort, a cost per row of "
        "B x top-k that the fixed draft_step_s cannot carry. Default: the H100 profile of the "
        "drafting phase (benchmarks/results/probe_draft_h100: EAGLE-3 head, 32000-token draft "
        "vocabulary, top-k/sort kernels 0.31-0.41 us per row over batch 8-64 and top-k 4-10, "
        "i.e. 64 KB per 0.37 us); calibrate fits it from its speculative runs",
    )
    draft_slot_s: float = help_field(
        0.0,
        help="time of each frontier slot in each draft step after the first, s, whatever the "
        "batch: a drafting phase of depth d and top-k k adds (d - 1) x k x draft_slot_s. The "
        "steps' work on the frontier grows with k in latency-bound kernels that the batch does "
        "not widen (top-k over k rows, the k x k child sort, the drafter's attention over the "
        "earlier draft slots); draft_step_s alone prices a top-1 chain and a top-10 tree "
        "alike. Default 0 (calibrations fitted without it); calibrate fits it from speculative "
        "runs of two top-k or more: 4-12 us on H100 SXM and weak in every fit so far (rel. "
        "s.e. 0.6-1.1: benchmarks/results/tp_h100_rerun's 5/4/8 and 3/1/4, 11.9 us; "
        "measurements/h100-newuser2's 5/4/8, 6/8/32 and 7/10/60, 4.1 us)",
    )
    static_draft_step_s: float | None = help_field(
        None,
        help="draft_step_s of the static (Sequoia) builder, s: its step keeps the per-row top-k "
        "and the gathers into the fixed shape's slots but has no k*k frontier sort or pool "
        "rerank; None: STATIC_STEP_FRACTION x draft_step_s (0.83, the median of the one-GPU "
        "fits that measured static trees)",
    )
    static_tree_build_s: float | None = help_field(
        None,
        help="tree_build_s of the static builder, s: its mask and positions are precomputed "
        "per shape, so only the drafted tokens are written into the slots (the fixed cost still "
        "holds acceptance and KV compaction); None: STATIC_TREE_BUILD_S (36 us, the median of "
        "the one-GPU fits that measured static trees), at most tree_build_s",
    )
    retrieval_per_request_s: float = help_field(
        20.0 * US,
        help="CPU time of one retrieval-drafter lookup (n-gram / suffix match) per request, s",
    )
    retrieval_step_s: float = help_field(
        0.0,
        help="fixed cost per iteration of the retrieval drafter's lookup, whatever the batch, "
        "s: its kernel launches and the host read of the candidates before they are placed "
        "(spectune's GPU prompt lookup for grafting: 0.55 ms on the H200 of "
        "measurements/h200-newuser, 0.59 ms on the H100 of measurements/h100, fitted from the "
        "calibration's prune vs prune+graft runs at batch 1 and 32). Default 0: an engine's "
        "CPU n-gram lookup is priced per request only, until measured",
    )
    prune_step_s: float = help_field(
        150.0 * US,
        help="per-iteration cost a pruned tree (TreePolicy.prune_threshold > 0) adds, s: the "
        "pass that drops nodes under the threshold, packing the batch's kept nodes into one "
        "ragged verify (offsets, positions, mask rows) and the host read of its packed size "
        "before the verify. Default: the H200 figure (measurements/h200-replan, dynamic-topk "
        "6/10/32 at threshold 1e-9, which prunes nothing, vs the same tree dense): tree phase "
        "+0.11-0.18 ms and verify +0.01-0.13 ms at batch 1-32",
    )
    spec_verify_s: float = help_field(
        0.0,
        help="fixed cost of a speculative verify beyond its target forward, s: what the verify "
        "phase runs that a step without speculation does not (the EAGLE-3 features captured "
        "from three layers, the target token drawn and compared at every node: a dozen small "
        "kernels, executor.verifiers.base). On a 2x H200 host the executor's verify phase runs "
        "73-124 us above the same forward of the verify grid at batch 1-64, 4-16 tokens "
        "(benchmarks/results/tp_h200x2_h). Default 0 (unmeasured); `spectune calibrate` fits "
        "it from the measured runs' verify phases beside the grid's forwards: 24-100 us over "
        "the TP folders (benchmarks/results/tp_refit_cpu.txt, tp_h200x2_i)",
    )
    ragged_sync_s: float = help_field(
        0.0,
        help="per-iteration cost of a ragged verify (pruned trees, or a shared budget above "
        "batch 1) beyond its forward, s: the host read of the packed size and the launch of "
        "that size's verify graph onto an idle GPU. The executor's figure in the run is "
        "0.26-0.29 ms on an H200 and ~0.4 ms on an H100 at batch 1 (benchmarks/"
        "probe_pruned_verify.py: the verify phase against its bucket graphs replayed alone), "
        "more than a sync alone (0.11 ms) because the bucket changes from step to step. "
        "Default 0 (unmeasured); `spectune calibrate` fits it from its batch-1 pruned runs "
        "beside the dense runs of the same trees (validate.fit._fit_ragged_sync): 0.07-0.24 ms "
        "on the H100 and H200 folders of measurements/",
    )
    weight_only_flops_efficiency: float = help_field(
        0.45,
        help="share of the bf16 GEMM rate (gemm_flops_efficiency at that M) a weight-only "
        "quantized GEMM keeps when compute-bound (w4a16; fp4/int8 where the GPU lacks those "
        "units): the cost of dequantizing every weight in registers before the MMA. It sets the "
        "crossover M where such a GEMM leaves its memory floor, M* = rate x this x bytes per "
        "weight / (2 x weight bandwidth) (CostModel.knee_tokens). Default: Marlin holds its "
        "ideal 3.87x over fp16 'up to batchsizes around 16-32' on an A10 (IST-DASLab/marlin "
        "README, group 128), where a dequantization-free kernel would hold it to ~54 rows by "
        "the README's own roofline (125 TFLOP/s, 600 GB/s): 24/54 = 0.45. Machete (Hopper "
        "wgmma, Neural Magic 2024) sits nearer 1 at large M: calibrate per GPU and kernel",
    )
    weight_only_bw_efficiency: float = help_field(
        1.0,
        help="share of the weight-streaming bandwidth (weight_bw_efficiency) a weight-only "
        "quantized GEMM reaches at small M: the dequantization cost while memory-bound. "
        "Default 1: Marlin reaches the ideal 3.87x over fp16 at batch 1 (IST-DASLab/marlin "
        "README: 4-bit weights plus group-128 scales, 'essentially ideal speedups')",
    )
    weight_only_tile_m: int = help_field(
        16,
        help="row tile of weight-only quantized GEMMs (M is padded to it): Marlin computes in "
        "16-row mma.sync blocks (IST-DASLab/marlin marlin_cuda_kernel.cu, thread_m_blocks x 16)",
    )
    source: str = help_field("defaults", help="how these figures were obtained")

    def __post_init__(self) -> None:
        fractions = (
            "weight_bw_efficiency",
            "attention_bw_efficiency",
            "attention_flops_efficiency",
            "elementwise_bw_efficiency",
            "interconnect_efficiency",
            "weight_only_flops_efficiency",
            "weight_only_bw_efficiency",
        )
        if not 0.0 <= self.gemm_exposed_compute <= 1.0:
            raise SpecError(
                "field 'gemm_exposed_compute' is a share of a GEMM's time at peak, must be in "
                f"[0, 1], got {self.gemm_exposed_compute}"
            )
        for name in fractions:
            v = getattr(self, name)
            if v is not None and not MIN_FRACTION <= v <= 1.0:
                raise SpecError(
                    f"field {name!r} is a fraction of peak, must be in [{MIN_FRACTION:g}, 1], got {v}"
                )
        times = (
            "allreduce_latency_s",
            "allreduce_step_latency_s",
            "launch_s",
            "gemm_fixed_s",
            "attention_fixed_s",
            "elementwise_floor_s",
            "attention_split_s",
            "eager_launch_s",
            "step_overhead_s",
            "per_request_overhead_s",
            "tree_build_s",
            "tree_build_per_node_s",
            "tree_build_per_level_s",
            "draft_step_s",
            "draft_slot_s",
            "static_draft_step_s",
            "static_tree_build_s",
            "retrieval_per_request_s",
            "retrieval_step_s",
            "prune_step_s",
            "ragged_sync_s",
            "spec_verify_s",
        )
        for name in times:
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= MAX_FIXED_S:
                raise SpecError(
                    f"field {name!r} is a time in seconds, must be in [0, {MAX_FIXED_S:g}], got {v}"
                )
        sel = self.draft_select_bytes_per_s
        if not (isinstance(sel, (int, float)) and 1e9 <= sel <= 1e14):
            raise SpecError(
                "field 'draft_select_bytes_per_s' is a rate in bytes/s, must be in [1e9, 1e14], "
                f"got {sel}"
            )
        for name in (
            "gemm_tile_m",
            "gemm_tile_n",
            "attention_tile_m",
            "attention_tile_max_m",
            "ragged_tile_m",
            "ragged_token_bucket",
            "weight_only_tile_m",
        ):
            if not 0 < getattr(self, name) <= 4096:
                raise SpecError(f"field {name!r} must be in 1..4096, got {getattr(self, name)}")
        if self.attention_tile_max_m < self.attention_tile_m:
            raise SpecError(
                f"field 'attention_tile_max_m' ({self.attention_tile_max_m}) must be >= "
                f"'attention_tile_m' ({self.attention_tile_m})"
            )
        tail = self.gemm_wave_tail
        if not (isinstance(tail, (int, float)) and 0.0 <= tail <= 1.0):
            raise SpecError(f"field 'gemm_wave_tail' must be in [0, 1], got {tail}")
        self._check_gemm_curve()
        for name in ("allreduce_law", "allgather_law"):
            check_link_law(getattr(self, name), name)
        check_tp_gemm_scale(self.tp_gemm_scale)
        g = self.graph_batch_sizes
        if any(b <= 0 for b in g) or any(b >= c for b, c in itertools.pairwise(g)):
            raise SpecError("field 'graph_batch_sizes' must be positive and strictly ascending")

    def _check_gemm_curve(self) -> None:
        m, e = self.gemm_tokens, self.gemm_flops_efficiency
        if len(m) != len(e):
            raise SpecError(
                f"fields 'gemm_tokens' ({len(m)} values) and 'gemm_flops_efficiency' "
                f"({len(e)} values) must have the same length"
            )
        if any(x <= 0 for x in m) or any(a >= b for a, b in itertools.pairwise(m)):
            raise SpecError("field 'gemm_tokens' must be positive and strictly ascending")
        if any(not 0.0 < x <= 1.0 for x in e):
            raise SpecError("field 'gemm_flops_efficiency' values must be in (0, 1]")
        per_flop = [mi / ei for mi, ei in zip(m, e, strict=True)]
        for i in range(1, len(per_flop)):
            if per_flop[i] < per_flop[i - 1] * (1 - 1e-9):
                raise SpecError(
                    "field 'gemm_flops_efficiency': M/eff falls between gemm_tokens "
                    f"{m[i - 1]:g} and {m[i]:g}, so a larger GEMM would be priced faster; "
                    "refit or smooth the curve"
                )

    # ---- per-builder fixed costs ------------------------------------------------------------
    def draft_step_cost_s(self, builder: str = "dynamic-topk") -> float:
        """Fixed seconds of one drafting step beyond the drafter forward, for a TreePolicy
        builder ('static' or 'dynamic-topk')."""
        if _builder(builder) == "static":
            if self.static_draft_step_s is not None:
                return self.static_draft_step_s
            return STATIC_STEP_FRACTION * self.draft_step_s
        return self.draft_step_s

    def tree_build_cost_s(self, builder: str = "dynamic-topk", depth: int = 0) -> float:
        """Seconds of building the draft trees of one iteration that do not grow with the
        batch, for a builder and a tree `depth`: the builder's fixed cost, and for the dynamic
        builder tree_build_per_level_s per level (the static one precomputes its mask)."""
        if _builder(builder) == "static":
            if self.static_tree_build_s is not None:
                return self.static_tree_build_s
            return min(STATIC_TREE_BUILD_S, self.tree_build_s)
        return self.tree_build_s + self.tree_build_per_level_s * depth

    # ---- files -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["gemm_tokens"] = list(self.gemm_tokens)
        d["gemm_flops_efficiency"] = list(self.gemm_flops_efficiency)
        d["graph_batch_sizes"] = list(self.graph_batch_sizes)
        d["allreduce_law"] = [list(r) for r in self.allreduce_law]
        d["allgather_law"] = [list(r) for r in self.allgather_law]
        d["tp_gemm_scale"] = [list(r) for r in self.tp_gemm_scale]
        return {"schema": SCHEMA, **d}

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write as JSON atomically."""
        write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Calibration:
        """Read a calibration JSON/TOML file; bad fields raise SpecError naming field and file."""
        data = read_mapping(path)
        schema = data.pop("schema", SCHEMA)
        if schema != SCHEMA:
            raise SpecError(f"{Path(path)}: schema {schema!r} is not {SCHEMA!r}")
        return from_mapping(cls, data, str(Path(path)))


def link_factor(op: str, tp: int) -> float:
    """Share of a collective's message each link of a ring carries: 2*(tp-1)/tp for an
    all-reduce, (tp-1)/tp for an all-gather (nccl-tests PERFORMANCE.md's bus-bandwidth
    factors)."""
    return (2.0 if op == "all_reduce" else 1.0) * (tp - 1) / tp


def link_law_time(
    rows: tuple[tuple[float, ...], ...], op: str, tp: int, nbytes: ArrayLike
) -> NDArray[np.float64]:
    """Seconds of one collective `op` ('all_reduce' or 'all_gather') of `nbytes` (array) over
    `tp` ranks under a fitted law (rows of Calibration.allreduce_law / allgather_law): the
    regime with the largest from_bytes <= nbytes gives latency_s + link_factor * nbytes /
    bus_bytes_per_s. NaN where the rows hold no regime for `tp`."""
    b = np.asarray(nbytes, dtype=np.float64)
    regimes = sorted((r for r in rows if int(r[0]) == tp), key=lambda r: r[1])
    if not regimes:
        return np.full(b.shape, np.nan)
    start = np.array([r[1] for r in regimes])
    lat = np.array([r[2] for r in regimes])
    bw = np.array([r[3] for r in regimes])
    i = np.clip(np.searchsorted(start, b, side="right") - 1, 0, len(regimes) - 1)
    return np.asarray(lat[i] + link_factor(op, tp) * b / bw[i], dtype=np.float64)


def check_link_law(rows: tuple[tuple[float, ...], ...], name: str) -> None:
    """SpecError naming `name` unless every row is (tp >= 2 integer, from_bytes >= 0, latency_s
    in [0, MAX_FIXED_S], bus_bytes_per_s in (0, MAX_BUS_BYTES_PER_S]), each tp's regimes start
    at 0 bytes with distinct from_bytes, and time never falls where one regime hands over to
    the next."""
    op = "all_reduce" if name == "allreduce_law" else "all_gather"
    by_tp: dict[int, list[tuple[float, ...]]] = {}
    for i, r in enumerate(rows):
        if len(r) != 4:
            raise SpecError(
                f"field {name!r} row {i}: expected (tp, from_bytes, latency_s, "
                f"bus_bytes_per_s), got {len(r)} values"
            )
        tp, start, lat, bw = r
        if not (np.isfinite(tp) and tp == int(tp) and tp >= 2):
            raise SpecError(f"field {name!r} row {i}: tp must be an integer >= 2, got {tp}")
        if not start >= 0 or not 0 <= lat <= MAX_FIXED_S or not 0 < bw <= MAX_BUS_BYTES_PER_S:
            raise SpecError(
                f"field {name!r} row {i}: need from_bytes >= 0, latency_s in [0, "
                f"{MAX_FIXED_S:g}] and bus_bytes_per_s in (0, {MAX_BUS_BYTES_PER_S:g}], got {r}"
            )
        by_tp.setdefault(int(tp), []).append(r)
    for tp, regimes in by_tp.items():
        starts = sorted(r[1] for r in regimes)
        if starts[0] != 0 or len(set(starts)) != len(starts):
            raise SpecError(
                f"field {name!r}: the regimes of tp {tp} must start at from_bytes 0 and at "
                f"distinct sizes, got {starts}"
            )
        for s in starts[1:]:
            at = link_law_time(tuple(regimes), op, tp, [s * (1 - 1e-12), s])
            if at[1] < at[0] * (1 - 1e-9):
                raise SpecError(
                    f"field {name!r}: at tp {tp} the time falls where the regime from "
                    f"{s:g} bytes begins; a larger message cannot be faster (refit)"
                )


def tp_gemm_scale_at(
    rows: tuple[tuple[float, ...], ...], tp: int, hidden: int, gemm_rows: ArrayLike
) -> NDArray[np.float64]:
    """The factor on the weight-GEMM time of a model of `hidden` at `tp` for GEMMs of
    `gemm_rows` rows (array) under Calibration.tp_gemm_scale's `rows`: interpolated in log rows
    between the rows of that (tp, hidden), held at the first and last; 1 where there are none."""
    m = np.asarray(gemm_rows, dtype=np.float64)
    at = sorted((r[2], r[3]) for r in rows if int(r[0]) == tp and int(r[1]) == hidden)
    if not at:
        return np.ones(m.shape)
    x = np.log([a for a, _ in at])
    return np.asarray(
        np.interp(np.log(np.maximum(m, 1.0)), x, [s for _, s in at]), dtype=np.float64
    )


def check_tp_gemm_scale(rows: tuple[tuple[float, ...], ...]) -> None:
    """SpecError unless every row of Calibration.tp_gemm_scale is (tp >= 2 integer, hidden >= 1
    integer, gemm_rows in [1, MAX_GEMM_ROWS], scale in [TP_GEMM_SCALE_MIN, TP_GEMM_SCALE_MAX]),
    the row counts of each (tp, hidden) distinct."""
    seen: set[tuple[int, int, float]] = set()
    for i, r in enumerate(rows):
        if len(r) != 4:
            raise SpecError(
                f"field 'tp_gemm_scale' row {i}: expected (tp, hidden, gemm_rows, scale), got "
                f"{len(r)} values"
            )
        tp, hidden, m, scale = r
        for name, v, least in (("tp", tp, 2), ("hidden", hidden, 1)):
            if not (np.isfinite(v) and v == int(v) and v >= least):
                raise SpecError(
                    f"field 'tp_gemm_scale' row {i}: {name} must be an integer >= {least}, got {v}"
                )
        if not 1 <= m <= MAX_GEMM_ROWS or not TP_GEMM_SCALE_MIN <= scale <= TP_GEMM_SCALE_MAX:
            raise SpecError(
                f"field 'tp_gemm_scale' row {i}: need gemm_rows in [1, {MAX_GEMM_ROWS:g}] and "
                f"scale in [{TP_GEMM_SCALE_MIN:g}, {TP_GEMM_SCALE_MAX:g}], got {r}"
            )
        key = (int(tp), int(hidden), m)
        if key in seen:
            raise SpecError(
                f"field 'tp_gemm_scale' row {i}: tp {key[0]}, hidden {key[1]} has two rows at "
                f"{m:g} GEMM rows"
            )
        seen.add(key)


def _builder(builder: str) -> str:
    if builder not in BUILDERS:
        raise SpecError(f"builder must be one of {', '.join(BUILDERS)}, got {builder!r}")
    return builder


def load_calibration(path: str | os.PathLike[str]) -> Calibration:
    """Calibration.load, as a function (the CLI's --calibration FILE)."""
    return Calibration.load(path)
