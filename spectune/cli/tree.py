"""`spectune tree`: build one draft tree for a workload (or an acceptance vector) and show it
with its expected tokens per step.

The acceptance is the workload's for the (--target, --drafter) pair: the same dataset accepts
differently under an EAGLE-2 head, an EAGLE-3 head or a draft model (specs.acceptance_presets).
With --intermediate the tree is one round of hierarchical drafting: grown by the intermediate's
drafter (--intermediate-drafter, default --drafter) and verified by the intermediate, with that
pair's acceptance; --chain N then gives the hierarchical step the target sees (rounds until the
intermediate holds >= N tokens, that chain verified by the target: planner.hierarchical)."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import numpy as np

from spectune.cli.common import add_intermediate, add_strict, float_range, floats, int_range, seed
from spectune.planner.acceptance import AcceptanceModel, PositionalAcceptance, acceptance_model
from spectune.planner.hierarchical import HierAcceptance, hierarchical_outcome, scenario_hierarchy
from spectune.planner.trees import build_tree
from spectune.specs.compat import check_pair
from spectune.specs.errors import SpecError
from spectune.specs.model import load_model
from spectune.specs.policy import MAX_BUDGET, MAX_DEPTH, MAX_TOPK, TreePolicy
from spectune.specs.scenario import Scenario
from spectune.specs.tree import SOURCE_NAMES, DraftTree
from spectune.specs.workload import Workload, load_workload

BUILDERS = {
    "sequoia": "static",
    "static": "static",
    "dynamic": "dynamic-topk",
    "dynamic-topk": "dynamic-topk",
}


def draw_tree(tree: DraftTree, accept: np.ndarray) -> list[str]:
    """Text drawing, one line per node: index, source, draft prob, P(accepted)."""
    lines = ["[0] root  P=1.000"]
    first, nxt = tree.first_child, tree.next_sibling

    def walk(node: int, prefix: str) -> None:
        child = int(first[node])
        while child >= 0:
            last = int(nxt[child]) < 0
            src = SOURCE_NAMES[int(tree.source[child])]
            lines.append(
                f"{prefix}{'└── ' if last else '├── '}[{child}] {src:<9} "
                f"q={np.exp(tree.logprobs[child]):.3f}  P={accept[child]:.3f}"
            )
            walk(child, prefix + ("    " if last else "│   "))
            child = int(nxt[child])

    walk(0, "")
    return lines


def pair_workload(args: argparse.Namespace) -> Workload:
    """The workload with the acceptance of the --target/--drafter pair (checked compatible)."""
    target = load_model(args.target)
    drafter = None if args.drafter.lower() == "none" else load_model(args.drafter)
    check_pair(target, drafter)
    return load_workload(args.workload, target=target, drafter=drafter, strict=args.strict)


def _hierarchy(args: argparse.Namespace) -> tuple[Workload, HierAcceptance]:
    """(the round's tree workload, both acceptances) of the --intermediate scenario."""
    resolved = Scenario(
        target=args.target,
        drafter=args.drafter,
        workload=args.workload,
        intermediate=args.intermediate,
        intermediate_drafter=args.intermediate_drafter,
    ).resolve()
    hier = scenario_hierarchy(resolved)
    assert hier is not None and resolved.intermediate_trees is not None
    return resolved.intermediate_trees, hier


def _model(args: argparse.Namespace) -> tuple[AcceptanceModel, Workload | None]:
    if args.intermediate:
        if args.accept is not None:
            raise SpecError(
                "--accept and --intermediate: the intermediate's trees take the workload"
            )
        wl, hier = _hierarchy(args)
        return hier.tree, wl
    if args.chain:
        raise SpecError("--chain needs --intermediate (the model that verifies the trees)")
    if args.accept is not None:
        vec = args.accept
        if any(not 0 <= v <= 1 for v in vec) or sum(vec) > 1 + 1e-9:
            raise SpecError(
                f"--accept must be probabilities in [0, 1] summing to <= 1 (one child of a node "
                f"can be accepted), got {vec}"
            )
        return PositionalAcceptance([vec]), None
    wl = pair_workload(args)
    return acceptance_model(wl), wl


def run(args: argparse.Namespace) -> int:
    model, wl = _model(args)
    topk = args.topk
    if topk is None:
        topk = len(args.accept) if args.accept is not None else 4
    policy = TreePolicy(
        builder=BUILDERS[args.builder],
        depth=args.depth,
        topk=topk,
        budget=args.budget,
        prune_threshold=args.prune_threshold,
        graft_budget=args.graft_budget,
    )
    tree = build_tree(policy, model, np.random.default_rng(args.seed))
    accept = model.node_accept_prob(tree)
    expected = float(accept[1:].sum() + 1.0)
    hier: dict[str, float] = {}
    if args.chain:
        _, models = _hierarchy(args)
        h = hierarchical_outcome(replace(policy, chain=args.chain), models, seed=args.seed)
        hier = {
            "target_expected_tokens": h.expected_tokens,
            "rounds": h.rounds,
            "chain_tokens": h.chain_tokens,
        }
    if args.json:
        print(
            json.dumps(
                {
                    **hier,
                    "expected_tokens": expected,
                    "acceptance": wl.source if wl is not None else "--accept",
                    "parents": tree.parents.tolist(),
                    "depth": tree.depth.tolist(),
                    "source": [SOURCE_NAMES[int(s)] for s in tree.source],
                    "accept_prob": [round(float(p), 6) for p in accept],
                }
            )
        )
        return 0
    if args.intermediate:
        grower = args.intermediate_drafter or args.drafter
        what = f"{args.workload} with {args.intermediate} (intermediate) + {grower}"
    elif wl is not None:
        what = f"{args.workload} with {args.target} + {args.drafter}"
    else:
        what = "--accept " + ",".join(f"{v:g}" for v in args.accept)
    print(
        f"{policy.builder} tree for {what}: {tree.num_nodes} nodes (budget {policy.budget}), "
        f"depth {tree.max_depth}, top-k {policy.topk}"
    )
    for line in draw_tree(tree, accept):
        print(line)
    step = "intermediate step" if args.intermediate else "step"
    print(f"expected tokens per {step}: {expected:.4f} (accepted draft tokens + 1 bonus)")
    if hier:
        print(
            f"hierarchical, chain >= {args.chain}: {hier['rounds']:.2f} rounds per target step, "
            f"chains of {hier['chain_tokens']:.2f} tokens, {hier['target_expected_tokens']:.4f} "
            f"tokens per target step ({args.target})"
        )
    if wl is not None:
        print(f"acceptance: {wl.source}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tree", help="build and draw one draft tree with its expected tokens")
    p.add_argument(
        "--builder",
        choices=sorted(BUILDERS),
        default="dynamic",
        help="sequoia/static: optimal static shape; dynamic: EAGLE-2 top-k (default)",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument(
        "--workload",
        default="mt-bench",
        help="workload preset or JSON/TOML file (default mt-bench)",
    )
    src.add_argument(
        "--accept",
        type=floats(0, 1),
        default=None,
        help="Sequoia acceptance vector by sibling rank, e.g. 0.6,0.2,0.1",
    )
    p.add_argument("--target", default="llama-3.1-8b", help="target model preset or spec file")
    p.add_argument(
        "--drafter",
        default="eagle3-llama-3.1-8b",
        help="drafter preset or spec file; 'none' for n-gram / prompt lookup",
    )
    add_intermediate(p)
    p.add_argument(
        "--chain",
        type=int_range(1, MAX_DEPTH),
        default=0,
        help="with --intermediate: the hierarchical chain length N (rounds until the "
        "intermediate holds >= N tokens); prints the target's tokens per step",
    )
    add_strict(p)
    p.add_argument(
        "--budget",
        type=int_range(2, MAX_BUDGET),
        default=16,
        help="verify budget: tree tokens per sequence, root included",
    )
    p.add_argument(
        "--depth",
        type=int_range(1, MAX_DEPTH),
        default=5,
        help="maximum depth below the root, draft steps",
    )
    p.add_argument(
        "--topk",
        type=int_range(1, MAX_TOPK),
        default=None,
        help="children per node (default 4, or the length of --accept)",
    )
    p.add_argument(
        "--prune-threshold",
        type=float_range(0, 0.999999),
        default=0.0,
        help="drop nodes whose path draft probability is below this, 0..1",
    )
    p.add_argument(
        "--graft-budget",
        type=int_range(0, MAX_BUDGET),
        default=0,
        help="freed slots retrieved tokens may fill, tokens",
    )
    p.add_argument("--seed", type=seed, default=0, help="random seed")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
