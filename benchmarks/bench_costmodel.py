"""How fast the cost model prices a grid of (batch, tokens, context) points.

The planner's search and the simulator call it in bulk; the target is 10,000 points well under
one second on one core. Prints a table, then one JSON document on the last line.

    python benchmarks/bench_costmodel.py [--points 10000] [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from spectune.planner.costmodel import CostModel
from spectune.specs import TreePolicy, hardware_preset, model_preset

SETUPS = (
    ("h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b", 1),
    ("h100-sxm", "qwen3-30b-a3b", None, 1),
    ("h200", "deepseek-v3", None, 8),
    ("h100-sxm", "llama-3.1-70b", "eagle3-llama-3.1-70b", 2),
)

POLICY = TreePolicy("dynamic-topk", 6, 4, 16)  # its budget is replaced by each point's tokens


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    batch = rng.integers(1, 513, args.points)
    tokens = rng.integers(1, 129, args.points)
    context = rng.integers(0, 32_769, args.points)
    accepted = rng.uniform(1.0, 6.0, args.points)

    results = []
    print(f"{'setup':<44} {'method':<16} {'points':>7} {'median ms':>10} {'us/point':>9}")
    for gpu, target, drafter, tp in SETUPS:
        cm = CostModel(
            hardware_preset(gpu),
            model_preset(target),
            model_preset(drafter) if drafter else None,
            tp,
        )
        name = f"{target}+{drafter or 'none'} tp{tp} {gpu}"
        methods: dict[str, Callable[[], object]] = {
            "verify_time": partial(cm.verify_time, batch, tokens, context),
            "iteration": partial(
                cm.iteration, POLICY, batch, context, tokens=tokens, accepted=accepted
            ),
        }
        for method, fn in methods.items():
            s = median_seconds(fn, args.repeats)
            results.append({"setup": name, "method": method, "points": args.points, "median_s": s})
            print(
                f"{name:<44} {method:<16} {args.points:>7} {s * 1e3:>10.2f} "
                f"{s / args.points * 1e6:>9.3f}"
            )
    worst = max(r["median_s"] for r in results if r["method"] == "verify_time")
    print(
        json.dumps(
            {
                "bench": "costmodel",
                "points": args.points,
                "repeats": args.repeats,
                "worst_verify_time_s": worst,
                "results": results,
            }
        )
    )


if __name__ == "__main__":
    main()
