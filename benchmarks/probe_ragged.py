"""Where the ragged (pruned) verify of a large static tree loses time against the dense one.

Llama-3.1-8B + EAGLE-3 head, static 5/5/87 (87-node Sequoia shape) at batch 8, context 4096:
the dense verify vs the ragged verify of the same tree (prune threshold 1e-9 keeps every node).
One eager verify of each runs under torch.profiler; the table lists CUDA time per kernel name
for both and their difference, largest first (benchmarks/results/executor_ragged*_h200.* show
the ragged one ~7% slower than the model at batch >= 8).

    PYTHONPATH=$PWD python benchmarks/probe_ragged.py [--batch 8]
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from spectune.executor.loop import SpecRunner
from spectune.executor.session import Session, SessionConfig
from spectune.planner.acceptance import acceptance_model
from spectune.specs import TreePolicy, load_model


def kernel_times(runner: SpecRunner) -> dict[str, float]:
    """CUDA microseconds per kernel name of one eager verify (after two warm-up steps)."""
    for _ in range(2):
        for f in runner.graphs.phases():
            f()
    torch.cuda.synchronize()
    runner.build()  # this step's tree (and, for the ragged path, its packing)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        runner.verify()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA":  # kernels (and memcpy/memset), not the CPU ops
            out[ev.key[:60]] += float(ev.self_device_time_total)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--context", type=int, default=4096)
    args = ap.parse_args()
    target, drafter = load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
    session = Session(target, drafter, SessionConfig(args.batch, args.context, 96), "cuda")
    acc = acceptance_model("mt-bench")
    times = {}
    for name, pol in (
        ("dense", TreePolicy("static", 5, 5, 87)),
        ("ragged", TreePolicy("static", 5, 5, 87, 1e-9)),
    ):
        session.tune(args.batch, 87, args.context)
        r = SpecRunner(
            session.target, session.drafter, acc, pol, args.batch, args.context,
            session.tcache, session.dcache, use_graphs=False, use_kernels=session.use_kernels,
        )  # fmt: skip
        times[name] = kernel_times(r)
        del r
    names = set(times["dense"]) | set(times["ragged"])
    rows = sorted(
        names, key=lambda k: -abs(times["ragged"].get(k, 0.0) - times["dense"].get(k, 0.0))
    )
    total = {k: sum(v.values()) for k, v in times.items()}
    print(f"B={args.batch} ctx={args.context} static 5/5/87: CUDA us per verify, dense "
          f"{total['dense']:.0f}, ragged {total['ragged']:.0f}")  # fmt: skip
    print(f"{'kernel':<60} {'dense':>9} {'ragged':>9} {'diff':>9}")
    for k in rows[:18]:
        d, g = times["dense"].get(k, 0.0), times["ragged"].get(k, 0.0)
        print(f"{k:<60} {d:9.0f} {g:9.0f} {g - d:+9.0f}")


if __name__ == "__main__":
    main()
