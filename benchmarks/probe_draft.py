"""Where the drafting phase spends its time at large batch, against the cost model's draft parts.

measurements/h100 (and h200-rerun) price the draft phase of EAGLE's default 7/10/60 tree 15%
(H100) and 13% (H200) under what the executor measured at batch 64, and SGLang's 5/4/8 7% and
13% under; the gap grows faster than the batch (batch 32: 9% and 9% for 7/10/60). This probe
profiles one eager draft phase (SpecRunner.draft: the first step over the root, then depth - 1
steps over the top-k frontier, each with its LM head, top-k and pool bookkeeping) per policy
and batch with torch.profiler, sums CUDA time per kernel, groups the kernels (GEMM, attention,
top-k/sort, other) and prints them beside CostModel.draft_parts under the committed
calibration (first / later steps / bookkeeping). A term the model lacks shows as a kernel group
larger than its share of the priced parts.

    PYTHONPATH=$PWD python benchmarks/probe_draft.py --out $OUT [--batches 8,32,64]
        [--policies 'dynamic-topk:5,4,8;dynamic-topk:6,5,32'] [--calibration FILE]
        (nvidia-h100-x1, about 3 minutes: one session at batch 64, 6 policy x batch profiles)
    python benchmarks/probe_draft.py --tiny    (CPU: tiny models, the plumbing only)

Writes $OUT/probe_draft.json (every kernel's CUDA microseconds per run); last line: one JSON
document (the grouped table).
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from spectune.executor.loop import SpecRunner
from spectune.executor.session import Session, SessionConfig
from spectune.planner.acceptance import acceptance_model
from spectune.planner.costmodel import CostModel
from spectune.specs import ModelSpec, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import load_calibration

POLICIES = (TreePolicy("dynamic-topk", 5, 4, 8), TreePolicy("dynamic-topk", 7, 10, 60))
CALIBRATION = "measurements/h100/calibration-h100-sxm.json"
GROUPS = (
    ("gemm", re.compile(r"gemm|matmul|cutlass|nvjet|xmma|gemv|sm90_|linear", re.I)),
    ("attention", re.compile(r"attention|span|prefix|merge|flash|fmha", re.I)),
    ("topk/sort", re.compile(r"topk|sort|radix|select|scan", re.I)),
)
TINY_TARGET = ModelSpec(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=300
)
TINY_HEAD = ModelSpec(
    name="tiny-eagle", arch="eagle3-head", layers=1, hidden=64, heads=4, kv_heads=2,
    head_dim=16, ffn=96, vocab=300, draft_vocab=100,
)  # fmt: skip


def group_of(kernel: str) -> str:
    """The kernel group of a profiler kernel name (the first pattern that matches; 'other')."""
    for name, pat in GROUPS:
        if pat.search(kernel):
            return name
    return "other"


def draft_kernels(runner: SpecRunner, device: torch.device) -> dict[str, float]:
    """Device microseconds per kernel name of one eager draft phase (after two warm-up steps;
    on CPU the CPU ops' self time, for the plumbing)."""
    for _ in range(2):
        for f in runner.graphs.phases():
            f()
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    with profile(activities=acts) as prof:
        runner.draft()
        if cuda:
            torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if cuda and ev.device_type.name == "CUDA":
            out[ev.key[:80]] += float(ev.self_device_time_total)
        elif not cuda:
            out[ev.key[:80]] += float(ev.self_cpu_time_total)
    return dict(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="8,32,64", help="batch sizes (default 8,32,64)")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--out", default=None, help="folder for probe_draft.json")
    ap.add_argument("--tiny", action="store_true", help="CPU, tiny models: the plumbing only")
    ap.add_argument("--policies", default=";".join(p.label for p in POLICIES),
                    help="policies to profile, TreePolicy labels joined by ';' (default SGLang's "
                    "5/4/8 and EAGLE's 7/10/60)")  # fmt: skip
    ap.add_argument("--calibration", default=CALIBRATION, help=f"prices (default {CALIBRATION})")
    args = ap.parse_args()
    batches = [int(b) for b in args.batches.split(",") if b]
    policies = [TreePolicy.parse(x) for x in args.policies.split(";") if x]
    if args.tiny:
        target, drafter, device = TINY_TARGET, TINY_HEAD, torch.device("cpu")
        context = min(args.context, 64)
        cfg = SessionConfig(max(batches), context, 96, use_graphs=False, use_kernels=False,
                            autotune_gemm=False)  # fmt: skip
    else:
        target, drafter = load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
        device, context = torch.device("cuda"), args.context
        cfg = SessionConfig(max(batches), context, 96)
    session = Session(target, drafter, cfg, str(device))
    acc = acceptance_model("mt-bench")
    cal = load_calibration(args.calibration)
    cm = CostModel(load_hardware(cal.hardware), load_model("llama-3.1-8b"),
                   load_model("eagle3-llama-3.1-8b"), calibration=cal)  # fmt: skip
    runs, table = [], []
    for b in batches:
        for pol in policies:
            r = SpecRunner(
                session.target, session.drafter, acc, pol, b, context, session.tcache,
                session.dcache, use_graphs=False, use_kernels=session.use_kernels,
            )  # fmt: skip
            kernels = draft_kernels(r, device)
            del r
            groups: dict[str, float] = defaultdict(float)
            for k, us in kernels.items():
                groups[group_of(k)] += us
            parts = cm.draft_parts(b, pol.depth, pol.topk, args.context)
            pred = {k: float(v) * 1e6 for k, v in parts.items()}
            runs.append({"batch": b, "policy": pol.label, "kernels_us": kernels})
            row = {
                "batch": b,
                "policy": pol.label,
                "measured_us": {k: round(v, 1) for k, v in sorted(groups.items())},
                "measured_total_us": round(sum(kernels.values()), 1),
                "kernels": len(kernels),
                "predicted_us": {k: round(v, 1) for k, v in pred.items()},
                "predicted_total_us": round(sum(pred.values()), 1),
            }
            table.append(row)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        doc = {"context": context, "calibration": args.calibration, "runs": runs, "table": table}
        (Path(args.out) / "probe_draft.json").write_text(json.dumps(doc, indent=1))
    names = [g for g, _ in GROUPS] + ["other"]
    print(f"draft phase, context {context}: device us per kernel group (one eager phase) vs "
          "CostModel.draft_parts (us)")  # fmt: skip
    print(f"{'policy':<22} {'B':>3} " + " ".join(f"{n:>10}" for n in names)
          + f" {'total':>9} | {'first':>7} {'later':>8} {'bookkp':>7} {'total':>8}")  # fmt: skip
    for row in table:
        m, p = row["measured_us"], row["predicted_us"]
        print(
            f"{row['policy']:<22} {row['batch']:>3} "
            + " ".join(f"{m.get(n, 0.0):10.0f}" for n in names)
            + f" {row['measured_total_us']:9.0f} | {p.get('first', 0):7.0f} "
            f"{p.get('later', 0):8.0f} {p.get('bookkeeping', 0):7.0f} "
            f"{row['predicted_total_us']:8.0f}"
        )
    print(json.dumps({"bench": "probe_draft", "table": table}))


if __name__ == "__main__":
    main()
