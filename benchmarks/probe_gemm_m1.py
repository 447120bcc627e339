"""Does the GEMM plan's one-token bucket run a slower kernel than the 16-token bucket? (GPU)

    python benchmarks/probe_gemm_m1.py --out $OUT/gemm_m1.json

calibrate's GEMM sweep (spectune.executor.calibrate.gemm_sweep, `linear` with the session's
plan) times Llama-3.1-8B's down projection at M = 1 3.4 us above M = 4 on an H200
(measurements/h200-newuser8) and up to 7 us above on H100s: M = 1 runs the plan's bucket-1
variant, M = 4 its bucket-16 variant. This probe autotunes the target's weight shapes as a
Session does (kernels.gemm.autotune, the SwiGLU-fused down projection included), then at
M = 1 times, in the same process and way (CUDA-graph replays, weights rotated), the variant
the plan runs at bucket 1 and the one it runs at bucket 16, both plain and gated. It prints
one line per shape and form, and writes the plan, the autotune rows and the timings.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from spectune.cli.common import ints
from spectune.kernels.gemm import autotune, rotating_weights, run_variant
from spectune.kernels.timing import graph_time

HIDDEN, FFN, QKV = 4096, 14336, 6144  # Llama-3.1-8B (config.json)
SHAPES = [(QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * FFN, HIDDEN), (HIDDEN, FFN)]


def _time(variant: str, m: int, n: int, k: int, gated: bool, dev: torch.device) -> float:
    """Seconds per call of `variant` at x [m, k] (gated: [m, 2k]) over rotated weights."""
    ws = rotating_weights(n, k, dev)
    x = torch.empty((m, 2 * k if gated else k), device=dev, dtype=torch.bfloat16).uniform_(-1, 1)

    def call() -> None:
        for w in ws:
            run_variant(variant, x, w, gated)

    return graph_time(call, dev, 10) / len(ws)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="gemm_m1.json")
    ap.add_argument("--buckets", type=ints(1, 4096, name="buckets"), default=[1, 16])
    args = ap.parse_args()
    dev = torch.device("cuda")
    buckets = tuple(args.buckets)
    t0 = time.time()
    plan, rows = autotune(SHAPES, dev, buckets=buckets, gated=[(HIDDEN, FFN)])
    print(f"{torch.cuda.get_device_name(dev)}: autotune {time.time() - t0:.0f} s", flush=True)
    out = []
    print(f"{'shape':>14} {'gated':>5} {'bucket-1 variant':>22} {'us@M1':>7} "
          f"{'bucket-16 variant':>22} {'us@M1':>7}")  # fmt: skip
    jobs = [(n, k, False) for n, k in SHAPES] + [(HIDDEN, FFN, True)]
    for n, k, gated in jobs:
        v1 = plan.variant(n, k, 1, gated)
        v16 = plan.variant(n, k, 16, gated)
        t1 = _time(v1, 1, n, k, gated, dev)
        t16 = _time(v16, 1, n, k, gated, dev) if v16 != v1 else t1
        tuned = {r["variant"]: r.get("seconds") for r in rows
                 if (r["n"], r["k"], r["m"], r["gated"]) == (n, k, 1, gated)}  # fmt: skip
        out.append({"n": n, "k": k, "gated": gated, "bucket1": v1, "bucket16": v16,
                    "bucket1_s_at_m1": t1, "bucket16_s_at_m1": t16,
                    "autotune_at_m1": tuned})  # fmt: skip
        print(
            f"{n:>6}x{k:<7} {gated!s:>5} {v1:>22} {t1 * 1e6:>7.1f} {v16:>22} {t16 * 1e6:>7.1f}",
            flush=True,
        )
    Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(dev),
                                          "plan": plan.to_dict(), "timings": out,
                                          "autotune": rows}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
