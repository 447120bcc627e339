"""Where a target forward's time goes, kernel by kernel: are decode forwards (one token per
sequence) faster than the sum of their priced parts because kernels overlap?

Every fitted calibration prices the no-speculation step (N = 1) 1-4.5% high at batch 4-64 while
N = 16 rows of the same verify grid fit (measurements/*newuser*, benchmarks/results/new_gpu_*),
and the fitted attention bandwidth sits at its ceiling (the measured read rate). This probe
replays the executor's real-shape Llama-3.1-8B forward (Session.verify_time's graph: forward,
LM head, argmax) under torch.profiler and reports, per (batch, tokens) of `--shapes` at
`--context` (default 4096):

- wall: the graph replay's median time (the number the verify grid records);
- kernel sum: the sum of the kernels' own durations; span: first kernel start to last end;
  sum > span means kernels overlapped (programmatic dependent launch lets a kernel start while
  its predecessor drains); span - sum > 0 is launch gaps;
- per class (executor.calibrate.kernel_class: "linear" = weight GEMMs and the logits argmax,
  "attention" = tree attention and its merge, "other"): time, count, and for attention the KV
  bytes per second it streamed (B x (context + N) x 2 x kv_width x 2 bytes
  per layer), beside the copy and read rates the calibration measures;
- per kernel name (the 40 longest): summed time and launches, so two shapes' forwards can be
  told apart kernel by kernel. The JSON also keeps the session's GEMM plan and autotune rows
  and the tree-attention tuning rows of every shape.

    PYTHONPATH=. python benchmarks/probe_forward_kernels.py --out $OUT/forward_kernels.json
    PYTHONPATH=. python benchmarks/probe_forward_kernels.py --shapes 1x1,1x4,1x16,1x32,1x64

One GPU (H100 or H200), about a minute after the GEMM autotune. Prints a table last.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import torch

from spectune.executor.calibrate import (
    copy_bandwidth,
    exclusive_durations,
    kernel_class,
    read_bandwidth,
)
from spectune.executor.graphs import PhaseGraphs
from spectune.executor.session import Session, SessionConfig
from spectune.kernels.timing import PhaseTimer
from spectune.kernels.tree_attention_plan import TreeAttentionPlan
from spectune.specs import load_model

SHAPES = "1x1,8x1,64x1,8x16,64x16"
CONTEXT = 4096
#: kernel names kept per shape in "by_name_us" (the longest by summed time)
TOP_NAMES = 40


def _forward(s: Session, batch: int, tokens: int, context: int) -> Any:
    dev = s.device
    s.tune(batch, tokens, context)
    tok = torch.randint(0, s.target.spec.vocab, (batch, tokens), device=dev)
    pos = context + torch.arange(tokens, device=dev).expand(batch, tokens)
    mask = torch.ones((tokens, tokens), dtype=torch.bool, device=dev).tril()
    mask = mask.expand(batch, tokens, tokens).contiguous()
    plan = TreeAttentionPlan(batch, tokens, context, s.tcache.capacity, s.target.heads, dev)
    plan.set_mask(mask)
    out = torch.zeros((batch, tokens), dtype=torch.int64, device=dev)

    def fwd() -> None:
        h, _ = s.target.forward(tok, pos, s.tcache, context, mask, plan=plan)
        out.copy_(s.target.lm_head(h).argmax(dim=-1))

    return fwd


def _profile(fn: Any, reps: int) -> list[list[tuple[str, float, float]]]:
    """Kernels (name, start us, exclusive duration us) of each of `reps` calls of fn, split by
    call (executor.calibrate.exclusive_durations)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
            torch.cuda.synchronize()
    # exclusive durations: a PDL kernel's wait for its predecessor is not counted twice
    ev = exclusive_durations(
        [
            (e.name, float(e.time_range.start), float(e.time_range.end))
            for e in prof.events()
            if e.device_type == torch.autograd.DeviceType.CUDA
            and e.time_range.end > e.time_range.start
        ]
    )
    if not ev:
        return []
    # calls are separated by a host sync: split at the largest gaps
    gaps = sorted(
        range(1, len(ev)), key=lambda i: ev[i][1] - (ev[i - 1][1] + ev[i - 1][2]), reverse=True
    )[: reps - 1]
    cuts = [0, *sorted(gaps), len(ev)]
    return [ev[a:b] for a, b in itertools.pairwise(cuts)]


def _graph_profile(fwd: Any, dev: torch.device, reps: int) -> dict[str, Any]:
    """The forward replayed from a CUDA graph: median wall time (us) and, over `reps` profiled
    calls, the kernels' summed durations and span (medians), time and count by class
    (executor.calibrate.kernel_class), and the 8 longest kernels of the first call."""
    g = PhaseGraphs([fwd], dev, True)
    fn = g.phases()[0]
    for _ in range(3):
        fn()
    timer = PhaseTimer(("x",), 10, dev)
    timer.run([fn])
    wall = timer.medians_s()["x"] * 1e6
    calls = _profile(fn, reps)
    del g
    counts: dict[str, int] = {}
    sums, spans = [], []
    for call in calls:
        counts = dict(Counter(kernel_class(x[0]) for x in call))
        sums.append(sum(d for _, _, d in call))
        spans.append(call[-1][1] + call[-1][2] - call[0][1])
    return {
        "wall_us": wall,
        "kernel_sum_us": statistics.median(sums) if sums else None,
        "span_us": statistics.median(spans) if spans else None,
        "by_class_us": by_class(calls),
        "kernels": counts,
        "top": sorted(
            {nm: d for nm, _, d in (calls[0] if calls else [])}.items(), key=lambda x: -x[1]
        )[:8],
        "by_name_us": _by_name(calls),
    }


def by_class(
    calls: list[list[tuple[str, float, float]]], classify: Callable[[str], str] = kernel_class
) -> dict[str, float]:
    """Class (`classify` of a kernel name) -> median over the calls of its summed us."""
    per: dict[str, list[float]] = defaultdict(list)
    for call in calls:
        by: dict[str, float] = defaultdict(float)
        for name, _, dur in call:
            by[classify(name)] += dur
        for k, v in by.items():
            per[k].append(v)
    return {k: statistics.median(v) for k, v in per.items()}


def _by_name(calls: list[list[tuple[str, float, float]]]) -> dict[str, list[float]]:
    """Kernel name -> [median summed us per call, launches per call], the TOP_NAMES longest:
    what a change of shape adds, kernel by kernel."""
    sums: dict[str, list[float]] = defaultdict(list)
    count: dict[str, int] = {}
    for call in calls:
        by: dict[str, float] = defaultdict(float)
        for name, _, dur in call:
            by[name[:120]] += dur
        for k, v in by.items():
            sums[k].append(v)
        count = {k: sum(1 for x in call if x[0][:120] == k) for k in by}
    med = {k: statistics.median(v) for k, v in sums.items()}
    top = sorted(med, key=lambda k: -med[k])[:TOP_NAMES]
    return {k: [med[k], count.get(k, 0)] for k in top}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument(
        "--shapes", default=SHAPES, help="comma-separated BxN (batch x tree tokens) at --context"
    )
    p.add_argument("--context", type=int, default=CONTEXT)
    args = p.parse_args()
    shapes = [tuple(int(v) for v in sh.split("x")) for sh in args.shapes.split(",")]
    dev = torch.device("cuda")
    target, drafter = load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
    cfg = SessionConfig(
        max_batch=max(b for b, _ in shapes),
        max_context=args.context,
        max_tree=max(16, max(n for _, n in shapes)),
    )
    s = Session(target, drafter, cfg, dev)
    kv_w = target.kv_heads * target.head_dim
    res: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "copy_bytes_per_s": copy_bandwidth(dev),
        "read_bytes_per_s": read_bandwidth(dev),
        "shapes": [],
    }
    for b, n in shapes:
        fwd = _forward(s, b, n, args.context)
        row: dict[str, Any] = {"batch": b, "tokens": n, "context": args.context}
        row["graph"] = _graph_profile(fwd, dev, args.reps)
        kv_bytes = target.layers * b * (args.context + n) * 2 * kv_w * 2
        att = row["graph"]["by_class_us"].get("attention")
        row["attention_kv_tb_s"] = kv_bytes / (att * 1e-6) / 1e12 if att else None
        res["shapes"].append(row)
        print(json.dumps(row)[:400], flush=True)
    res["gemm_plan"] = s.gemm_plan
    res["gemm_rows"] = s.gemm_rows
    res["attention_rows"] = s.attention_rows
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    print(
        f"{res['gpu']}: copy {res['copy_bytes_per_s'] / 1e12:.3f} TB/s, "
        f"read {res['read_bytes_per_s'] / 1e12:.3f} TB/s"
    )
    print(f"{'B':>3} {'N':>3} {'wall':>8} {'ksum':>8} {'span':>8} {'attn':>8} "
          f"{'linear':>8} {'other':>8} {'attn TB/s':>9}")  # fmt: skip
    for r in res["shapes"]:
        m = r["graph"]
        c = m["by_class_us"]
        print(
            f"{r['batch']:>3} {r['tokens']:>3} {m['wall_us']:>8.1f} "
            f"{m['kernel_sum_us'] or 0:>8.1f} {m['span_us'] or 0:>8.1f} "
            f"{c.get('attention', 0):>8.1f} {c.get('linear', 0):>8.1f} {c.get('other', 0):>8.1f} "
            f"{r['attention_kv_tb_s'] or 0:>9.3f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
