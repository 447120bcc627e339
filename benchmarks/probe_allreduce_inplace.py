"""What an all-reduce costs between two GEMMs vs back to back.

    PYTHONPATH=. python benchmarks/probe_allreduce_inplace.py --out $OUT/probe_allreduce_inplace.json
    PYTHONPATH=. python benchmarks/probe_allreduce_inplace.py --dry-run   # 2 ranks on CPU (gloo)

Per message of T x hidden bf16 values it times, on every rank, CUDA graphs of `inner` steps:
- 'swept': all-reduce, all-reduce, ... (back to back);
- 'gemm':  the row-parallel GEMM [T, hidden/tp] x [hidden/tp, hidden] alone;
- 'both':  GEMM then all-reduce of its output (a forward's pattern);
and reports per call: swept, in place = both - gemm, and their ratio. 'gemm' and 'both' are
executor.collectives.in_place_all_reduce, the timing `spectune calibrate`'s sweep fits the
all-reduce law to for messages of up to 8 MiB (results: benchmarks/results/tp_h200x4,
measurements/h200x4-tp). Expected run: about 1 minute on nvidia-h100-x2
(NCCL_NVLS_ENABLE=0 as benchmarks/run_tp_gpu.sh sets).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from spectune.executor.collectives import TPGroup, in_place_all_reduce, launch
from spectune.kernels.timing import graph_time

TOKENS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 4096)
HIDDEN = (4096, 8192)  # Llama-3.1-8B, -70B


def _rows(group: TPGroup, tokens: tuple[int, ...], hidden: tuple[int, ...], inner: int,
          reps: int) -> list[dict[str, Any]]:  # fmt: skip
    dev, tp = group.device, group.world
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    out = []
    for h in hidden:
        for t in tokens:
            y = torch.empty(t, h, device=dev, dtype=dtype)

            def swept(y: torch.Tensor = y) -> None:
                for _ in range(inner):
                    group.all_reduce_(y)

            group.barrier()
            back = graph_time(swept, dev, reps) / inner
            # 'gemm' and 'both' (GEMM then all-reduce): the sweep's in-place timing
            in_place, gemm = in_place_all_reduce(group, t * h, reps, inner, hidden=h)
            out.append({"tp": tp, "hidden": h, "tokens": t, "bytes": t * h * 2,
                        "swept_s": back, "gemm_s": gemm, "both_s": gemm + in_place,
                        "in_place_s": in_place, "ratio": in_place / back})  # fmt: skip
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
