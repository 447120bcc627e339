"""Benchmark `spectune plan`: how good the search is and what the planned policy buys.

1. Search vs exhaustive grid. On the default scenario (Llama-3.1-8B + EAGLE-3 head, H100-SXM,
   MT-Bench, closed-form objective) and a restricted space (dynamic top-k, depth 1-8,
   top-k 1-8, budget 2-48, no pruning or grafting, plus off), every policy of the grid is
   scored, then the search runs with at most a tenth of the grid's evaluations. Target: the
   search's best within 2% of the grid optimum in every bucket.
2. Planned vs defaults vs off. The default plan's policies for batch 1, 8, 32, 64, 128 (context
   bucket 0-4095, scored at 2048 tokens) against the better of the SGLang (5/4/8) and EAGLE
   (7/10/60) trees and no speculation, by simulated throughput (spectune.simulator, closed loop
   at concurrency = batch) and by the closed form. Target: the plan never loses.
3. Turning speculation off. A scenario where speculation loses at large batches (a Llama-3.2-1B
   draft model on a weak-acceptance workload, batch up to 1024): the plan must choose off there.

Prints readable tables, then one JSON document on the last line.
Usage: python benchmarks/bench_plan.py [--trials N] [--seed S] [--no-sim]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from spectune.planner.buckets import DEFAULT_BUCKETS, BucketSpec, buckets_from_edges
from spectune.planner.objective import scenario_objective
from spectune.planner.search import Scorer, SearchSettings, geomean, search
from spectune.planner.space import EAGLE_DEFAULT, SGLANG_DEFAULT, PolicySpace, grid
from spectune.simulator.scoring import build_scorer, simulation_objective
from spectune.specs.errors import SpecError
from spectune.specs.policy import TreePolicy, policy_label
from spectune.specs.scenario import Scenario

DEFAULT = Scenario()  # Llama-3.1-8B + its EAGLE-3 head on an H100-SXM, MT-Bench, TP 1
OFF_SCENARIO = DEFAULT.replace(drafter="llama-3.2-1b", workload="vllm-eagle3-gptoss-t1")
RESTRICTED = PolicySpace(
    builders=("dynamic-topk",),
    depth=(1, 8),
    topk=(1, 8),
    budget=(2, 48),
    allow_prune=False,
    graft=(0, 0),
)
GRID_BUCKETS = (
    BucketSpec((1, 1), (0, 4095)),
    BucketSpec((5, 8), (0, 4095)),
    BucketSpec((33, 64), (0, 4095)),
    BucketSpec((129, 256), (0, 4095)),
)
TABLE_BATCHES = (1, 8, 32, 64, 128)
CONTEXT = (0, 4095)


def closed(scenario: Scenario) -> Any:
    return scenario_objective(scenario.resolve())  # what `spectune plan` scores with


def grid_vs_search(seed: int) -> list[dict[str, Any]]:
    obj = closed(DEFAULT)
    policies = list(grid(RESTRICTED, range(1, 9), range(1, 9), range(2, 49)))
    rows = []
    for bucket in GRID_BUCKETS:
        gs = Scorer(obj)
        scores = {p: geomean(gs.point_values(p, bucket)) for p in policies}
        best = max(scores, key=lambda p: scores[p])
        budget = len(policies) // 10  # trials; each evaluates one policy at most once
        settings = SearchSettings(
            trials=budget, seed=seed, space=RESTRICTED, warm_start=0, chains=False
        )
        res = search(obj, (bucket,), settings, study_prefix="grid")[0]
        rows.append(
            {
                "bucket": bucket.name,
                "grid_evals": len(policies) * len(bucket.points()),
                "search_evals": budget * len(bucket.points()),
                "grid_best": scores[best],
                "grid_policy": policy_label(best),
                "search_best": res.searched_best,
                "search_policy": policy_label(res.policy),
                "ratio": res.searched_best / scores[best],
            }
        )
    return rows


def plan_buckets(
    scenario: Scenario,
    buckets: Sequence[BucketSpec],
    trials: int,
    seed: int,
    objective: str = "closed-form",
) -> dict[tuple[int, int], TreePolicy | None]:
    """What `spectune plan --objective OBJECTIVE` chooses for these buckets (the CLI's
    search settings; buckets are independent studies, so planning a subset is the same)."""
    scenario = scenario.replace(objective=objective)
    scorer, _closed = build_scorer(scenario)
    res = search(
        scorer.objective,
        buckets,
        SearchSettings(trials=trials, seed=seed),
        setup={"scenario": scenario.to_dict()},
    )
    return {r.bucket.batch: r.policy for r in res}


def lookup(plan: Mapping[tuple[int, int], TreePolicy | None], batch: int) -> TreePolicy | None:
    for (lo, hi), p in plan.items():
        if lo <= batch <= hi:
            return p
    raise KeyError(batch)


def planned(plan: Mapping[tuple[int, int], TreePolicy | None], batch: int) -> bool:
    return any(lo <= batch <= hi for lo, hi in plan)


def compare(
    scenario: Scenario,
    plans: Mapping[str, Mapping[tuple[int, int], TreePolicy | None]],
    batches: Sequence[int],
    context: int,
    sim: bool,
) -> list[dict[str, Any]]:
    """Per batch: each plan's policy and, per scorer (simulated, closed form), tokens/s of
    the plans, the two engine defaults and off."""
    scorers: dict[str, Any] = {"closed-form": closed(scenario)}
    if sim:
        scorers["simulated"] = simulation_objective(scenario.resolve(), metric="throughput")
    rows = []
    for b in batches:
        row: dict[str, Any] = {
            "batch": b,
            "policies": {
                name: policy_label(lookup(plan, b)) if planned(plan, b) else "-"
                for name, plan in plans.items()
            },
        }
        for kind, f in scorers.items():
            try:
                vals = {
                    name: f(lookup(plan, b), b, context)
                    for name, plan in plans.items()
                    if planned(plan, b)
                }
                refs = {
                    "sglang": f(SGLANG_DEFAULT, b, context),
                    "eagle": f(EAGLE_DEFAULT, b, context),
                    "off": f(None, b, context),
                }
            except SpecError as e:  # e.g. the batch's KV does not fit the GPU
                row[kind] = {"error": str(e)}
                continue
            best_default = max(refs["sglang"], refs["eagle"])
            bar = max(best_default, refs["off"])
            row[kind] = {
                **{f"plan:{n}": v for n, v in vals.items()},
                **refs,
                **{f"vs_default:{n}": v / best_default for n, v in vals.items()},
                **{f"vs_off:{n}": v / refs["off"] for n, v in vals.items()},
                **{f"never_loses:{n}": v >= bar * (1 - 1e-9) for n, v in vals.items()},
                "spec_loses": max(best_default, best_small_tree(f, b, context)) < refs["off"],
            }
        rows.append(row)
    return rows


def off_where_loses(rows: Sequence[Mapping[str, Any]], plans: Sequence[str]) -> dict[str, bool]:
    """Per plan (a plan named like a scorer is judged by that scorer): wherever it finds no speculation that beats plain decoding (the
    defaults and chains of 1-3 tokens), the plan is off. Rows the simulator could not run and
    batches outside the plan are skipped."""
    out = {}
    for name in plans:
        checks = [
            r["policies"][name] == "off"
            for r in rows
            if name in r
            and "spec_loses" in r[name]
            and r["policies"][name] != "-"
            and r[name]["spec_loses"]
        ]
        out[name] = all(checks)
    return out


def best_small_tree(f: Any, batch: int, context: int) -> float:
    """The best of the shortest chains: does any speculation beat off here?"""
    return max(f(TreePolicy("dynamic-topk", d, 1, d + 1), batch, context) for d in (1, 2, 3))


def print_grid(rows: Sequence[Mapping[str, Any]]) -> None:
    print("1. search vs exhaustive grid (restricted space, closed form, default scenario)")
    print(
        f"{'bucket':<20} {'grid evals':>10} {'search':>7} {'grid best':>10} {'search':>10} "
        f"{'ratio':>6}  grid policy / plan's pick"
    )
    for r in rows:
        print(
            f"{r['bucket']:<20} {r['grid_evals']:>10} {r['search_evals']:>7} "
            f"{r['grid_best']:>10.0f} {r['search_best']:>10.0f} {r['ratio']:>6.3f}  "
            f"{r['grid_policy']} / {r['search_policy']}"
        )


def print_compare(title: str, rows: Sequence[Mapping[str, Any]], plans: Sequence[str]) -> None:
    print(title)
    for name in plans:
        print(
            f"  plan {name!r}: "
            + ", ".join(f"batch {r['batch']}: {r['policies'][name]}" for r in rows)
        )
    for kind in ("simulated", "closed-form"):
        if kind not in rows[0]:
            continue
        print(f"  {kind} throughput, tokens/s")
        head = f"  {'batch':>5} " + "".join(f"{'plan ' + n:>22}" for n in plans)
        head += f" {'sglang':>8} {'eagle':>8} {'off':>8}  " + "  ".join(
            f"{n} vs best default / vs off / never loses" for n in plans
        )
        print(head)
        for r in rows:
            v = r[kind]
            if "error" in v:
                print(f"  {r['batch']:>5}  n/a: {v['error'][:90]}")
                continue
            line = f"  {r['batch']:>5} " + "".join(
                f"{v['plan:' + n]:>22.0f}" if "plan:" + n in v else f"{'-':>22}" for n in plans
            )
            line += f" {v['sglang']:>8.0f} {v['eagle']:>8.0f} {v['off']:>8.0f}  "
            line += "  ".join(
                f"{v['vs_default:' + n]:.3f}x / {v['vs_off:' + n]:.3f}x / "
                f"{'yes' if v['never_loses:' + n] else 'NO'}"
                if "plan:" + n in v
                else "-"
                for n in plans
            )
            print(line)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=SearchSettings.trials)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--sim-trials",
        type=int,
        default=24,
        help="trials per bucket of the plan scored by simulation",
    )
    ap.add_argument("--no-sim", action="store_true", help="closed form only")
    args = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0 = time.monotonic()

    grid_rows = grid_vs_search(args.seed)
    print_grid(grid_rows)
    print()

    ctx_buckets = [b for b in DEFAULT_BUCKETS if b.context == CONTEXT]
    context = ctx_buckets[0].context_point
    plans = {"closed-form": plan_buckets(DEFAULT, ctx_buckets, args.trials, args.seed)}
    if not args.no_sim:
        holding = [
            b for b in ctx_buckets if any(b.batch[0] <= x <= b.batch[1] for x in TABLE_BATCHES)
        ]
        plans["simulated"] = plan_buckets(
            DEFAULT, holding, args.sim_trials, args.seed, objective="throughput"
        )
    table = compare(DEFAULT, plans, TABLE_BATCHES, context, sim=not args.no_sim)
    print_compare(
        f"2. planned vs defaults vs off: default scenario, context {context}; plan "
        f"'closed-form' = `spectune plan` ({args.trials} trials/bucket), plan 'simulated' = "
        f"`spectune plan --objective throughput` ({args.sim_trials} trials/bucket)",
        table,
        list(plans),
    )
    print()

    off_buckets = buckets_from_edges((1, 8, 32, 64, 128, 256, 512, 1024), (1024,))
    off_ctx = off_buckets[0].context_point
    off_batches = (1, 8, 64, 128, 256, 512, 1024)
    off_plans = {"closed-form": plan_buckets(OFF_SCENARIO, off_buckets, args.trials, args.seed)}
    if not args.no_sim:  # the simulator runs out of KV above ~400 sequences here
        holding = [b for b in off_buckets if b.batch[1] <= 256]
        off_plans["simulated"] = plan_buckets(
            OFF_SCENARIO, holding, args.sim_trials, args.seed, objective="throughput"
        )
    off_rows = compare(OFF_SCENARIO, off_plans, off_batches, off_ctx, sim=not args.no_sim)
    print_compare(
        f"3. turning speculation off: {OFF_SCENARIO.drafter} draft model, workload "
        f"{OFF_SCENARIO.workload}, context {off_ctx}",
        off_rows,
        list(off_plans),
    )
    off_ok = off_where_loses(off_rows, list(off_plans))
    for name, ok in off_ok.items():
        print(
            f"  plan {name!r} is off wherever no speculation beats plain decoding "
            f"(by its own scorer): {'yes' if ok else 'NO'}"
        )

    doc = {
        "benchmark": "bench_plan",
        "grid": grid_rows,
        "grid_within_2pct": all(r["ratio"] >= 0.98 for r in grid_rows),
        "grid_evals_at_most_tenth": all(
            r["search_evals"] * 10 <= r["grid_evals"] for r in grid_rows
        ),
        "table": table,
        "off_scenario": {
            "scenario": OFF_SCENARIO.to_dict(),
            "rows": off_rows,
            "off_where_loses": off_ok,
        },
        "off_where_loses_default": off_where_loses(table, list(plans)),
        "never_loses": {
            f"{n} plan, {kind}": all(
                r[kind].get(f"never_loses:{n}", True) for r in table + off_rows if kind in r
            )
            for kind in ("simulated", "closed-form")
            for n in plans
        },
        "seconds": time.monotonic() - t0,
    }
    print(json.dumps(doc, default=float))
    return 0


if __name__ == "__main__":
    sys.exit(main())
