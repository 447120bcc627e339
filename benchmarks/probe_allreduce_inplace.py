"""What an all-reduce costs between two GEMMs vs back to back (the collectives sweep's way).

    python benchmarks/probe_allreduce_inplace.py --out $OUT/probe_allreduce_inplace.json
    python benchmarks/probe_allreduce_inplace.py --dry-run        # 2 ranks on CPU (gloo)

The TP verify grids (benchmarks/results/tp_h100x2*, tp_h100_rerun: verify minus the same shard
compute without collectives) put the in-place all-reduce of a small message 2-2.5 us below
the back-to-back sweep that Calibration.allreduce_law is fitted to (tp 2, Llama-3.1-8B,
batch 1: 20.5 us per layer in place vs 25.2 us for two swept calls), and large ones above it.
This probe times, per message of T x hidden bf16 values, three CUDA graphs of `inner` steps
each on every rank:
- 'swept': all-reduce, all-reduce, ... (collective_sweep's pattern);
- 'gemm':  the row-parallel GEMM [T, hidden/tp] x [hidden/tp, hidden] alone;
- 'both':  GEMM then all-reduce of its output, `inner` times (a forward's pattern);
and reports per call: swept, in place = both - gemm, and their ratio. If in place differs
from swept alike on every host, `spectune calibrate` can time the sweep this way and the
cost model's law stays fitted to calibrate-time data. Expected run: about 1 minute on
nvidia-h100-x2 (NCCL_NVLS_ENABLE=0 as benchmarks/run_tp_gpu.sh sets).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from spectune.executor.collectives import TPGroup, launch
from spectune.kernels.timing import graph_time

TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
HIDDEN = (4096, 8192)  # Llama-3.1-8B, -70B


def _rows(group: TPGroup, tokens: tuple[int, ...], hidden: tuple[int, ...], inner: int,
          reps: int) -> list[dict[str, Any]]:  # fmt: skip
    dev, tp = group.device, group.world
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    out = []
    for h in hidden:
        # the o projection's shard: [h, h/tp] (row-parallel); one copy per step so that L2
        # does not hold it (h*h/tp*2 bytes: 16 MiB at h = 4096, tp = 2)
        ws = [torch.randn(h, h // tp, device=dev, dtype=dtype) * 0.02 for _ in range(inner)]
        for t in tokens:
            x = torch.randn(t, h // tp, device=dev, dtype=dtype)
            y = torch.empty(t, h, device=dev, dtype=dtype)

            def swept(y: torch.Tensor = y) -> None:
                for _ in range(inner):
                    group.all_reduce_(y)

            def gemm(x: torch.Tensor = x, y: torch.Tensor = y, ws: list[torch.Tensor] = ws) -> None:
                for w in ws:
                    torch.matmul(x, w.t(), out=y)

            def both(x: torch.Tensor = x, y: torch.Tensor = y, ws: list[torch.Tensor] = ws) -> None:
                for w in ws:
                    torch.matmul(x, w.t(), out=y)
                    group.all_reduce_(y)

            times = {}
            for name, fn in (("swept", swept), ("gemm", gemm), ("both", both)):
                group.barrier()
                times[name] = graph_time(fn, dev, reps) / inner
            in_place = times["both"] - times["gemm"]
            out.append({"tp": tp, "hidden": h, "tokens": t, "bytes": t * h * 2,
                        "swept_s": times["swept"], "gemm_s": times["gemm"],
                        "both_s": times["both"], "in_place_s": in_place,
                        "ratio": in_place / times["swept"]})  # fmt: skip
    return out


def _rank(group: TPGroup, args: argparse.Namespace) -> None:
    rows = _rows(group, tuple(args.tokens), tuple(args.hidden), args.inner, args.reps)
    if group.rank:
        return
    print(f"{'tp':>2} {'hidden':>6} {'T':>5} {'bytes':>9} {'swept us':>9} {'gemm us':>8} "
          f"{'in place us':>11} {'ratio':>6}")  # fmt: skip
    for r in rows:
        print(
            f"{r['tp']:>2} {r['hidden']:>6} {r['tokens']:>5} {r['bytes']:>9} "
            f"{r['swept_s'] * 1e6:>9.1f} {r['gemm_s'] * 1e6:>8.1f} "
            f"{r['in_place_s'] * 1e6:>11.1f} {r['ratio']:>6.2f}"
        )
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    print(json.dumps(rows))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", type=int, default=0, help="ranks (default: every GPU; 2 dry-run)")
    ap.add_argument("--tokens", type=int, nargs="+", default=list(TOKENS))
    ap.add_argument("--hidden", type=int, nargs="+", default=list(HIDDEN))
    ap.add_argument("--inner", type=int, default=20, help="steps per graph")
    ap.add_argument("--reps", type=int, default=20, help="timed replays per graph")
    ap.add_argument("--out", default="", help="write the rows as JSON here")
    ap.add_argument("--dry-run", action="store_true", help="2 ranks on CPU over gloo, tiny")
    args = ap.parse_args(argv)
    if args.dry_run:
        args.tokens, args.hidden, args.inner, args.reps = [1, 8], [64], 2, 2
    world = args.tp or (2 if args.dry_run else torch.cuda.device_count())
    if world < 2:
        print("one GPU: no all-reduce to time")
        return 2
    launch(_rank, world, (args,), backend="gloo" if args.dry_run else "")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
