"""Real acceptance data: mean accepted tokens per step of dense, pruned and prune-then-graft
trees at equal verify budgets, measured by exact replay of the recorded SmolLM2-135M traces
(data/traces/), per prompt set and drafter; then the fitted acceptance model's prediction for
held-out requests (k-fold over requests: each request is predicted by a fit that never saw it).

Trees come from the planner's builders on each step's recorded pool (planner.trees.build_tree
with a ReplayStep): dense = EAGLE-2 dynamic top-k (depth 7, top-k 8) keeping budget-1 draft
nodes; pruned = the same minus nodes whose path draft probability is below --prune; graft =
pruned, then the freed slots (up to the budget) filled with the pool's retrieval candidates.
The retrieval drafter row uses retrieval candidates only (root + up to budget-1 grafted nodes).
Tokens/step = accepted draft tokens + 1; nodes = mean tree size (root included).

    python benchmarks/bench_realdata.py [--prune 0.1] [--folds 4] [--budgets 8,16,32,64]

Prints tables, then one JSON document on the last line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from spectune.planner.acceptance import ReplayStep, TraceReplay
from spectune.planner.trees import build_tree
from spectune.planner.trees.pool import graft_from_pool
from spectune.specs.policy import TreePolicy
from spectune.specs.trace import TraceStep, replay_path
from spectune.traces.fit import LoadedTraces, cross_validate, load_traces

TRACES = {
    "mt-bench": Path("data/traces/smollm2-mtbench.jsonl.gz"),
    "humaneval": Path("data/traces/smollm2-humaneval.jsonl.gz"),
}


def replay(policy: TreePolicy | None, budget: int, steps: list[TraceStep]) -> tuple[float, float]:
    """(mean tokens/step, mean tree nodes) of a policy's trees (None: retrieval-only trees)."""
    parent = TraceReplay(steps)
    rng = np.random.default_rng(0)
    tokens = nodes = 0
    for st in steps:
        if policy is None:
            keep = np.zeros(st.pool.num_nodes, dtype=bool)
            keep[0] = True
            keep = graft_from_pool(st.pool, keep, budget - 1)
            tree, target = st.pool.subtree(keep), st.target[keep]
            tokens += len(replay_path(tree, target))
        else:
            model = ReplayStep(st, parent)
            tree = build_tree(policy, model, rng)
            tokens += round(model.expected_tokens(tree))
        nodes += tree.num_nodes
    return tokens / len(steps), nodes / len(steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--prune", default="0.03,0.1", help="prune thresholds (path draft probability), comma list"
    )
    ap.add_argument("--folds", type=int, default=4, help="cross-validation folds over requests")
    ap.add_argument("--budgets", default="8,16,32,64", help="verify budgets (root included)")
    args = ap.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    taus = [float(t) for t in args.prune.split(",")]
    t0 = time.perf_counter()
    rows = []
    checks = []
    for prompt_set, path in TRACES.items():
        traces: LoadedTraces = load_traces([path])
        h = traces.headers[0]
        depth, topk = traces.max_depth, traces.max_topk
        steps = traces.steps
        drafter = h.drafter.split("+")[0]
        for b in budgets:
            kinds: list[tuple[str, str, TreePolicy | None]] = [
                (drafter, "dense", TreePolicy("dynamic-topk", depth, topk, b))
            ]
            for tau in taus:
                kinds += [
                    (drafter, f"pruned {tau:g}", TreePolicy("dynamic-topk", depth, topk, b, tau)),
                    (
                        drafter,
                        f"prune {tau:g}+graft",
                        TreePolicy("dynamic-topk", depth, topk, b, tau, b - 1),
                    ),
                ]
            kinds.append(("retrieval", "retrieval-only", None))
            for name, tree_kind, pol in kinds:
                tok, nodes = replay(pol, b, steps)
                rows.append(
                    {
                        "prompt_set": prompt_set,
                        "drafter": name,
                        "tree": tree_kind,
                        "budget": b,
                        "tokens_per_step": round(tok, 4),
                        "mean_nodes": round(nodes, 2),
                        "steps": len(steps),
                        "requests": len(traces.requests()),
                    }
                )
        for c in cross_validate(traces, args.folds, budgets):
            checks.append(
                {
                    "prompt_set": prompt_set,
                    "budget": c.budget,
                    "predicted": round(c.predicted, 4),
                    "replayed": round(c.replayed, 4),
                    "error": round(c.error, 4),
                    "folds": c.folds,
                }
            )

    print(f"tokens/step (mean tree nodes), exact replay; prune thresholds {taus}")
    print(
        f"{'prompt set':<10} {'drafter':<14} {'tree':<18}"
        + "".join(f"{'B=' + str(b):>16}" for b in budgets)
    )
    keys = list(dict.fromkeys((r["prompt_set"], r["drafter"], r["tree"]) for r in rows))
    for key in keys:
        cells = {r["budget"]: r for r in rows if (r["prompt_set"], r["drafter"], r["tree"]) == key}
        line = f"{key[0]:<10} {key[1]:<14} {key[2]:<18}"
        for b in budgets:
            r = cells[b]
            line += f"{r['tokens_per_step']:>9.3f} ({r['mean_nodes']:>4.1f})"
        print(line)
    print()
    print(f"held-out prediction ({args.folds}-fold over requests, confidence model): tokens/step")
    print(f"{'prompt set':<10} {'budget':>6} {'predicted':>10} {'replayed':>10} {'error':>8}")
    for c in checks:
        print(
            f"{c['prompt_set']:<10} {c['budget']:>6} {c['predicted']:>10.3f} "
            f"{c['replayed']:>10.3f} {100 * c['error']:>+7.1f}%"
        )
    worst = max(abs(c["error"]) for c in checks)
    print(f"worst held-out error {100 * worst:.1f}% ({time.perf_counter() - t0:.0f} s)")
    print(
        json.dumps(
            {
                "bench": "realdata",
                "prune_thresholds": taus,
                "rows": rows,
                "held_out": checks,
                "worst_held_out_error": round(worst, 4),
            }
        )
    )


if __name__ == "__main__":
    main()
