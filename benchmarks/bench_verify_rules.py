"""Expected accepted tokens per verify step by verification rule, at temperature 1 (CPU).

MT-Bench-like acceptance: the `mt-bench-t1` workload preset (EAGLE-3 on Llama-3.1-8B at
temperature 1, fitted to the EAGLE-3 paper's Table 1; see `spectune presets`). For each verify
budget of 8, 16, 32 and 64 tree tokens (root included) and each rule, the best tree of a small
grid is scored:
  top-k trees   EAGLE-2 dynamic top-k (depth 4/6/8, top-k 2/4/8): 'token' is the closed form
                (the target-only walk), 'traversal' and 'greedy' are simulated;
  delayed trees one sampled path of `delay` tokens, then top-k i.i.d. rollouts (depth 4/6/8,
                top-k 1/2/4/8, delay 0/1/2/4): every rule simulated.
Tokens = accepted draft tokens + the bonus. 'greedy' at temperature 1 is lossy (it changes the
output distribution) and is shown for reference only.

The simulation draws each node's target distribution from a Dirichlet of concentration kappa
around the preset's acceptances (planner.acceptance.rules); kappa is an assumption, not a fit,
so the table is printed for kappa = 4 (the planner's default) and kappa = 16 (targets closer to
the draft). Standard error per cell about 0.02 tokens (WORLDS simulated steps).

    python benchmarks/bench_verify_rules.py [--worlds 2000]

The last line printed is the JSON document.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from typing import Any

import numpy as np

from spectune.planner.acceptance import acceptance_model
from spectune.planner.acceptance.rules import expected_tokens_by_rule
from spectune.planner.space import canonical_policy
from spectune.planner.trees.build import build_tree
from spectune.planner.trees.delayed import delayed_tree

BUDGETS = (8, 16, 32, 64)
KAPPAS = (4.0, 16.0)
TOPK_RULES = ("token", "traversal", "greedy")
IID_RULES = ("token", "traversal", "spectr")


def topk_value(rule: str, policy: Any, model: Any, worlds: int, kappa: float, seed: int) -> float:
    rng = np.random.default_rng(seed)
    trees = [build_tree(policy, model, rng) for _ in range(8)]
    if rule == "token":  # closed form: the walk's exact expected tokens
        return float(np.mean([model.expected_tokens(t) for t in trees]))
    each = worlds // len(trees)
    return float(
        np.mean([expected_tokens_by_rule(rule, t, model, rng, each, False, kappa) for t in trees])
    )


def best_topk(budget: int, rule: str, model: Any, worlds: int, kappa: float) -> tuple[float, str]:
    best = (0.0, "")
    for depth, topk in itertools.product((4, 6, 8), (2, 4, 8)):
        pol = canonical_policy("dynamic-topk", depth, topk, budget, verify=rule)
        if pol.budget != budget:
            continue
        v = topk_value(rule, pol, model, worlds, kappa, 1)
        best = max(best, (v, pol.label))
    return best


def best_delayed(
    budget: int, rule: str, model: Any, worlds: int, kappa: float
) -> tuple[float, str]:
    best = (0.0, "")
    for depth, topk, delay in itertools.product((4, 6, 8), (1, 2, 4, 8), (0, 1, 2, 4)):
        if delay >= depth:
            continue
        pol = canonical_policy("delayed", depth, topk, budget, verify=rule, delay=delay)
        if pol.budget != budget:  # the shape must use the whole budget
            continue
        rng = np.random.default_rng(2)
        v = expected_tokens_by_rule(rule, delayed_tree(pol), model, rng, worlds, True, kappa)
        best = max(best, (v, pol.label))
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worlds", type=int, default=2000, help="simulated steps per cell")
    args = ap.parse_args()
    t0 = time.time()
    model = acceptance_model("mt-bench-t1")
    rows: list[dict[str, Any]] = []
    for kappa in KAPPAS:
        for budget in BUDGETS:
            for rule in TOPK_RULES:
                v, label = best_topk(budget, rule, model, args.worlds, kappa)
                rows.append(
                    {"kappa": kappa, "budget": budget, "drafts": "top-k", "rule": rule,
                     "tokens": v, "policy": label}
                )  # fmt: skip
            for rule in IID_RULES:
                v, label = best_delayed(budget, rule, model, args.worlds, kappa)
                rows.append(
                    {"kappa": kappa, "budget": budget, "drafts": "iid", "rule": rule,
                     "tokens": v, "policy": label}
                )  # fmt: skip
    cols = [("top-k", r) for r in TOPK_RULES] + [("iid", r) for r in IID_RULES]
    lines = [
        "expected tokens per step (accepted + bonus), mt-bench-t1 (EAGLE-3, Llama-3.1-8B, T=1)",
        "top-k: EAGLE-2 dynamic trees; iid: delayed expansion; greedy is lossy at T=1",
    ]
    for kappa in KAPPAS:
        lines.append(f"\nkappa = {kappa:g}")
        head = "budget " + " ".join(f"{d + ':' + r:>16}" for d, r in cols)
        lines.append(head)
        for budget in BUDGETS:
            cells = []
            for d, r in cols:
                (row,) = [
                    x
                    for x in rows
                    if x["kappa"] == kappa and x["budget"] == budget and x["drafts"] == d
                    and x["rule"] == r
                ]  # fmt: skip
                cells.append(f"{row['tokens']:>16.3f}")
            lines.append(f"{budget:>6} " + " ".join(cells))
        lines.append("best shapes (iid):")
        for budget in BUDGETS:
            shapes = [
                f"{x['rule']}={x['policy']}"
                for x in rows
                if x["kappa"] == kappa and x["budget"] == budget and x["drafts"] == "iid"
            ]
            lines.append(f"  {budget:>3}: " + "  ".join(shapes))
    print("\n".join(lines))
    print(
        json.dumps(
            {"workload": "mt-bench-t1", "worlds": args.worlds, "elapsed_s": time.time() - t0,
             "rows": rows}
        )
    )  # fmt: skip


if __name__ == "__main__":
    main()
