"""Quantized targets and hierarchical drafting: the planner against "Speculative Decoding Meets
Quantization" (Zhang et al., arXiv 2505.22179).

(a) The paper's headline: a W4A16 Llama-3-70B target (GPTQ, group 128) at batch 1. The paper
    measures on an A100 (Spec-Bench mean): EAGLE-2 2.12x over its own W4A16 decode, the
    hierarchical scheme (EAGLE head -> W4A16 Llama-3-8B intermediate -> target) 2.78x, i.e.
    1.31x over EAGLE-2 (abstract; README of AI9Stars/SpecMQuant: "achieving a 1.31x speedup
    over EAGLE-2"; 2.12 = 2.78 / 1.31). spectune predicts, on the A100 and on the H100, the best
    tree (EAGLE-2 head of the 70B, exhaustive grid) and the best hierarchical policy (grid of
    trees x chain lengths), and lets the planner's search (planner.search, hierarchical space)
    choose between them; the chosen two are also simulated (simulator, same step price). The
    W4A16 GEMMs are priced as Marlin (the paper's kernel; Calibration defaults); one more H100
    row prices them as Machete-class (dequantization share 1: "matches compute-bound
    performance" of fp16, Neural Magic 2024), where big trees cost less.
(b) The optimal policy per batch size (1/8/32/64) for the W4A16 70B on one H100 against the
    bf16 70B on two (tp 2), each with its own intermediate (W4A16 / bf16 Llama-3.1-8B), chosen
    by the planner's search over trees and hierarchical policies.

Acceptance: trees come from the EAGLE (EAGLE-2) presets of the Llama-3 family at MT-Bench, T=0
(the 70B's head for plain trees, the 8B's head against the intermediate). The intermediate's
chain against the target has no preset: its conditional acceptance alpha is an estimate from
llama.cpp's Llama-3-70B-Instruct Q4_K_M with a Llama-3-8B-Instruct Q4_K_M draft at top-k 1
(devquasar.com, "Speculative decoding tradeoffs GPU with large models Llama 70B 8B": 58.68%
of 8 drafted tokens accepted, i.e. 4.69 per step, alpha = 0.88 for a flat chain); (a) shows
how the answer moves with alpha. Steps are decode steps at a 1024-token context (no prefill
turnover, no KV cap), as the paper's per-request decode speed.

    python benchmarks/bench_quant.py [--trials N] [--out FILE]

Prints the tables, then one JSON document on the last line.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
import warnings
from dataclasses import dataclass, replace
from typing import Any

import optuna

from spectune.planner.acceptance import acceptance_model
from spectune.planner.buckets import BucketSpec
from spectune.planner.costmodel import CostModel
from spectune.planner.hierarchical import HierAcceptance, chain_acceptance
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.search import search
from spectune.planner.space import PolicySpace, canonical_policy
from spectune.planner.studies import SearchSettings
from spectune.specs import (
    Calibration,
    HardwareSpec,
    ModelSpec,
    TreePolicy,
    hardware_preset,
    load_workload,
    model_preset,
    policy_label,
)
from spectune.specs.compat import PairWarning
from spectune.specs.workload import workload_for_pair

PAPER = {"gpu": "a100-80g", "eagle2": 2.78 / 1.31, "hierarchical": 2.78, "ratio": 1.31}
ALPHA = 0.88
CONTEXT = 1024
BATCHES = (1, 8, 32, 64)
TREE_GRID = {
    "depths": (2, 3, 4, 5, 6, 8),
    "topks": (1, 2, 4, 6, 8, 10),
    "budgets": (4, 8, 16, 24, 32, 48, 64),
}
HIER_GRID = {"depths": (2, 3, 4), "topks": (4, 8, 10), "budgets": (8, 16, 30, 48)}
CHAINS = (3, 4, 6, 8, 10)
SAMPLES = 512  # trees per policy for E[tokens]; chains per hierarchical policy
SPACE = PolicySpace(depth=(1, 8), topk=(1, 10), budget=(2, 64), allow_prune=False, graft=(0, 0))


@dataclass(frozen=True)
class Setup:
    """One target with its tree drafter and its hierarchical stage, on one GPU kind."""

    label: str
    gpu: HardwareSpec
    tp: int
    target: ModelSpec
    intermediate: ModelSpec
    calibration: Calibration | None = None

    def objective(self, alpha: float) -> ClosedFormObjective:
        wl = load_workload("mt-bench")
        head70, head8 = model_preset("eagle-llama-3-70b"), model_preset("eagle-llama-3.1-8b")
        cm = CostModel(
            self.gpu,
            self.target,
            head70,
            tp=self.tp,
            calibration=self.calibration,
            intermediate=self.intermediate,
            intermediate_drafter=head8,
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PairWarning)  # heads of Llama-3 on 3.1 presets
            trees = acceptance_model(workload_for_pair(wl, self.target, head70))
            inner = acceptance_model(workload_for_pair(wl, self.intermediate, head8))
        hier = HierAcceptance(tree=inner, chain=chain_acceptance(alpha))
        return ClosedFormObjective(cm, trees, hierarchy=hier, samples=SAMPLES)


def eagle3_objective(s: Setup) -> ClosedFormObjective:
    """Trees of the target's EAGLE-3 head (no hierarchical stage): the strongest tree drafter
    spectune has a preset for, beside the paper's EAGLE-2 baseline."""
    head = model_preset("eagle3-llama-3.1-70b")
    cm = CostModel(s.gpu, s.target, head, tp=s.tp)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", PairWarning)
        acc = acceptance_model(workload_for_pair(load_workload("mt-bench"), s.target, head))
    return ClosedFormObjective(cm, acc, samples=SAMPLES)


def best_of(
    obj: ClosedFormObjective, policies: list[TreePolicy], batch: int
) -> tuple[TreePolicy, float]:
    values = {p: obj(p, batch, CONTEXT) for p in policies}
    best = max(values, key=lambda p: values[p])
    return best, values[best]


def grid(spec: dict[str, tuple[int, ...]], chains: tuple[int, ...] = (0,)) -> list[TreePolicy]:
    out: list[TreePolicy] = []
    for d, k, b, c in itertools.product(spec["depths"], spec["topks"], spec["budgets"], chains):
        p = canonical_policy("dynamic-topk", d, k, b, chain=c)
        if p not in out:
            out.append(p)
    return out


def planner_choice(
    obj: ClosedFormObjective, batch: int, trials: int
) -> tuple[TreePolicy | None, float]:
    """The planner's search at one batch size over trees and hierarchical policies."""
    space = replace(SPACE, chain=(2, 12))
    settings = SearchSettings(trials=trials, space=space, min_gain=0.0, chains=False, seed=0)
    [res] = search(obj, [BucketSpec((batch, batch), (CONTEXT, CONTEXT))], settings)
    return res.policy, res.tokens_per_s


def headline(trials: int) -> list[dict[str, Any]]:
    """Per GPU and chain acceptance alpha: best tree, best hierarchical policy (grids) and the
    planner's choice at batch 1 (its search only at the main alpha)."""
    rows = []
    trees, hiers = grid(TREE_GRID), grid(HIER_GRID, CHAINS)
    # Marlin (the paper's kernel) by default; Machete's Hopper wgmma path "matches compute-bound
    # [fp16] performance" (Neural Magic, Oct 2024): a dequantization share of 1
    machete = Calibration(weight_only_flops_efficiency=1.0, source="Machete-class what-if")
    for gpu, cal in (("a100-80g", None), ("h100-sxm", None), ("h100-sxm", machete)):
        tree = None
        for alpha in (ALPHA, 0.80, 0.92) if cal is None else (ALPHA,):
            s = Setup(
                gpu,
                hardware_preset(gpu),
                1,
                model_preset("llama-3.1-70b-gptq"),
                model_preset("llama-3.1-8b-gptq"),
                cal,
            )
            obj = s.objective(alpha)
            off = obj(None, 1, CONTEXT)
            if tree is None:
                tree, tv = best_of(obj, trees, 1)
            hier, hv = best_of(obj, hiers, 1)
            row = {
                "gpu": gpu if cal is None else gpu + "+machete",
                "kernel": "marlin" if cal is None else "machete",
                "alpha": alpha,
                "off_tok_s": off,
                "best_tree": tree.label,
                "tree_speedup": tv / off,
                "tree_tokens_per_step": obj.expected_tokens(tree),
                "best_hierarchical": hier.label,
                "hier_speedup": hv / off,
                "hier_tokens_per_step": obj.expected_tokens(hier),
                "hier_over_tree": hv / tv,
            }
            if alpha == ALPHA and cal is None:
                chosen, cv = planner_choice(obj, 1, trials)
                row.update(
                    planner_choice=policy_label(chosen),
                    planner_speedup=cv / off,
                    planner_over_best_tree=cv / tv,
                )
            rows.append(row)
    return rows


def simulated(alpha: float) -> dict[str, float]:
    """The headline's H100 winners simulated at batch 1 (closed loop, 16 requests)."""
    from spectune.simulator import SimConfig, simulate
    from spectune.simulator.arrivals import ClosedLoop

    s = Setup(
        "h100",
        hardware_preset("h100-sxm"),
        1,
        model_preset("llama-3.1-70b-gptq"),
        model_preset("llama-3.1-8b-gptq"),
    )
    obj = s.objective(alpha)
    tree, _ = best_of(obj, grid(TREE_GRID), 1)
    hier, _ = best_of(obj, grid(HIER_GRID, CHAINS), 1)
    out = {}
    for name, p in (("tree", tree), ("hierarchical", hier)):
        cfg = SimConfig(
            s.gpu,
            s.target,
            obj.cost_model.drafter,
            ClosedLoop(1),
            p,
            load_workload("mt-bench"),
            requests=16,
            cost_model=obj.cost_model,
            acceptance=obj.acceptance,
            hierarchy=obj.hierarchy,
        )
        out[name] = float(simulate(cfg).summary()["speedup_vs_off"])
        out[name + "_policy"] = p.label  # type: ignore[assignment]
    return out


def per_batch(trials: int, alpha: float) -> list[dict[str, Any]]:
    h100 = hardware_preset("h100-sxm")
    setups = (
        Setup(
            "W4A16 (GPTQ) x1",
            h100,
            1,
            model_preset("llama-3.1-70b-gptq"),
            model_preset("llama-3.1-8b-gptq"),
        ),
        Setup(
            "bf16 x2 (tp 2)", h100, 2, model_preset("llama-3.1-70b"), model_preset("llama-3.1-8b")
        ),
    )
    rows = []
    trees = grid(TREE_GRID)
    for s in setups:
        obj = s.objective(alpha)
        for b in BATCHES:
            off = obj(None, b, CONTEXT)
            tree, tv = best_of(obj, trees, b)
            chosen, cv = planner_choice(obj, b, trials)
            e3 = eagle3_objective(s)
            e3_tree, e3v = best_of(e3, trees, b)
            rows.append(
                {
                    "target": s.label,
                    "batch": b,
                    "off_tok_s": off,
                    "planner_choice": policy_label(chosen),
                    "speedup": cv / off,
                    "best_tree": tree.label,
                    "tree_speedup": tv / off,
                    "hierarchical": bool(chosen is not None and chosen.chain),
                    "gain_over_best_tree": cv / tv,
                    "best_eagle3_tree": e3_tree.label,
                    "eagle3_speedup": e3v / off,  # off does not depend on the drafter
                }
            )
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=160, help="planner trials per search")
    ap.add_argument("--out", default=None, help="also write the JSON document here")
    args = ap.parse_args()
    t0 = time.monotonic()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print("(a) W4A16 Llama-3-70B, batch 1, context 1024: best tree vs hierarchical")
    print(
        f"    paper ({PAPER['gpu']}, Spec-Bench): EAGLE-2 {PAPER['eagle2']:.2f}x, hierarchical "
        f"{PAPER['hierarchical']:.2f}x, hierarchical / EAGLE-2 {PAPER['ratio']:.2f}x"
    )
    head = f"{'gpu':<17}{'alpha':>6} {'best tree':<22}{'x':>6}{'tok':>6} {'best hierarchical':<28}{'x':>6}{'tok':>6}{'h/t':>6}  {'planner chooses':<28}{'x':>6}{'vs tree':>8}"
    print(head)
    print("-" * len(head))
    rows_a = headline(args.trials)
    for r in rows_a:
        line = (
            f"{r['gpu']:<17}{r['alpha']:>6.2f} {r['best_tree']:<22}{r['tree_speedup']:>6.2f}"
            f"{r['tree_tokens_per_step']:>6.2f} {r['best_hierarchical']:<28}"
            f"{r['hier_speedup']:>6.2f}{r['hier_tokens_per_step']:>6.2f}"
            f"{r['hier_over_tree']:>6.2f}"
        )
        if "planner_choice" in r:
            line += (
                f"  {r['planner_choice']:<28}{r['planner_speedup']:>6.2f}"
                f"{r['planner_over_best_tree']:>8.2f}"
            )
        print(line)
    for r in rows_a:
        if "planner_choice" in r:
            hier = "hierarchical" if ",hier" in r["planner_choice"] else "not hierarchical"
            print(
                f"planner on {r['gpu']}: {r['planner_choice']} ({hier}), predicted "
                f"{100 * (r['planner_over_best_tree'] - 1):+.0f}% over the best EAGLE-2 tree "
                f"(paper, A100: {100 * (PAPER['ratio'] - 1):+.0f}%)"
            )
    sim = simulated(ALPHA)
    print(
        f"simulated on h100-sxm at batch 1 (alpha {ALPHA}): tree {sim['tree_policy']} "
        f"{sim['tree']:.2f}x, hierarchical {sim['hierarchical_policy']} {sim['hierarchical']:.2f}x"
    )
    print()
    print(f"(b) optimal policy per batch size, Llama-3.1-70B on H100, alpha {ALPHA}, context 1024")
    head = (
        f"{'target':<18}{'batch':>6}  {'planner chooses':<28}{'x':>6}  {'best EAGLE-2 tree':<22}"
        f"{'x':>6}{'gain':>6}  {'best EAGLE-3 tree':<22}{'x':>6}"
    )
    print(head)
    print("-" * len(head))
    rows_b = per_batch(args.trials, ALPHA)
    for r in rows_b:
        print(
            f"{r['target']:<18}{r['batch']:>6}  {r['planner_choice']:<28}{r['speedup']:>6.2f}  "
            f"{r['best_tree']:<22}{r['tree_speedup']:>6.2f}{r['gain_over_best_tree']:>6.2f}  "
            f"{r['best_eagle3_tree']:<22}{r['eagle3_speedup']:>6.2f}"
        )
    doc = {
        "bench": "quant",
        "paper": PAPER,
        "alpha": ALPHA,
        "context": CONTEXT,
        "headline": rows_a,
        "simulated_h100_batch1": sim,
        "per_batch": rows_b,
        "seconds": time.monotonic() - t0,
    }
    if args.out:
        from spectune.specs import write_json_atomic

        write_json_atomic(args.out, doc)
    print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
