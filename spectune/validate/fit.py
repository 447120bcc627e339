"""Fit the cost model's Calibration to what the executor measured (CPU only: numpy + scipy).

The cost model is used as a black box: its efficiencies are the parameters, and a bounded
least-squares fit minimises the log-ratio of predicted to measured seconds over
- the verify grid of a calibration run (whole target forwards, batch x tree tokens x context),
- the weight-GEMM micro-benchmarks of the same run (operators.gemm_time per shape and M),
- the phases of measured speculative runs (verify over the tree, drafting, draft extend) and
  their whole steps, each read from the cost model's StepBreakdown (CostModel.iteration); a
  pruned run's drafting and draft extend only (_rows says why).
The calibration run's own speculative runs (`spec_runs`: one short run per tree builder:
dynamic, static, pruned, grafted, shared budget) join the measurements, so the draft-step, tree,
prune and graft fixed costs are fitted on the GPU at hand. Every efficiency is bounded by the
run's measured read and copy bandwidths and matmul rate (validate.fit_bounds), and the report gives
them beside those ceilings and says which parameters the data determined.
Parameters: weight/attention/elementwise bandwidth efficiencies, attention FLOP efficiency,
the per-kernel launch cost inside a graph, the fixed cost of each draft step beyond the
drafter's forward (top-k, frontier sort, pool bookkeeping: draft_step_s; and
static_draft_step_s when static-builder runs are among the measurements; draft_slot_s, a
cost per frontier slot of each later step, when runs of two top-k or more are), the fixed
cost of a speculative verify beyond its forward (spec_verify_s: the measured runs' verify
phases against the grid's forwards and the plain steps' verify), and the GEMM efficiency curve
eff(M) = e_max * (1 - exp(-M / m0)) tabulated on a grid (M / eff grows with M, as Calibration
requires). The fixed per-step costs (step overhead, per-request cost, tree building: fixed,
per tree node, and per level of a dynamic tree where runs of two depths are measured; the
static builder's fixed tree cost and pruning's per-iteration cost when such runs are
measured) come from a linear fit of the non-forward phases. Each run is priced
as CostModel.iteration prices its policy (builder and options included). Graph batch sizes are every
batch up to 256, because the executor captures a graph at each measured batch exactly (no
padding).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from spectune.specs import ModelSpec, SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import Calibration, link_factor, link_law_time
from spectune.validate.measure import run_draft_widths, spec_run_measurements

GEMM_GRID = (1.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 65536.0)
GRAPH_SIZES = tuple(range(1, 257))
# (name, lower, upper, start)
PARAMS = (
    ("weight_bw_efficiency", 0.2, 1.0, 0.8),
    ("attention_bw_efficiency", 0.05, 1.0, 0.6),
    ("attention_flops_efficiency", 0.02, 1.0, 0.3),
    ("elementwise_bw_efficiency", 0.02, 1.0, 0.5),
    # Calibration.attention_split_s in us: what a split (flash-decoding) attention launch adds
    # (small batches: operators.attention_splits)
    ("attention_split_us", 0.0, 50.0, 5.0),
    ("gemm_emax", 0.2, 1.0, 0.8),
    ("gemm_m0", 1.0, 4096.0, 256.0),
    ("draft_step_us", 0.0, 500.0, 40.0),
    # Calibration.draft_select_bytes_per_s in GB/s: what the draft steps' top-k and candidate
    # sort read per drafted row (logits bytes); up to an HBM3e stream, start at the H100 profile
    ("draft_select_gb_s", 20.0, 5000.0, 170.0),
    # Calibration.spec_verify_s in us: a speculative verify phase beyond its forward (the
    # measured runs' verify phases against the grid's forwards and the plain steps' verify)
    ("spec_verify_us", 0.0, 500.0, 50.0),
)
# fitted only when static-builder runs are measured (otherwise nothing constrains it)
STATIC_PARAM = ("static_draft_step_us", 0.0, 500.0, 20.0)
# Calibration.draft_slot_s in us: each later draft step's cost per frontier slot, fitted only
# from speculative runs of two top-k or more (else the base calibration's value stands)
DRAFT_SLOT_PARAM = ("draft_slot_us", 0.0, 100.0, 2.0)
# Calibration.ragged_tile_m: a tile, so chosen among the M tiles of tensor-core attention
# kernels (mma.sync 16 .. two 128-row warpgroups), and only from shared-budget runs above batch 1
# (ECHO's ragged verifies): the candidate of least weighted squared log error, `determined` when
# every other candidate adds more than RAGGED_TILE_LR residual variances to it (a likelihood-
# ratio test at about 2 sigma); otherwise the base calibration's tile stands
RAGGED_TILES = (16, 32, 64, 128, 256)
RAGGED_TILE_LR = 4.0


#: Calibration.gemm_wave_tail of a fitted calibration. Charging a GEMM's partial last wave whole
#: (1, the presets' form) priced the packed verifies of pruned trees (M = 136-200 at batch 8)
#: and 7/10/60 at batch 8 (M = 480) 7-10% high on H200: cuBLAS picks its tile per M. Charging
#: none (0) priced the tp 2 shards' GEMMs at batch 64 low (the split-K plan's fixed tiles do
#: fill waves). Refitted with each (benchmarks/results/wave_tail_cpu.txt), over the six newest
#: one-GPU folders 1 / 0.5 / 0 gave verify MAPE 1.84 / 1.62 / 1.55%, worst goal row 3.57 / 3.32
#: / 3.47%, and over the ten TP folders worst goal row 4.07 / 4.12 / 4.36%: half a wave
FIT_WAVE_TAIL = 0.5

#: The per-kernel fixed costs of a fitted calibration, held at what a verify forward's kernels
#: take inside its CUDA graph (each kernel's launch inside it: a fitted launch_s is 0):
#: - gemm_fixed_s: a weight GEMM keeps 2.2-5.0 us when a tensor-parallel shard halves its bytes
#:   (one token a sequence: 3.1-4.9 us on a 2x H200 host, 3.1-3.9 on a 2x H100 one;
#:   benchmarks/bench_tp_classes.py's split of benchmarks/results/tp_classes_h200/host_b and
#:   tp_h100x2_e/classes), where the GEMM micro-benchmarks' intercept, a call timed alone, is
#:   5.3-6.4 us;
#: - attention_fixed_s: a layer's tree attention launch keeps 6.1-7.0 us at one token a sequence
#:   (the same splits; 12 us at batch 64 on the H100 pair);
#: - elementwise_floor_s: one memory-bound kernel's least time, a fused add + RMSNorm over one
#:   token 2.9 us, RoPE + KV store 1.7, SiLU x mul 1.5 (host_b's tp 1 forward, by kernel name).
#: Refitted with these held (benchmarks/results/fixed_costs_cpu.md), against the fit that held
#: gemm_fixed_s at the micro-benchmarks' intercept less a fitted launch_s: over 20 TP folders
#: goal rows worst 3.64 -> 3.41% (max 5.6 -> 4.5%), mean 1.49 -> 1.41%, verify MAPE 1.46 ->
#: 1.47%; over 32 one-GPU folders 3.16 -> 3.15%, 1.18 -> 1.21%, 1.41 -> 1.42%.
FIT_KERNEL_COSTS = {
    "gemm_fixed_s": 3.0e-6,
    "attention_fixed_s": 6.0e-6,
    "elementwise_floor_s": 2.0e-6,
}


#: least-squares iterations of a calibration fit: each prices every row once per parameter
#: (about 1 s an iteration for a TP run's 132 rows on a device host's CPU). Most fits converge
#: in 20-40; an H100 pair's fit whose gemm_m0 ran to its lower bound took 400 (555 s) and
#: moved its verify MAPE 0.91 -> 0.88% after the 60th (benchmarks/results/fit_nfev_h100x2)
FIT_MAX_NFEV = 80


def _tokens(run: dict) -> float:
    """Tokens verified per sequence: the measured mean of a pruned run, else the tree size."""
    return float(run.get("verified_mean", run["nodes"]))


def _calibration(
    x: Sequence[float] | np.ndarray,
    hardware: str,
    base: Calibration,
    params: Sequence[tuple[str, float, float, float]] = PARAMS,
    hold_gemm_fixed: bool = False,
) -> Calibration:
    """The Calibration of parameter vector `x` (`params`' order) over `base`, with the
    per-kernel fixed costs of FIT_KERNEL_COSTS (launch_s 0 unless `params` fits "launch_us"):
    gemm_fixed_s FIT_KERNEL_COSTS's with `hold_gemm_fixed` (the run's GEMMs were measured),
    else base's."""
    p = dict(zip((n for n, *_ in params), x, strict=True))
    grid = np.asarray(GEMM_GRID)
    eff = p["gemm_emax"] * -np.expm1(-grid / p["gemm_m0"])
    eff = np.clip(eff, 1e-4, 1.0)
    per = np.maximum.accumulate(grid / eff)  # enforce M/eff non-decreasing exactly
    eff = grid / per
    static = p.get("static_draft_step_us")
    slot = p.get("draft_slot_us")
    bw = p.get("weight_bw_efficiency", base.weight_bw_efficiency)  # held: absent from params
    launch_s = float(p.get("launch_us", 0.0)) * 1e-6
    fixed = FIT_KERNEL_COSTS["gemm_fixed_s"] if hold_gemm_fixed else base.gemm_fixed_s
    return dataclasses.replace(
        base,
        hardware=hardware,
        gemm_fixed_s=fixed,
        static_draft_step_s=base.static_draft_step_s if static is None else float(static) * 1e-6,
        weight_bw_efficiency=None if bw is None else float(bw),
        attention_bw_efficiency=float(p["attention_bw_efficiency"]),
        attention_flops_efficiency=float(p["attention_flops_efficiency"]),
        elementwise_bw_efficiency=float(p["elementwise_bw_efficiency"]),
        launch_s=launch_s,
        attention_fixed_s=FIT_KERNEL_COSTS["attention_fixed_s"],
        elementwise_floor_s=FIT_KERNEL_COSTS["elementwise_floor_s"],
        attention_split_s=float(p["attention_split_us"]) * 1e-6,
        draft_step_s=float(p["draft_step_us"]) * 1e-6,
        draft_select_bytes_per_s=float(p["draft_select_gb_s"]) * 1e9,
        spec_verify_s=float(p["spec_verify_us"]) * 1e-6,
        draft_slot_s=base.draft_slot_s if slot is None else float(slot) * 1e-6,
        gemm_tokens=tuple(float(g) for g in grid),
        gemm_flops_efficiency=tuple(float(e) for e in eff),
        gemm_wave_tail=FIT_WAVE_TAIL,
        graph_batch_sizes=GRAPH_SIZES,
    )


def _rows(
    run: dict[str, Any], measurements: Iterable[dict[str, Any]]
) -> list[tuple[str, dict[str, Any], float]]:
    """(kind, arguments, measured seconds) for every fitted observation."""
    rows: list[tuple[str, dict[str, Any], float]] = []
    for r in run.get("verify", []):
        args = {"batch": r["batch"], "tokens": r["tokens"], "context": r["context"]}
        rows.append(("verify", args, r["seconds"]))
        if "linear_s" in r and "attention_s" in r:
            # the same forward by kernel class (executor.calibrate.kernel_classes); the rest of
            # its time (small kernels and the gaps between kernels) is "other"
            rows.append(("verify_linear", args, r["linear_s"]))
            rows.append(("verify_attention", args, r["attention_s"]))
            other = r["seconds"] - r["linear_s"] - r["attention_s"]
            if other > OTHER_FLOOR * r["seconds"]:
                rows.append(("verify_other", args, other))
    for g in run.get("gemm", []):
        rows.append(("gemm", {"m": g["m"], "n": g["n"], "k": g["k"]}, g["seconds"]))
    for doc in measurements:
        c = doc["context"]
        planned: dict[str, Any] = {}  # the document's planner objective, built on first need
        for r in doc["runs"]:
            ph, b, pol = r["phases_ms"], r["batch"], r["policy"]
            if "ar_phases_ms" in r:
                rows.append(
                    (
                        "verify",
                        {"batch": b, "tokens": 1, "context": c},
                        r["ar_phases_ms"]["verify"] / 1e3,
                    )
                )
                rows.append(("ar", {"batch": b, "context": c}, r["ar_step_ms"] / 1e3))
            if pol is None:
                rows.append(("verify", {"batch": b, "tokens": 1, "context": c}, ph["verify"] / 1e3))
                continue
            run_args = _run_args(doc, r, planned)
            if run_args["policy"].prune_threshold <= 0:
                # a pruned run's packed verify runs its weight GEMMs at the kept token count, a
                # multiple of 16 between the powers of two that the GEMM benchmarks and the
                # verify grid measure, where gemm_time's tile and wave steps go untested: the
                # pruned runs at 490-560 and 810 tokens miss them by -5% to +7% on H100 and
                # H200 alike (benchmarks/bench_prune_phases.py); fitted, they pull the forward
                # efficiencies off the dense runs (bench_prune_phases --refit: worst dense or
                # ECHO speedup error at batch 8, 6.7 -> 8.4%). Their overheads are fitted apart
                rows.append(("verify", {**run_args, "tokens": _tokens(r)}, ph["verify"] / 1e3))
                rows.append(("step", {**run_args, "tokens": _tokens(r)}, ph["step"] / 1e3))
            rows.append(("draft", run_args, ph["draft"] / 1e3))
            rows.append(("extend", run_args, ph["extend"] / 1e3))
    return rows


def _run_args(doc: dict[str, Any], r: dict[str, Any], planned: dict[str, Any]) -> dict[str, Any]:
    """predict_row's arguments for speculative run `r` of measurement `doc` (its batch, policy,
    context, accepted tokens, spread and draft widths; `planned`: the document's planner
    objective, built on first need by run_draft_widths). Add "tokens" for its verify or step."""
    return {
        "batch": r["batch"],
        "policy": TreePolicy(**r["policy"]),
        "context": doc["context"],
        "accepted": r.get("extend_tokens"),
        "tokens_cv": r.get("verified_cv"),
        "draft_widths": run_draft_widths(doc, r, planned),
    }


def predict_row(cm: Any, kind: str, a: dict[str, Any]) -> float:
    """Seconds the cost model predicts for one observation: a target forward ('verify'; a
    measured run's verify phase is the iteration's verify_s, ragged for a shared budget), a
    weight GEMM ('gemm'), or a field of CostModel.iteration for a measured run: the whole step
    ('step', over the run's verified tokens), its drafting ('draft') or its draft extend
    ('extend', over depth + 1 tokens: the executor pads it so); 'ar': a plain decode step."""
    from spectune.planner.operators import gemm_time

    if kind == "verify" and "policy" not in a:
        return _scalar(cm.verify_time(a["batch"], a["tokens"], a["context"]))
    if kind in CLASS_PARTS:
        parts = cm.verify_breakdown(a["batch"], a["tokens"], a["context"])
        return _scalar(sum(np.asarray(parts[c], dtype=np.float64) for c in CLASS_PARTS[kind]))
    if kind == "gemm":
        fmt = cm.rates.dense_format(float(cm.target.dtype_bytes))
        return _scalar(gemm_time(cm.rates, a["m"], a["n"], a["k"], fmt))
    if kind == "ar":
        return _scalar(cm.iteration(None, a["batch"], a["context"]).total_s)
    if kind in ("verify", "step", "draft", "extend"):
        step = cm.iteration(
            a["policy"],
            a["batch"],
            a["context"],
            tokens=a.get("tokens"),
            accepted=a.get("accepted"),
            tokens_cv=a.get("tokens_cv"),
            draft_widths=a.get("draft_widths"),
        )
        field = {
            "verify": step.verify_s,
            "step": step.total_s,
            "draft": step.draft_s,
            "extend": step.extend_s,
        }[kind]
        return _scalar(field)
    raise ValueError(kind)


# Whole steps weigh most (speedup = ratio of step times); the target's verify passes next; the
# drafting phase less (it fits draft_step_us, the fixed cost per draft step, but its forward
# passes share the target's efficiencies: weighted as much as verify, it pulls them off, e.g.
# worst H200 speedup error 5.7% at 1.0 vs 5.5% at 0.3); draft extend little (its padded
# (depth+1)-token pass is priced ~10% off whatever the weight); GEMM micro-benchmarks are
# reported but not fitted (one efficiency curve serves every weight shape; isolated kernels
# also run slower than the same kernels inside a forward's CUDA graph: fitting free per-kernel
# fixed costs to them, gemm_fixed_s and attention_fixed_s added to the roofline, raised `spectune check`'s verify
# MAPE of measurements/h100-newuser from 1.9% to 2.2% and its worst speedup error from 4.9%
# to 7.5%).
# The GEMM micro-benchmarks do give two things the whole forwards cannot (gemm_stream_line: a
# line through time vs bytes over the target's weight shapes at M <= 64):
# - the fixed part of a weight-streaming GEMM timed alone (the intercept, 5-7 us on H100 and
#   H200), reported, not used: whole forwards confound a kernel's fixed time with the
#   bandwidths (every one-GPU forward runs the same kernels), and a tensor-parallel shard, which
#   halves the bytes and keeps the kernels, prices whatever split the fit chose (two H200 hosts
#   whose tp 1 grids agreed within 0.3% priced tp 2 batch 1 +0.4% and +5.2%). Inside a forward a
#   GEMM keeps 3-4 us, each attention launch 6-7 us and each small kernel its 1.5-3 us: the fit
#   holds all three at what the split forwards keep (FIT_KERNEL_COSTS) and fits the rates
#   around them;
# - the share of a streaming GEMM's math the stream does not hide (gemm_exposed_compute: the
#   stream rate falls with M, on an H100 3.07 TB/s at M = 1 and 2.95 at M = 64; 0.18-0.23 of
#   the math at peak on H100, 0.27-0.34 on H200). Held there, the forwards' fit takes its
#   GEMM and elementwise rates nearer what they measure (an H100's gemm_emax 0.81 -> 0.74, the
#   in-forward GEMMs' rate at M = 8192; elementwise 0.41 -> 0.61-0.65). Over 16 one-GPU
#   folders verify MAPE 1.85 -> 1.74% and the mean speedup error of the planned policy and
#   the engine references 1.67 -> 1.45%; the pruned runs, whose packed verifies the fit leaves
#   out, are priced 0.3-1.5 points further off (benchmarks/results/refit_cpu.txt);
# - the rate weights stream at (1 / slope at M -> 0), a measured read: on an H200 4.36-4.48 TB/s against
#   the sum kernels' 4.12 and a copy's 4.25, so the read ceiling of the weight and attention
#   bandwidths takes it (validate.fit_bounds.ceilings). Under the copy's ceiling the H200's
#   attention bandwidth sat at its bound, and its step without speculation was priced 1.3-2.2%
#   high on average; with the stream's ceiling 0.7-1.2% (benchmarks/results/refit_cpu.txt).
# A verify row's kernel time by class (calibrate's profiled replay: weight GEMMs + logits,
# attention, the rest) is reported, not fitted. Whole-forward times leave the weight bandwidth
# and the per-kernel costs confounded (every grid point runs the same kernels: the fits price
# an H100's decode GEMMs 10-13% slow and its ~130 small kernels nearly free,
# benchmarks/results/forward_kernels_h100.md), but the cost model's operator classes do not
# yet price the executor's kernels class by class: the executor runs 293-422 kernels per
# forward (split-K reduces where the autotuned GEMM variant has them) where the cost model
# counts 292, its attention is priced 24% low at context 512 and 12-22% high at 4096 for 64+
# tree tokens, and its elementwise kernels about 2x high at large M. Fitted at weight 1 on a
# fresh H100's run (measurements/h100-newuser5), the class rows took its verify MAPE from 1.9%
# to 9.5% (2.3-2.5% with an attention fixed cost added), so they stay a diagnostic until the
# classes match.
WEIGHTS = {
    "verify": 1.0,
    "verify_linear": 0.0,
    "verify_attention": 0.0,
    "verify_other": 0.0,
    "step": 2.0,
    "ar": 1.0,
    "gemm": 0.0,
    "draft": 0.3,
    "extend": 0.1,
}
#: kernel class of a profiled verify row -> the cost model's operator classes
#: (planner.forward.CLASSES) that price it; "other" takes the launches (one per kernel)
CLASS_PARTS = {
    "verify_linear": ("qkv_o", "mlp", "lm_head"),
    "verify_attention": ("attention",),
    "verify_other": ("elementwise", "launch", "comm"),
}
#: GEMM micro-benchmark rows of at most this M stream their weights on H100 / H200 (far below
#: the ridge: M* ~ 300 rows in bf16), so time vs bytes is a line whose intercept is fixed time
GEMM_STREAM_M = 64
#: the stream line's intercept (a GEMM's fixed time timed alone) is clipped to [0, this]: above it
#: it is not a fixed cost of a GEMM
GEMM_FIXED_MAX_S = 20e-6


@dataclasses.dataclass(frozen=True)
class StreamLine:
    """The weight stream of the GEMM micro-benchmarks: for GEMMs far below the ridge
    (M <= GEMM_STREAM_M), time = fixed_s + bytes / bytes_per_s + exposed * FLOPs / peak, with
    bytes = N*K*2 weights + M*(N+K)*2 activations and FLOPs = 2*M*N*K (operators.gemm_time's
    memory side; peak: the GPU's bf16 tensor FLOP/s)."""

    fixed_s: float  # intercept: pipeline fill and tail, split-K reduce, the graph's launch gap
    bytes_per_s: float  # the rate a weight GEMM streams its weights at, as M -> 0
    exposed: float  # Calibration.gemm_exposed_compute: the share of the math the stream adds


def gemm_stream_line(run: dict[str, Any]) -> StreamLine | None:
    """The run's StreamLine, by least squares over its "gemm" rows of M <= GEMM_STREAM_M at the
    M values that have rows of two weight shapes or more: time = c_M + bytes * u + FLOPs * v,
    one intercept c_M per M (the median over M, clipped to [0, GEMM_FIXED_MAX_S], is fixed_s),
    bytes_per_s = 1 / u, exposed = v * peak clipped to [0, 1] (0 with a single M: the math
    then cannot be told from the bytes). None where the run has no such rows or u is not
    positive; a SpecError where a run with such rows names no hardware (the peak)."""
    from spectune.planner.operators import ACT_BYTES, FLOPS_PER_MAC

    rows = [g for g in run.get("gemm", []) if g["m"] <= GEMM_STREAM_M]
    ms = sorted(
        m for m in {g["m"] for g in rows}
        if len({(g["n"], g["k"]) for g in rows if g["m"] == m}) >= 2
    )  # fmt: skip
    if not ms:
        return None
    at = [g for g in rows if g["m"] in ms]
    if "hardware" not in run:
        raise SpecError("a calibration run with GEMM rows must name its 'hardware'")
    peak = load_hardware(run["hardware"]).peak_bf16_flops
    cols = [[float(g["m"] == m) for m in ms] for g in at]
    bytes_ = [(g["n"] * g["k"] + g["m"] * (g["n"] + g["k"])) * ACT_BYTES for g in at]
    scale = max(bytes_)  # columns of order 1: seconds per max-bytes, per peak-seconds of math
    a = np.column_stack([np.array(cols), np.array(bytes_) / scale])
    if len(ms) >= 2:
        flops = [FLOPS_PER_MAC * g["m"] * g["n"] * g["k"] / peak for g in at]
        a = np.column_stack([a, flops])
    t = np.array([g["seconds"] for g in at], dtype=np.float64)
    x, *_ = np.linalg.lstsq(a, t, rcond=None)
    u = float(x[len(ms)]) / scale
    if not u > 0:
        return None
    exposed = float(np.clip(x[len(ms) + 1], 0.0, 1.0)) if len(ms) >= 2 else 0.0
    fixed = float(np.clip(np.median(x[: len(ms)]), 0.0, GEMM_FIXED_MAX_S))
    return StreamLine(fixed, 1.0 / u, exposed)


#: a verify row's "other" time (seconds - linear - attention) below this fraction of the row
#: is within the profile's noise, not a measurement of the small kernels: no row
OTHER_FLOOR = 0.005


def fit_calibration(
    run: dict[str, Any],
    measurements: Sequence[dict[str, Any]] = (),
    *,
    base: Calibration | None = None,
    max_nfev: int = FIT_MAX_NFEV,
    hold_gemm_fixed: bool = True,
    hold_weight_bw: bool = False,
) -> tuple[Calibration, dict[str, Any]]:
    """Calibration fitted to a calibration-run document (+ measurement documents of the same GPU
    and models). Returns it and a report (per-kind MAPE before and after). `max_nfev` bounds
    the least-squares iterations (each prices every row once per parameter).
    Where the run has GEMM rows, its gemm_stream_line's rate is a measured read: the read
    ceiling (weight and attention bandwidths) takes it. `hold_gemm_fixed`: gemm_fixed_s held
    at FIT_KERNEL_COSTS's in-forward value and gemm_exposed_compute at the line's exposed share
    (where the run has the line); False keeps base's. Every fit holds attention_fixed_s and
    elementwise_floor_s at FIT_KERNEL_COSTS's and launch_s at 0 (each kernel's launch is in
    its class's fixed cost).
    `hold_weight_bw`: weight_bw_efficiency held at the line's rate (the weight GEMMs priced as
    the micro-benchmarks time them) instead of fitted to the whole forwards."""
    from scipy.optimize import least_squares

    from spectune.planner.costmodel import CostModel
    from spectune.validate.fit_bounds import bounded, bounds_report, ceilings, identified

    hw = load_hardware(run["hardware"])
    target, drafter = load_model(run["target"]), load_model(run["drafter"])
    measurements = [*measurements, *spec_run_measurements(run)]
    for doc in measurements:
        if (doc["hardware"], doc["target"], doc["drafter"]) != (
            run["hardware"],
            run["target"],
            run["drafter"],
        ):
            raise SpecError("measurements must be of the calibration run's GPU and models")
    base = base or Calibration()
    line = gemm_stream_line(run)
    held = False  # the run's GEMMs measured: a GEMM's fixed time and exposed math held
    if line is not None and hold_gemm_fixed:
        held = True
        base = dataclasses.replace(base, gemm_exposed_compute=line.exposed)
    over = _overheads(measurements)
    if over:  # fixed per-step costs first: the least-squares fit prices whole steps with them
        base = dataclasses.replace(
            base,
            step_overhead_s=over["step_overhead_s"],
            per_request_overhead_s=over["per_request_overhead_s"],
            tree_build_s=over["tree_build_s"],
            tree_build_per_node_s=over["tree_build_per_node_s"],
            tree_build_per_level_s=over.get("tree_build_per_level_s", base.tree_build_per_level_s),
            static_tree_build_s=over.get("static_tree_build_s", base.static_tree_build_s),
            prune_step_s=over.get("prune_step_s", base.prune_step_s),
            retrieval_per_request_s=over.get(
                "retrieval_per_request_s", base.retrieval_per_request_s
            ),
            retrieval_step_s=over.get("retrieval_step_s", base.retrieval_step_s),
        )
    rows = _rows(run, measurements)
    if not rows:
        raise SpecError("nothing to fit: the calibration run has no verify or gemm rows")
    # rows of weight 0 are priced before and after the fit for the report, not fitted
    shown = [r for r in rows if WEIGHTS[r[0]] == 0]
    rows = [r for r in rows if WEIGHTS[r[0]] > 0]
    meas = np.array([s for _, _, s in rows])
    w = np.sqrt(np.array([WEIGHTS[k] for k, _, _ in rows]))
    # efficiencies <= measured read / copy bandwidth and matmul rate
    ceiling = ceilings(run, hw, None if line is None else line.bytes_per_s)
    params = bounded((*PARAMS, *_optional_params(rows)), ceiling)
    if hold_weight_bw and line is not None:
        held_bw = min(1.0, line.bytes_per_s / hw.hbm_bytes_per_s)
        base = dataclasses.replace(base, weight_bw_efficiency=held_bw)
        params = tuple(p for p in params if p[0] != "weight_bw_efficiency")

    def model(x: Sequence[float] | np.ndarray) -> np.ndarray:
        cal = _calibration(x, hw.name, base, params, held)
        cm = CostModel(hw, target, drafter, calibration=cal)
        return np.array([predict_row(cm, k, a) for k, a, _ in rows])

    def resid(x: np.ndarray) -> np.ndarray:
        return w * np.log(model(x) / meas)

    lo = np.array([p[1] for p in params])
    hi = np.array([p[2] for p in params])
    x0 = np.array([p[3] for p in params])
    start = model(x0)
    sol = least_squares(resid, x0, bounds=(lo, hi), x_scale="jac", max_nfev=max_nfev)
    cal = _calibration(sol.x, hw.name, base, params, held)
    cal = dataclasses.replace(
        cal,
        source=f"spectune calibrate on {run.get('gpu', hw.name)}: least-squares fit of "
        f"{len(rows)} executor timings (verify grid, GEMMs, loop phases); spectune.validate.fit",
    )
    end = model(sol.x)
    names = [p[0] for p in params]
    report: dict[str, Any] = {
        "rows": len(rows),
        "params": dict(zip(names, sol.x.tolist(), strict=True)),
        "bounds": bounds_report(params, sol.x, ceiling, run, hw),
        "identified": identified(names, sol.x, sol.jac, sol.fun, lo, hi),
        "overheads": {"fitted": sorted(over), "default": sorted(set(OVERHEAD_COLUMNS) - set(over))},
        "gemm_fixed_us": cal.gemm_fixed_s * 1e6,
    }
    if line is not None:
        report["weight_stream"] = {
            "fixed_us": line.fixed_s * 1e6,
            "bytes_per_s": line.bytes_per_s,
            "exposed": line.exposed,
            "held": ["gemm_fixed_s", "gemm_exposed_compute"] if hold_gemm_fixed else [],
        }
    for kind in WEIGHTS:
        sel = np.array([k == kind for k, _, _ in rows])
        if sel.any():
            report[f"mape_{kind}_before"] = float(np.mean(np.abs(start[sel] / meas[sel] - 1)))
            report[f"mape_{kind}_after"] = float(np.mean(np.abs(end[sel] / meas[sel] - 1)))
    for label, x in (("before", x0), ("after", sol.x)):
        cm_x = CostModel(
            hw, target, drafter, calibration=_calibration(x, hw.name, base, params, held)
        )
        for kind in dict.fromkeys(k for k, _, _ in shown):
            errs = [abs(predict_row(cm_x, k, a) / s - 1) for k, a, s in shown if k == kind]
            report[f"mape_{kind}_{label}"] = float(np.mean(errs))
    s2 = float(sol.fun @ sol.fun) / dof(sol)
    cal, tile = _fit_ragged_tile(
        cal, rows, meas, w, s2, lambda c: CostModel(hw, target, drafter, calibration=c)
    )
    if tile is not None:
        report["ragged_tile_m"] = tile
        kind = "determined" if tile["determined"] else "weak"
        report["identified"][kind].append("ragged_tile_m")
        report["identified"]["rel_se"]["ragged_tile_m"] = None
    cal, sync = _fit_ragged_sync(
        cal, measurements, lambda c: CostModel(hw, target, drafter, calibration=c)
    )
    if sync is not None:
        report["ragged_sync"] = sync
    if any(r.get("op") == "all_reduce" for r in run.get("collectives", [])):
        cal, link = fit_interconnect(run["collectives"], hw.name, cal)
        report.update({f"link_{k}": v for k, v in link.items()})
    return cal, report


def _optional_params(
    rows: Sequence[tuple[str, dict[str, Any], float]],
) -> tuple[tuple[str, float, float, float], ...]:
    """The parameters beyond PARAMS that `rows` constrain: the static builder's step cost
    (static-builder runs) and the cost per frontier slot (drafting phases of two top-k or
    more, depth > 1)."""
    runs = [a["policy"] for k, a, _ in rows if k == "draft"]
    out = []
    if any(p.builder == "static" for p in runs):
        out.append(STATIC_PARAM)
    if len({p.topk for p in runs if p.depth > 1}) > 1:
        out.append(DRAFT_SLOT_PARAM)
    return tuple(out)


def dof(sol: Any) -> int:
    """Residual degrees of freedom of a least-squares solution (rows - parameters, >= 1)."""
    return max(int(sol.fun.size) - int(sol.x.size), 1)


def _fit_ragged_tile(
    cal: Calibration,
    rows: Sequence[tuple[str, dict[str, Any], float]],
    meas: np.ndarray,
    w: np.ndarray,
    s2: float,
    cost_model: Callable[[Calibration], Any],
) -> tuple[Calibration, dict[str, Any] | None]:
    """`cal` with ragged_tile_m chosen among RAGGED_TILES (see RAGGED_TILE_LR) from the rows of
    shared-budget runs above batch 1, and the report: each candidate's weighted sum of squared
    log errors over those rows, the best, the tile chosen and whether the data determined it.
    `s2`: the fit's residual variance; `cost_model`: a CostModel of the run's GPU and models for
    a calibration. No such rows: `cal` unchanged and None."""
    sel = [
        i
        for i, (_, a, _) in enumerate(rows)
        if "policy" in a and a["policy"].shared_budget and a["batch"] > 1
    ]
    if not sel:
        return cal, None
    ssr: dict[int, float] = {}
    for tile in RAGGED_TILES:
        cm = cost_model(dataclasses.replace(cal, ragged_tile_m=tile))
        pred = np.array([predict_row(cm, rows[i][0], rows[i][1]) for i in sel])
        ssr[tile] = float(np.sum((w[sel] * np.log(pred / meas[sel])) ** 2))
    best = min(ssr, key=lambda t: (ssr[t], t))
    gap = min(v - ssr[best] for t, v in ssr.items() if t != best)
    determined = gap > RAGGED_TILE_LR * max(s2, 1e-12)
    chosen = best if determined else cal.ragged_tile_m
    report = {
        "rows": len(sel),
        "ssr": {str(t): v for t, v in ssr.items()},
        "best": best,
        "chosen": chosen,
        "determined": determined,
    }
    return dataclasses.replace(cal, ragged_tile_m=chosen), report


#: Calibration.ragged_sync_s is held in [0, this]
RAGGED_SYNC_MAX_S = 2e-3


def _fit_ragged_sync(
    cal: Calibration,
    measurements: Sequence[dict[str, Any]],
    cost_model: Callable[[Calibration], Any],
) -> tuple[Calibration, dict[str, Any] | None]:
    """`cal` with ragged_sync_s fitted from paired batch-1 runs: each pruned run at batch 1 beside
    the dense run of the same tree (builder, depth, top-k, budget) in the same document; the
    difference of their measured verify phases minus the difference `cal` prices, median over
    the pairs, within [0, RAGGED_SYNC_MAX_S].

    The executor times a ragged verify's host read of its packed size and the launch of its
    bucket's graph in the verify phase (executor.verifiers.ragged). At batch 1 the packed
    forward is the dense forward of its token bucket, so the pair cancels what the cost model
    misprices in both (the GEMM plan's step at 32 tokens: the dense 6/8/32 verify itself is
    2-4% above its price on H200 / H100) and leaves the sync. Above batch 1 the packed forward
    (kept tokens, tile padding, bucket routing) is priced with errors of either sign, up to
    +-7% (measurements/h200-newuser6), so those runs do not isolate it. Returns the report
    (pairs, median, each pair's difference in ms); no pair: `cal` unchanged and None."""
    cm = cost_model(dataclasses.replace(cal, ragged_sync_s=0.0))
    diffs = []
    for doc in measurements:
        planned: dict[str, Any] = {}

        def verify_s(
            r: dict[str, Any], doc: dict[str, Any] = doc, planned: dict[str, Any] = planned
        ) -> float:
            args = {**_run_args(doc, r, planned), "tokens": _tokens(r)}
            return predict_row(cm, "verify", args)

        def shape(pol: dict[str, Any]) -> tuple[Any, ...]:
            return (pol["builder"], pol["depth"], pol["topk"], pol["budget"])

        ones = [r for r in doc["runs"] if r["policy"] is not None and r["batch"] == 1]
        dense = {
            shape(r["policy"]): r
            for r in ones
            if not _ragged(r["policy"], 1) and not r["policy"].get("graft_budget", 0)
        }
        for r in ones:
            twin = dense.get(shape(r["policy"]))
            if twin is None or not _ragged(r["policy"], 1):
                continue
            measured = (r["phases_ms"]["verify"] - twin["phases_ms"]["verify"]) / 1e3
            priced = verify_s(r) - verify_s(twin)
            diffs.append(measured - priced)
    if not diffs:
        return cal, None
    med = float(np.median(diffs))
    sync = min(max(med, 0.0), RAGGED_SYNC_MAX_S)
    report = {
        "pairs": len(diffs),
        "median_ms": med * 1e3,
        "differences_ms": [x * 1e3 for x in diffs],
    }
    return dataclasses.replace(cal, ragged_sync_s=sync), report


# columns of the non-forward-phase fit (_overheads), in order; the last three are fitted only
# when runs of their kind are measured
OVERHEAD_COLUMNS = (
    "step_overhead_s",
    "per_request_overhead_s",
    "tree_build_s",
    "tree_build_per_node_s",
    "tree_build_per_level_s",
    "static_tree_build_s",
    "prune_step_s",
    "retrieval_per_request_s",
    "retrieval_step_s",
)


def _ragged(pol: dict[str, Any], batch: int) -> bool:
    """Whether a run's trees differ in size per request (pruned, or a shared budget above batch
    1): its verify is ragged and the cost model charges prune_step_s (CostModel.iteration)."""
    return pol.get("prune_threshold", 0.0) > 0 or (bool(pol.get("shared_budget")) and batch > 1)


def _overheads(measurements: Sequence[dict[str, Any]]) -> dict[str, float]:
    """step_overhead_s, per_request_overhead_s, tree_build_s and tree_build_per_node_s (and
    tree_build_per_level_s when dynamic-builder runs of two depths or more are measured,
    static_tree_build_s when static-builder runs are, prune_step_s when pruned runs are) by
    non-negative least squares over the non-forward phases, one row per run:
        speculation off: overhead                      = fixed + per_request * B
        on:              tree + accept + compact + ovh = fixed + per_request * B
                                                         + tree_build[builder] + per_node * B * N
                                                         + per_level * depth * [dynamic]
                                                         + prune_step * [ragged verify]
                                                         + (retrieval_step + retrieval_per_request
                                                            * B) * [graft]
    (N: verified tree nodes per sequence, root included, the measured mean of a ragged run; the
    cost model's step_overhead_time, prune_time and retrieval_time; the per-node cost is shared
    by both builders, the fixed tree cost is each builder's own; a ragged verify is a pruned or
    shared-budget (ECHO, batch > 1) run; the executor's retrieval lookup and grafting run in the
    tree phase). The ragged run's host read of its packed size is timed in its verify phase,
    which this fit does not see: prune_step_s fitted here is the tree phase's share."""
    tree_cols = [0.0] * (len(OVERHEAD_COLUMNS) - 2)  # speculation off: fixed + per request only
    a_rows, y = [], []
    for doc in measurements:
        for r in doc["runs"]:
            ph, b, pol = r["phases_ms"], r["batch"], r["policy"]
            if "ar_phases_ms" in r:
                a_rows.append([1.0, b, *tree_cols])
                y.append(r["ar_phases_ms"]["overhead"] / 1e3)
            if pol is None:
                a_rows.append([1.0, b, *tree_cols])
                y.append(ph["overhead"] / 1e3)
            else:
                dynamic = float(pol["builder"] != "static")
                graft = float(pol.get("graft_budget", 0) > 0)
                a_rows.append([
                    1.0, b, dynamic, b * _tokens(r), pol["depth"] * dynamic, 1.0 - dynamic,
                    float(_ragged(pol, b)), b * graft, graft,
                ])  # fmt: skip
                y.append((ph["tree"] + ph["accept"] + ph["compact"] + ph["overhead"]) / 1e3)
    if len(y) < 4:
        return {}
    from scipy.optimize import nnls

    a = np.array(a_rows)
    # a column no run has: nothing to fit its cost from (the Calibration's default stands);
    # the per-level cost needs dynamic runs of two depths (one depth: the fixed cost's twin)
    level = OVERHEAD_COLUMNS.index("tree_build_per_level_s")
    depths = set(a[a[:, 2] > 0, level].tolist())
    cols = [
        i for i in range(a.shape[1])
        if i < 4 or (a[:, i].any() and (i != level or len(depths) > 1))
    ]  # fmt: skip
    coef, _ = nnls(a[:, cols], np.array(y))
    return {OVERHEAD_COLUMNS[i]: float(c) for i, c in zip(cols, coef, strict=True)}


def _scalar(x: object) -> float:
    """The one value of a cost-model result (a 0-d or 1-element array)."""
    import numpy as np

    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


# Bounds of the interconnect fit. Efficiency <= 1: a ring all-reduce's bus bandwidth cannot
# pass the link's published per-direction bandwidth (HardwareSpec.interconnect_bytes_per_s:
# NVLink 4 on H100/H200 SXM, 18 links x 50 GB/s = 900 GB/s bidirectional, 450 GB/s each way,
# NVIDIA H100 datasheet). Latency: 0.5 us (a kernel launch) .. 1 ms; per ring step 0 .. 20 us.
# (name, lower, upper, start, scale)
LINK_PARAMS = (
    ("interconnect_efficiency", 1e-3, 1.0, 0.8, 0.1),
    ("allreduce_latency_s", 0.5e-6, 1e-3, 8e-6, 1e-6),
    ("allreduce_step_latency_s", 0.0, 20e-6, 0.5e-6, 1e-6),
)


def fit_interconnect(
    rows: Sequence[dict[str, Any]], hardware: str, base: Calibration
) -> tuple[Calibration, dict[str, Any]]:
    """`base` with the interconnect terms fitted to measured collectives (rows of
    spectune.executor.collectives.collective_sweep: op, tp, bytes, seconds per call, each call
    including its launch in the graph, which the cost model counts apart: base's launch_s;
    small all-reduces timed after the GEMM that writes them, as a forward runs them).

    - Per tp and op ('all_reduce', and 'all_gather' where swept), the regime law
      (validate.link_law.fit_link_law): Calibration.allreduce_law / allgather_law, what the
      cost model prices collectives at that tp with.
    - For a tp without rows, one ring law of every tp at once, by least squares on the
      log-ratio of operators.allreduce_time's ring formula (2*(tp-1)/tp * bytes / (link
      bytes/s * efficiency) + latency + 2*(tp-1) * step latency) + launch to the measured
      seconds; the step latency is fitted only when the rows hold two tp or more (one tp
      cannot tell it from the fixed latency).
    Every bus bandwidth is bounded by the link's published one. Returns the calibration and a
    report: the fits, the regimes and the MAPE per op and tp."""
    from scipy.optimize import least_squares

    from spectune.planner.operators import Rates
    from spectune.validate.link_law import fit_link_law

    hw = load_hardware(hardware)
    ar = [r for r in rows if r.get("op") == "all_reduce" and int(r["tp"]) > 1]
    if len(ar) < 2:
        raise SpecError("the interconnect fit needs at least 2 all-reduce rows with tp > 1")
    launch = Rates.resolve(hw, dataclasses.replace(base, hardware="")).launch_s
    tp = np.array([float(r["tp"]) for r in ar])
    size = np.array([float(r["bytes"]) for r in ar])
    meas = np.array([float(r["seconds"]) for r in ar])
    steps = 2 * (tp - 1)  # ring steps of an all-reduce; each link carries steps/tp of it
    link = hw.interconnect_bytes_per_s
    params = LINK_PARAMS if len(set(tp.tolist())) > 1 else LINK_PARAMS[:2]

    def model(x: np.ndarray) -> np.ndarray:
        step = x[2] if len(x) > 2 else 0.0
        return steps / tp * size / (link * x[0]) + x[1] + steps * step + launch

    sol = least_squares(
        lambda x: np.log(model(x) / meas),
        np.array([p[3] for p in params]),
        bounds=(np.array([p[1] for p in params]), np.array([p[2] for p in params])),
        x_scale=np.array([p[4] for p in params]),
    )
    fitted = {p[0]: float(v) for p, v in zip(params, sol.x, strict=True)}
    fitted.setdefault("allreduce_step_latency_s", 0.0)
    laws: dict[str, list[tuple[float, float, float, float]]] = {
        "all_reduce": [],
        "all_gather": [],
    }
    report: dict[str, Any] = {
        "interconnect_efficiency": fitted["interconnect_efficiency"],
        "allreduce_latency_us": fitted["allreduce_latency_s"] * 1e6,
        "allreduce_step_latency_us": fitted["allreduce_step_latency_s"] * 1e6,
        "busbw_gb_s": link * fitted["interconnect_efficiency"] / 1e9,
        "launch_us": launch * 1e6,
        "rows": len(ar),
    }
    pred = model(sol.x)
    for op, law in laws.items():
        for t in sorted({int(r["tp"]) for r in rows if r.get("op") == op and int(r["tp"]) > 1}):
            mine = [r for r in rows if r.get("op") == op and int(r["tp"]) == t]
            sel = sorted((float(r["bytes"]), float(r["seconds"])) for r in mine)
            if len(sel) < 2:
                continue
            b, sec = np.array([x[0] for x in sel]), np.array([x[1] for x in sel])
            law.extend(fit_link_law(b, sec, op, t, link, launch))
            got = link_law_time(tuple(law), op, t, b) + launch
            report[f"mape_{op.replace('_', '')}_tp{t}"] = float(np.mean(np.abs(got / sec - 1)))
            report[f"regimes_{op.replace('_', '')}_tp{t}"] = [
                {"from_bytes": row[1], "latency_us": row[2] * 1e6, "busbw_gb_s": row[3] / 1e9}
                for row in law
                if int(row[0]) == t
            ]
    for t in sorted(set(tp.tolist())):
        sel_t = tp == t
        report[f"mape_ring_allreduce_tp{int(t)}"] = float(
            np.mean(np.abs(pred[sel_t] / meas[sel_t] - 1))
        )
    tps = ", ".join(str(int(t)) for t in sorted(set(tp.tolist())))
    cal = dataclasses.replace(
        base,
        hardware=hw.name,
        interconnect_efficiency=fitted["interconnect_efficiency"],
        allreduce_latency_s=fitted["allreduce_latency_s"],
        allreduce_step_latency_s=fitted["allreduce_step_latency_s"],
        allreduce_law=tuple(laws["all_reduce"]),
        allgather_law=tuple(laws["all_gather"]),
        source=f"{base.source}; interconnect: {len(ar)} all-reduce timings (tp {tps}) fitted "
        "per tp and message-size regime, and one ring law for other tp "
        "(spectune.validate.fit.fit_interconnect)",
    )
    return cal, report


#: an in-forward all-reduce offset above this is not a collective's cost: the offset is clipped
#: there (below, at the law's least latency)
INFORWARD_OFFSET_MAX_S = 50e-6
#: grid points a message size needs for an in-forward offset of its own; a size timed fewer
#: times takes the median of every point (one point's noise, 1% of a 35 ms forward, is 5 us an
#: all-reduce: benchmarks/results/tp_classes_h200/README.md)
INFORWARD_SIZE_POINTS = 2


def _law_by_size(
    rows: Sequence[tuple[float, ...]], tp: int, sizes: Sequence[float], offsets: Sequence[float]
) -> tuple[tuple[float, ...], ...]:
    """All-reduce law rows at `tp` (Calibration.allreduce_law's form): `rows` (that tp's
    regimes, ascending) cut at the geometric midpoints between consecutive `sizes`, each piece's
    latency raised by the offset of the size nearest it (in log bytes), so a message the grid
    timed costs the law's time + its size's offset; a piece that would start below where the
    previous one ends is raised to meet it, so the law never falls with size (what a smaller
    offset after a larger one would make it do). Bandwidths stay the law's. Shapes: sizes
    ascending, as many offsets."""
    f = link_factor("all_reduce", tp)
    mids = [float(np.sqrt(x * y)) for x, y in itertools.pairwise(sizes)]
    law: list[list[float]] = []
    for start in sorted({r[1] for r in rows} | set(mids)):
        row = max((r for r in rows if r[1] <= start), key=lambda r: r[1])
        nearest = int(np.searchsorted(mids, start, side="right"))
        law.append([float(tp), start, row[2] + offsets[nearest], row[3]])
    for prev, cur in itertools.pairwise(law):
        short = (prev[2] + f * cur[1] / prev[3]) - (cur[2] + f * cur[1] / cur[3])
        cur[2] += max(short, 0.0) * (1 + 1e-9)
    return tuple(tuple(r) for r in law)


def fit_inforward_offset(
    run: dict[str, Any],
    cal: Calibration,
    *,
    target: ModelSpec | None = None,
    drafter: ModelSpec | None = None,
) -> tuple[Calibration, dict[str, Any] | None]:
    """`cal` with the all-reduce law at the run's tp moved, message size by message size, by
    what each all-reduce of a split forward costs beyond (or short of) the law. The
    collectives sweep times every all-reduce in place after a GEMM; inside a forward they cost
    more, by the size: on the 2x H100 pairs +2..+3 us up to 512 KiB, +5..+7 us at 2 MiB (NCCL's
    LL protocol still, at 70 GB/s in the sweep), less again from 4 MiB (benchmarks/results/
    tp_h100x2_h, -_i; every grid with a 2 MiB point reads +5..+7 us there, on H100 and H200).
    A TP calibration run times each verify-grid point with and without its collectives
    ("seconds_nocomm"), so per point (seconds - seconds_nocomm - the model's collectives) /
    (2 x layers) is that cost (the model's collectives: the forward's "comm" class, launches
    and the gather's layout copy included, as seconds_nocomm leaves them all out; two
    all-reduces a layer carry the cost; the logits' all-gather keeps its law). Each message
    size the grid timed INFORWARD_SIZE_POINTS times or more takes the median of its points,
    every other size the median of all points; each is clipped to [-(the law's least latency at
    that tp), INFORWARD_OFFSET_MAX_S], and the law at that tp is raised by it around that size
    (_law_by_size). Returns `cal` unchanged and None where the run has no such points or `cal`
    no law rows at its tp; else the report {tp, offset_us: the median over all points, points,
    spread_us: their interquartile range, by_size: [{bytes, offset_us, points}]}. `target`,
    `drafter`: the run's models where they are not presets (default: the presets the run
    names)."""
    from spectune.planner.costmodel import CostModel
    from spectune.planner.operators import ACT_BYTES

    tp = int(run.get("tp", 1))
    pts = [r for r in run.get("verify", []) if "seconds_nocomm" in r]
    rows = sorted((r for r in cal.allreduce_law if int(r[0]) == tp), key=lambda r: r[1])
    if tp < 2 or not pts or not rows:
        return cal, None
    target = target or load_model(run["target"])
    hw = load_hardware(run["hardware"])
    cm = CostModel(hw, target, drafter or load_model(run["drafter"]), tp=tp, calibration=cal)
    per = np.array([
        (r["seconds"] - r["seconds_nocomm"]
         - _scalar(cm.verify_breakdown(r["batch"], r["tokens"], r["context"])["comm"]))
        / (2 * target.layers)
        for r in pts
    ])  # fmt: skip
    # the message of each all-reduce: every verified token's hidden state
    size = np.array([r["batch"] * r["tokens"] * target.hidden * ACT_BYTES for r in pts], float)
    floor = -min(row[2] for row in rows)
    median = float(np.median(per))
    sizes = sorted(set(size.tolist()))
    offset = {
        b: float(np.clip(
            np.median(per[size == b]) if np.sum(size == b) >= INFORWARD_SIZE_POINTS else median,
            floor, INFORWARD_OFFSET_MAX_S,
        ))
        for b in sizes
    }  # fmt: skip
    moved = tuple(r for r in cal.allreduce_law if int(r[0]) != tp) + _law_by_size(
        rows, tp, sizes, [offset[b] for b in sizes]
    )
    q1, q3 = np.percentile(per, [25, 75])
    report = {
        "tp": tp,
        "offset_us": float(np.clip(median, floor, INFORWARD_OFFSET_MAX_S)) * 1e6,
        "points": len(pts),
        "spread_us": float(q3 - q1) * 1e6,
        "by_size": [
            {"bytes": b, "offset_us": offset[b] * 1e6, "points": int(np.sum(size == b))}
            for b in sizes
        ],
    }
    return dataclasses.replace(cal, allreduce_law=moved), report


#: bounds of a fitted Calibration.tp_gemm_scale factor: the split grids measured 0.87..1.10
#: (benchmarks/results/tp_gemm_scale_cpu over tp_h100x2_*, tp_h200x2_*, tp_h200x4_*); a point
#: past these is not the GEMMs' kernel choice (a slow host, a grid without its collectives'
#: offset)
TP_GEMM_SCALE_CLIP = (0.8, 1.25)


def fit_tp_gemm_scale(
    run: dict[str, Any],
    cal: Calibration,
    *,
    target: ModelSpec | None = None,
    drafter: ModelSpec | None = None,
) -> tuple[Calibration, dict[str, Any] | None]:
    """`cal` with the weight-GEMM time of models of the run's target's hidden size at the
    run's tp scaled, row count by row count, so that the split grid's forwards cost what they
    measured (Calibration.tp_gemm_scale; rows of other tp or hidden sizes are kept).

    Per verify point: 1 + (seconds - price) / (the price's weight-GEMM time), the price being
    `cal`'s with no factor at that tp and hidden size, and the GEMM time what a factor of 2
    adds to it. The in-forward all-reduce offset (fit_inforward_offset) goes first, so the
    points' collectives are priced as the grid timed them and what is left is the shard's
    compute. Each row count (batch x tokens; the grid's batches are graph sizes) takes the
    median over its points, clipped to TP_GEMM_SCALE_CLIP. Returns `cal` unchanged and None
    where the run is at tp 1 or has no verify points; else the report {tp, hidden, by_rows:
    [{rows, scale, points}]}.
    `target`, `drafter`: the run's models where they are not presets (default: the presets the
    run names)."""
    from spectune.planner.costmodel import CostModel

    tp = int(run.get("tp", 1))
    pts = run.get("verify", [])
    if tp < 2 or not pts:
        return cal, None
    target = target or load_model(run["target"])
    drafter = drafter or load_model(run["drafter"])
    hw = load_hardware(run["hardware"])
    key = (float(tp), float(target.hidden))
    others = tuple(r for r in cal.tp_gemm_scale if (r[0], r[1]) != key)
    plain = dataclasses.replace(cal, tp_gemm_scale=others)
    doubled = dataclasses.replace(cal, tp_gemm_scale=(*others, (*key, 1.0, 2.0)))
    price = CostModel(hw, target, drafter, tp=tp, calibration=plain)
    price2 = CostModel(hw, target, drafter, tp=tp, calibration=doubled)
    by_rows: dict[float, list[float]] = {}
    for r in pts:
        shape = (r["batch"], r["tokens"], r["context"])
        t = _scalar(price.verify_time(*shape))
        gemm = _scalar(price2.verify_time(*shape)) - t  # the weight GEMMs' share of t
        by_rows.setdefault(float(r["batch"] * r["tokens"]), []).append(
            1.0 + (r["seconds"] - t) / gemm
        )
    lo, hi = TP_GEMM_SCALE_CLIP
    scale = {m: float(np.clip(np.median(v), lo, hi)) for m, v in sorted(by_rows.items())}
    cal = dataclasses.replace(
        cal, tp_gemm_scale=(*others, *((*key, m, s) for m, s in scale.items()))
    )
    report = {
        "tp": tp,
        "hidden": target.hidden,
        "by_rows": [{"rows": m, "scale": s, "points": len(by_rows[m])} for m, s in scale.items()],
    }
    return cal, report
