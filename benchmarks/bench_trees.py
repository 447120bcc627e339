"""Tree builders: Sequoia DP build time, batched step-sampler time, and expected tokens of dense
vs pruned vs prune-then-graft trees at equal verify budget.

    python benchmarks/bench_trees.py [--quick]

Prints readable tables, then one JSON document on the last line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np

from spectune.planner.acceptance import acceptance_model
from spectune.planner.space import EAGLE_DEFAULT
from spectune.planner.trees import sample_accepted_lengths, sample_step, sequoia_dp
from spectune.specs import TreePolicy


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(median, min) seconds of `repeat` calls, CPU time of this process (wall time on a shared
    machine counts other processes' time slices)."""
    times = []
    for _ in range(repeat):
        t0 = time.process_time()
        fn()
        times.append(time.process_time() - t0)
    return float(np.median(times)), float(np.min(times))


def bench_dp(repeat: int) -> dict[str, float]:
    model = acceptance_model("mt-bench")
    table = model.positional_table(16, 16)
    med, best = timed(lambda: sequoia_dp(table, 256, 16, 16), repeat)
    shape = sequoia_dp(table, 256, 16, 16)
    print("Sequoia DP, budget 256, depth 16, width 16 (mt-bench mean table)")
    print(f"  build time  median {med * 1e3:8.2f} ms   min {best * 1e3:8.2f} ms")
    print(f"  tree        {shape.parents.size} nodes, expected tokens {shape.expected_tokens:.4f}")
    return {
        "dp_ms_median": med * 1e3,
        "dp_ms_min": best * 1e3,
        "dp_expected_tokens": shape.expected_tokens,
    }


def bench_sampler(repeat: int) -> list[dict[str, object]]:
    cases = [
        ("mt-bench", EAGLE_DEFAULT, False),
        ("mt-bench", replace(EAGLE_DEFAULT, prune_threshold=0.02, graft_budget=8), False),
        ("mt-bench", EAGLE_DEFAULT, True),
        ("mt-bench", replace(EAGLE_DEFAULT, builder="static"), False),
        ("medusa-vicuna-7b", TreePolicy("static", 5, 8, 64), False),
    ]
    out = []
    print("\nBatched step sampler, batch 64 (one iteration of the whole batch)")
    print(
        f"  {'workload':<18}{'policy':<34}{'shared':<8}{'ms/iter':>9}{'min ms':>9}"
        f"{'tokens/step':>13}{'sim tok/s':>12}"
    )
    for wl, pol, shared in cases:
        model = acceptance_model(wl)
        rng = np.random.default_rng(0)
        sample_accepted_lengths(pol, model, rng, 64, shared_budget=shared)  # warm caches
        med, best = timed(
            lambda p=pol, m=model, r=rng, s=shared: sample_accepted_lengths(p, m, r, 64, s), repeat
        )
        toks = np.concatenate(
            [sample_accepted_lengths(pol, model, rng, 64, shared) for _ in range(50)]
        ).mean()
        rate = 64 * toks / med
        name = pol.label
        print(
            f"  {wl:<18}{name:<34}{shared!s:<8}{med * 1e3:9.3f}{best * 1e3:9.3f}{toks:13.3f}"
            f"{rate:12.0f}"
        )
        out.append(
            {
                "workload": wl,
                "policy": name,
                "shared": shared,
                "ms_median": med * 1e3,
                "ms_min": best * 1e3,
                "tokens_per_step": float(toks),
                "simulated_tokens_per_s": float(rate),
            }
        )
    return out


def bench_prune_graft(samples: int) -> list[dict[str, object]]:
    """Expected tokens per step at equal verify budget: dense EAGLE-2 tree, the same pruned,
    and pruned then grafted (grafts fill the freed slots, never past the budget)."""
    rows = []
    print(
        "\nExpected tokens per step at equal verify budget (dynamic-topk depth 7, top-k 10;"
        f" mean of {samples} trees; nodes = verify tokens used, root included)"
    )
    print(
        f"  {'workload':<15}{'budget':>7}{'prune':>7}{'graft':>7}   {'dense':>13}"
        f"{'pruned':>16}{'prune+graft':>16}"
    )
    for wl in ("mt-bench", "summarization"):
        model = acceptance_model(wl)
        for budget in (16, 32, 61):
            for prune in (0.02, 0.05):
                graft = min(16, budget - 1)
                res = {}
                for key, pol in (
                    ("dense", TreePolicy("dynamic-topk", 7, 10, budget)),
                    ("pruned", TreePolicy("dynamic-topk", 7, 10, budget, prune, 0)),
                    ("graft", TreePolicy("dynamic-topk", 7, 10, budget, prune, graft)),
                ):
                    _, nodes, exp = sample_step(pol, model, np.random.default_rng(1), samples)
                    res[key] = (float(exp.mean()), float(nodes.mean()))
                cell = {k: f"{v[0]:.3f} ({v[1]:4.1f})" for k, v in res.items()}
                print(
                    f"  {wl:<15}{budget:>7}{prune:>7.2f}{graft:>7}   {cell['dense']:>13}"
                    f"{cell['pruned']:>16}{cell['graft']:>16}"
                )
                rows.append(
                    {
                        "workload": wl,
                        "budget": budget,
                        "prune_threshold": prune,
                        "graft_budget": graft,
                        **{f"{k}_tokens": v[0] for k, v in res.items()},
                        **{f"{k}_nodes": v[1] for k, v in res.items()},
                    }
                )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repeats (smoke run)")
    args = ap.parse_args()
    repeat = 5 if args.quick else 30
    result = {
        "bench": "trees",
        "machine": {
            "cpu": platform.processor() or platform.machine(),
            "cores": os.cpu_count(),
            "python": platform.python_version(),
            "numpy": np.__version__,
        },
        "timing": "process CPU time",
        **bench_dp(max(3, repeat // 5)),
        "sampler_batch64": bench_sampler(repeat * 10),
        "prune_graft": bench_prune_graft(512 if args.quick else 4096),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
