"""Tree attention per layer by batch at small tree sizes, as a verify forward runs it (GPU)

    python benchmarks/probe_attention_batch.py --out $OUT/attention_batch.json
    python benchmarks/probe_attention_batch.py --batches 1,2,4,8 --tokens 1 --context 4096

For each (batch, tokens) at one context, Llama-3.1-8B's attention heads (32 query, 8 KV, d 128,
bf16) over a whole 32-layer cache: `tune_tree_attention` times the shape's default launch and
the tuner's candidates, each replay calling the attention over distinct layers (L2 never holds
the K/V, as in a forward). It prints, per shape, the K/V bytes, their time at the measured read
rate (a streaming sum over 1 GiB), the default launch's time and split count, the tuned best,
and the excess of the best over the bytes' time. The cost model prices attention at small batch
as bytes over bandwidth plus a fixed cost per split launch (Calibration.attention_split_s,
operators.attention_splits); this probe shows how that excess behaves from batch 1 to 32.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import cast

import torch

from spectune.cli.common import int_range, ints
from spectune.executor.calibrate import read_bandwidth
from spectune.kernels.tree_attention_plan import (
    HeadShape,
    TreeAttentionPlan,
    tune_tree_attention,
)

LAYERS, Q_HEADS, KV_HEADS, HEAD_DIM = 32, 32, 8, 128  # Llama-3.1-8B (config.json)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--batches", type=ints(1, 256, name="batches"), default=[1, 2, 4, 6, 8, 12, 16, 24, 32]
    )
    ap.add_argument("--tokens", type=ints(1, 128, name="tokens"), default=[1, 8])
    ap.add_argument("--context", type=int_range(1, 1 << 17), default=4096)
    ap.add_argument("--out", default="attention_batch.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    read = read_bandwidth(dev)
    bmax, cap = max(args.batches), args.context + max(args.tokens) + 8
    kv = torch.empty(
        (LAYERS, 2, bmax, cap, KV_HEADS, HEAD_DIM), device=dev, dtype=torch.bfloat16
    ).uniform_(-1, 1)
    shape = HeadShape(Q_HEADS, KV_HEADS, HEAD_DIM, torch.bfloat16)
    rows = []
    print(f"{torch.cuda.get_device_name(dev)}: read {read / 1e12:.2f} TB/s, context {args.context}")
    print(f"{'B':>3} {'N':>3} {'KV MB':>7} {'bytes us':>8} {'default':>8} {'splits':>6} "
          f"{'best':>7} {'excess':>7}")  # fmt: skip
    for n in args.tokens:
        for b in args.batches:
            t0 = time.time()
            plan = TreeAttentionPlan(b, n, args.context, cap, shape, dev)  # default (untuned)
            tuned = tune_tree_attention(b, n, args.context, kv[:, :, :b], Q_HEADS)
            timed = {str(r["config"]): cast(float, r["seconds"]) for r in tuned if "seconds" in r}
            default, best = timed[str(["default"])], min(timed.values())
            kv_bytes = b * (args.context + n) * 2 * KV_HEADS * HEAD_DIM * 2
            row = {
                "batch": b, "tokens": n, "context": args.context, "kv_bytes": kv_bytes,
                "bytes_s": kv_bytes / read, "default_s": default, "best_s": best,
                "default_splits": plan.launch.prefix_splits, "candidates": tuned,
                "wall_s": time.time() - t0,
            }  # fmt: skip
            rows.append(row)
            print(
                f"{b:>3} {n:>3} {kv_bytes / 1e6:>7.1f} {row['bytes_s'] * 1e6:>8.1f} "
                f"{default * 1e6:>8.1f} {row['default_splits']:>6} {best * 1e6:>7.1f} "
                f"{(best - row['bytes_s']) * 1e6:>7.1f}",
                flush=True,
            )
    doc = {"gpu": torch.cuda.get_device_name(dev), "read_bytes_per_s": read, "rows": rows}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
