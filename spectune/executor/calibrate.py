"""`spectune calibrate`: micro-benchmarks on the GPU, written as a calibration-run document that
spectune.validate.fit turns into the cost model's Calibration.

What is measured (all medians of CUDA-event timings after warm-up):
- copy bandwidth: a 1 GiB device-to-device copy, bytes read + written per second (the roofline
  floor's denominator) and a large bf16 matmul's FLOP/s;
- GEMM time by token count M for each weight shape of the target (q|k|v, o, gate|up, down,
  LM head), weights rotated across copies so that L2 never holds them;
- attention time by batch x context x tree size for one layer (the executor's backend);
- fixed per-step overhead: the replay of a one-kernel CUDA graph;
- the verify grid: whole target forwards (CUDA graph) over batch x tree tokens x context, with
  `--kernel-classes` each also profiled by kernel class (kernel_classes: weight GEMMs + logits,
  attention), reported beside the fit;
- short speculative-decoding runs, one policy per tree builder (SPEC_POLICIES: a top-1 chain
  (vLLM's 3/1/4), dynamic top-k small, large and wide (EAGLE's 7/10/60), static, pruned,
  pruned + grafted, shared budget) at a few batches, phase by phase (session.measure_runs), so
  the fit sees this GPU's draft-step, tree-building (fixed, per level, per node), prune and
  graft fixed costs (`spec_runs`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spectune.executor.session import Session, measure_runs
from spectune.kernels.gemm import linear, rotating_weights
from spectune.kernels.span_attention import span_attention
from spectune.kernels.stream import stream_read
from spectune.kernels.timing import PhaseTimer, graph_time
from spectune.kernels.tree_attention_plan import TreeAttentionPlan
from spectune.specs import TreePolicy

RUN_SCHEMA = "spectune.calibration-run/v1"
GEMM_TOKENS = (1, 4, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
# one short run per tree builder: what the fit needs to separate the builders' fixed costs
# (SGLang's default 5/4/8 and a 6/8/32 tree give the per-node tree cost; the pruned, grafted
# and shared-budget variants of 6/8/32 their own fixed costs). The shared budget's trees
# straddle a 128-row attention tile (Llama-3.1-8B: 4 query heads per KV head x 32 tokens), so
# its ragged verify against the dense 6/8/32 also fixes Calibration.ragged_tile_m (a 5/4/8
# shared budget, every tree inside one tile, could not: measurements/h100's fit left it weak).
# EAGLE's 7/10/60 selects over B x 10 rows per step: beside the top-k 4 and 8 runs it tells the
# per-row selection cost (Calibration.draft_select_bytes_per_s) from the fixed cost per step
# (runs reaching only B x topk = 256 left it weak, rel. s.e. 0.4). vLLM's 3/1/4 chain spreads
# the dynamic trees' depths to 3..7, so the tree's cost per level
# (Calibration.tree_build_per_level_s) is told from its fixed cost: with depths 5-7 alone the
# fit put it at 3 us where the batch-1 tree phases step ~20-30 us a level, and priced the
# depth-3 chain's tree phase 35-40 us high at tp 2 (benchmarks/results/tp_h100x2_c)
SPEC_POLICIES = (
    TreePolicy("dynamic-topk", 3, 1, 4),
    TreePolicy("dynamic-topk", 5, 4, 8),
    TreePolicy("dynamic-topk", 6, 8, 32),
    TreePolicy("dynamic-topk", 7, 10, 60),
    TreePolicy("static", 5, 4, 8),
    TreePolicy("dynamic-topk", 6, 8, 32, 0.05),
    TreePolicy("dynamic-topk", 6, 8, 32, 0.05, 8),
    TreePolicy("dynamic-topk", 6, 8, 32, shared_budget=True),
)
SPEC_BATCHES = (1, 8, 32)


def _time(fn: Any, reps: int, device: torch.device, inner: int = 1) -> float:
    """Median seconds of fn() (called `inner` times per timed rep)."""
    for _ in range(2):
        fn()

    def block() -> None:
        for _ in range(inner):
            fn()

    timer = PhaseTimer(("x",), reps, device)
    timer.run([block])
    return timer.medians_s()["x"] / inner


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a device copy (read + write counted)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    b = torch.empty_like(a)
    t = _time(lambda: b.copy_(a), 10, device)
    return 2 * nbytes / t


def read_bandwidth(device: torch.device, nbytes: int = 1 << 30) -> float:
    """Bytes/s of a streaming read: a sum over `nbytes` of bf16 (nbytes read, 4 bytes written).
    Weight streaming and the attention KV read are reads; a copy also writes, and on HBM3/HBM3e
    a mixed read/write stream runs below the read-only rate.
    The faster of torch's sum and a persistent streaming-read kernel (kernels.stream): on an
    H100 both read 3.01-3.02 TB/s (benchmarks/results/probe_read_h100.json)."""
    a = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=device).uniform_()
    t = _time(lambda: a.sum(dtype=torch.float32), 10, device)
    if device.type == "cuda":
        t = min(t, _time(lambda: stream_read(a), 10, device))
    return nbytes / t


def matmul_flops(device: torch.device, n: int = 8192) -> float:
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    t = _time(lambda: torch.mm(a, b), 10, device)
    return 2 * n**3 / t


def gemm_sweep(session: Session, tokens: Sequence[int] = GEMM_TOKENS) -> list[dict[str, Any]]:
    """Seconds of x[M, K] @ W[N, K].T per weight shape of the target and M."""
    s = session.target.spec
    dev = session.device
    shapes = {
        "qkv": ((s.heads + 2 * s.kv_heads) * s.head_dim, s.hidden),
        "o": (s.hidden, s.heads * s.head_dim),
        "gate_up": (2 * s.ffn, s.hidden),
        "down": (s.hidden, s.ffn),
        "lm_head": (s.vocab, s.hidden),
    }
    rows = []
    for name, (n, k) in shapes.items():
        ws = rotating_weights(n, k, dev)
        for m in tokens:
            x = torch.empty((m, k), device=dev, dtype=torch.bfloat16).uniform_(-1, 1)

            def call(x: torch.Tensor = x, ws: list[torch.Tensor] = ws) -> None:
                for w in ws:
                    linear(x, w)

            t = graph_time(call, dev, 10) / len(ws)
            rows.append(
                {
                    "op": name,
                    "m": m,
                    "n": n,
                    "k": k,
                    "seconds": t,
                    "tflops": 2 * m * n * k / t / 1e12,
                    "gb_s": (n * k + m * (n + k)) * 2 / t / 1e9,
                }
            )
        del ws
    return rows


def attention_sweep(
    session: Session, batches: Sequence[int], contexts: Sequence[int], tokens: Sequence[int]
) -> list[dict[str, Any]]:
    """Seconds of one layer's tree attention per (batch, context, tree tokens)."""
    s = session.target.spec
    dev = session.device
    rows = []
    kv_all = session.tcache.layer(0, session.cfg.max_batch)
    for b in batches:
        for c in contexts:
            for n in tokens:
                kv = kv_all[:, :b]
                q = torch.randn((b, n, s.heads, s.head_dim), device=dev, dtype=torch.bfloat16)
                mask = (
                    torch.ones((n, n), dtype=torch.bool, device=dev)
                    .tril()
                    .expand(b, n, n)
                    .contiguous()
                )
                plan = (
                    TreeAttentionPlan(b, n, c, session.tcache.capacity, session.target.heads, dev)
                    if session.use_kernels
                    else None
                )
                if plan is not None:
                    plan.set_mask(mask)

                def fn(
                    q: torch.Tensor = q,
                    kv: torch.Tensor = kv,
                    mask: torch.Tensor = mask,
                    c: int = c,
                    n: int = n,
                    plan: TreeAttentionPlan | None = plan,
                ) -> None:
                    if plan is not None:
                        plan.run(q, kv)
                        return
                    span_attention(
                        q,
                        kv[0, :, :c].transpose(1, 2),
                        kv[1, :, :c].transpose(1, 2),
                        kv[0, :, c : c + n].transpose(1, 2),
                        kv[1, :, c : c + n].transpose(1, 2),
                        mask,
                    )

                t = graph_time(fn, dev, 10)
                kv_bytes = b * (c + n) * 2 * s.kv_heads * s.head_dim * 2
                rows.append(
                    {
                        "batch": b,
                        "context": c,
                        "tokens": n,
                        "seconds": t,
                        "kv_bytes": kv_bytes,
                        "gb_s": kv_bytes / t / 1e9,
                    }
                )
    return rows


def graph_step_overhead(device: torch.device) -> float:
    """Seconds between two replays of a one-kernel CUDA graph (the fixed cost of a step)."""
    x = torch.zeros(1, device=device)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x.add_(1)
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        x.add_(1)
    return _time(g.replay, 50, device)


#: kernel name fragments (lower case) -> the cost model's operator class they belong to
#: (planner.forward): "linear" = weight GEMMs and the LM head's logits pass (qkv_o + mlp +
#: lm_head), "attention" = tree / span attention and their split merges. Every other kernel
#: (norms, RoPE + KV store, residuals, SiLU, the embedding gather) is "other", priced as
#: elementwise work plus one launch each. Names: the executor's Triton kernels
#: (spectune/kernels), cuBLAS (nvjet_*, sm90_xmma*, cutlass*, splitKreduce) and torch's argmax.
KERNEL_CLASS_NAMES = {
    "linear": ("_splitk_kernel", "_fused_linear_kernel", "_moe_gemm_kernel", "nvjet", "xmma",
               "cutlass", "gemm", "splitkreduce", "argmax"),
    "attention": ("_tree_attention_kernel", "_merge_splits_kernel", "_prefix_split_kernel",
                  "_span_merge_kernel", "attention", "flash"),
}  # fmt: skip


def kernel_class(name: str) -> str:
    """'linear', 'attention' or 'other' for a CUDA kernel's name (KERNEL_CLASS_NAMES)."""
    low = name.lower()
    for cls, frags in KERNEL_CLASS_NAMES.items():
        if any(f.lower() in low for f in frags):
            return cls
    return "other"


def exclusive_durations(
    kernels: Sequence[tuple[str, float, float]],
) -> list[tuple[str, float, float]]:
    """(name, start, exclusive duration) of kernels given as (name, start, end), in start order:
    each kernel is charged only the time after every earlier-started kernel has ended. A kernel
    launched with programmatic dependent launch starts while its predecessor runs and waits
    inside; its own start-to-end span would count that wait twice (a profiled forward's class
    sums then exceed its wall time: 6.3 ms of kernels in a 5.6 ms tp 1 forward on an H200). The
    exclusive durations sum to the union of the spans, never more than the wall time."""
    out = []
    frontier = -math.inf
    for name, start, end in sorted(kernels, key=lambda k: (k[1], k[2])):
        out.append((name, start, max(0.0, end - max(start, frontier))))
        frontier = max(frontier, end)
    return out


def kernel_classes(fn: Callable[[], None], reps: int = 3) -> dict[str, float]:
    """Seconds per call of fn's CUDA kernels by class ({'linear_s', 'attention_s'}: the kernels'
    exclusive durations (exclusive_durations), mean over `reps` calls under torch.profiler;
    'kernels': kernels per call), or {} where the profiler sees no kernels (e.g. a tracer that
    cannot see inside graphs)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    sums = {"linear": 0.0, "attention": 0.0, "other": 0.0}
    spans = [
        (e.name, float(e.time_range.start), float(e.time_range.end))
        for e in prof.events()
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start
    ]
    count = len(spans)
    for name, _, dur_us in exclusive_durations(spans):
        sums[kernel_class(name)] += dur_us * 1e-6
    if count == 0:
        return {}
    return {
        "linear_s": sums["linear"] / reps,
        "attention_s": sums["attention"] / reps,
        "kernels": count / reps,
    }


def verify_grid(
    session: Session,
    batches: Sequence[int],
    tokens: Sequence[int],
    contexts: Sequence[int],
    classes: bool = False,
) -> list[dict[str, Any]]:
    """Rows {batch, tokens, context, seconds} of Session.verify_time, and with `classes` (on a
    GPU) the same graph's kernel time by class (kernel_classes: linear_s, attention_s,
    kernels). Whole-forward times alone cannot tell the weight bandwidth from the per-kernel
    costs (every grid point runs the same kernels); the classes can, and the fit reports them
    (validate.fit.WEIGHTS says why it does not fit them yet)."""
    prof = kernel_classes if classes and session.device.type == "cuda" else None
    rows = []
    for c in contexts:
        for b in batches:
            for n in tokens:
                t, cls = session.verify_timing(b, n, c, profile=prof)
                rows.append({"batch": b, "tokens": n, "context": c, "seconds": t, **cls})
                extra = (
                    f"  (linear {cls['linear_s'] * 1e3:.3f}, attention {cls['attention_s'] * 1e3:.3f})"
                    if cls
                    else ""
                )
                print(f"  verify B={b:<3} N={n:<4} C={c:<5} {t * 1e3:8.3f} ms{extra}", flush=True)
    return rows


def lap(what: str, since: float) -> float:
    """Print how long `what` took since `since` (time.perf_counter); return now. calibrate's
    progress log, so a slow part is visible in the log of a run that ran out of time."""
    now = time.perf_counter()
    print(f"[{what}: {now - since:.1f} s]", flush=True)
    return now


def calibration_run(
    session: Session,
    *,
    gpu: str,
    hardware: str,
    batches: Sequence[int],
    tokens: Sequence[int],
    contexts: Sequence[int],
    attention_grid: bool = True,
    acceptance: object | None = None,
    workload: str = "",
    spec_batches: Sequence[int] = SPEC_BATCHES,
    spec_context: int | None = None,
    spec_steps: int = 20,
    kernel_classes: bool = False,
    draft_widths: Sequence[int] = (),
) -> dict[str, Any]:
    """Every micro-benchmark above as one calibration-run document (the speculative runs only
    when an `acceptance` model is given; at `spec_context`, default the largest context; the
    verify grid's kernel time by class with `kernel_classes`; with `draft_widths`, the
    drafter's step over contexts x batches x those frontier widths, rows "draft", as the TP
    split grids time them at tp > 1, executor.tp_jobs)."""
    dev = session.device
    t = time.perf_counter()
    doc: dict[str, Any] = {
        "schema": RUN_SCHEMA,
        "gpu": gpu,
        "hardware": hardware,
        "target": session.target.spec.name,
        "drafter": session.drafter.spec.name,
        "attention": session.attention_backend,
    }
    doc["copy_bytes_per_s"] = copy_bandwidth(dev)
    doc["read_bytes_per_s"] = read_bandwidth(dev)
    doc["matmul_flops"] = matmul_flops(dev)
    doc["graph_step_s"] = graph_step_overhead(dev)
    print(
        f"copy {doc['copy_bytes_per_s'] / 1e12:.2f} TB/s, read {doc['read_bytes_per_s'] / 1e12:.2f} TB/s, matmul {doc['matmul_flops'] / 1e12:.0f} TFLOP/s, "
        f"graph step {doc['graph_step_s'] * 1e6:.1f} us",
        flush=True,
    )
    t = lap("ceilings", t)
    doc["gemm"] = gemm_sweep(session)
    t = lap("GEMM sweep", t)
    if attention_grid:
        doc["attention_rows"] = attention_sweep(session, batches, contexts, tokens)
        t = lap("attention sweep", t)
    doc["verify"] = verify_grid(session, batches, tokens, contexts, classes=kernel_classes)
    t = lap("verify grid", t)
    if draft_widths:
        doc["draft"] = [
            {"batch": b, "tokens": w, "context": c,
             "seconds": session.draft_step_timing(b, w, c)[0]}
            for c in contexts for b in batches for w in draft_widths
        ]  # fmt: skip
        t = lap("drafter steps", t)
    if acceptance is not None:
        c = spec_context or max(contexts)
        doc["spec_runs"] = spec_runs(session, acceptance, workload, spec_batches, c, spec_steps)
        lap("speculative runs", t)
    # the GEMM variants and tree-attention launches this process ran (they can differ from
    # execute's; `spectune execute --gemm-plan` runs the GEMMs again)
    doc.update(session.kernel_plans())
    return doc


def spec_runs(
    session: Session,
    acceptance: object,
    workload: str,
    batches: Sequence[int],
    context: int,
    steps: int,
    policies: Sequence[TreePolicy] = SPEC_POLICIES,
) -> dict[str, Any]:
    """Short speculative runs of `policies` at `batches` (a shared budget only above batch 1,
    where it differs from the per-request tree), phase by phase: the calibration run's
    `spec_runs` ({"context", "workload", "steps", "runs"}; runs as a measurement's)."""
    runs: list[tuple[int, TreePolicy | None, str]] = [
        (b, p, p.label) for b in batches for p in policies if not (p.shared_budget and b == 1)
    ]
    recs = measure_runs(session, runs, context, acceptance, steps, keep_going=True)
    return {"context": context, "workload": workload, "steps": steps, "runs": recs}
