"""`spectune export`: write a policy file as SGLang, vLLM or TensorRT-LLM configuration.

Each output is checked against the engine's own rules. Engines express less than a spectune
table (one tree shape, batch size only); what had to be approximated is printed here and
written into the exported files.
"""

from __future__ import annotations

import argparse
import sys

from spectune.cli.common import check_out_path, int_range
from spectune.planner.export import ENGINES, Evaluate, TreeShaper, export_policy
from spectune.planner.objective import closed_form_objective
from spectune.specs.errors import SpecError
from spectune.specs.policy import PolicyTable, TreePolicy
from spectune.specs.tree import DraftTree


def _shaper(table: PolicyTable) -> TreeShaper:
    """Static trees for engines with a fixed tree, from the table's workload acceptance."""
    import numpy as np

    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import build_tree
    from spectune.specs.workload import load_workload

    model = acceptance_model(load_workload(table.workload))

    def shape(policy: TreePolicy) -> DraftTree:
        static = TreePolicy("static", policy.depth, policy.topk, policy.budget)
        tree: DraftTree = build_tree(static, model, np.random.default_rng(0))
        return tree

    return shape


def _objective(table: PolicyTable) -> tuple[Evaluate | None, str]:
    """The planner's closed form for the table's scenario (to fit engines' global knobs)."""
    if not table.workload:
        return None, "the policy file names no workload: engine knobs from the batch-1 bucket"
    try:
        obj = closed_form_objective(
            table.target, table.drafter, table.hardware, table.workload, tp=table.tp
        )
    except (SpecError, OSError) as e:
        return None, f"cannot rebuild the objective ({e}): engine knobs from the batch-1 bucket"
    return obj, ""


def run(args: argparse.Namespace) -> int:
    check_out_path(args.out, folder=True)
    table = PolicyTable.load(args.policy)
    needs_shape = (args.engine == "vllm" and args.vllm_tree) or (
        args.engine == "trtllm" and args.trtllm_static_tree
    )
    shaper = _shaper(table) if needs_shape else None
    if (
        args.engine == "trtllm"
        and not needs_shape
        and any(b.policy is not None and b.policy.builder == "static" for b in table.buckets)
    ):
        shaper = _shaper(table)
    evaluate, why = _objective(table)
    export = export_policy(
        table,
        args.engine,
        context=args.context,
        vllm_tree=args.vllm_tree,
        trtllm_static_tree=True if args.trtllm_static_tree else None,
        shaper=shaper,
        evaluate=evaluate,
    )
    if why:
        print(f"note: {why}", file=sys.stderr)
    for path in export.write(args.out):
        print(f"wrote {path}")
    if export.approximations:
        print(f"{args.engine} cannot express all of {args.policy}; approximated:", file=sys.stderr)
        for note in export.approximations:
            print(f"  - {note}", file=sys.stderr)
    else:
        print(f"{args.engine} expresses {args.policy} exactly")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a policy file as SGLang / vLLM / TensorRT-LLM configuration",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("policy", help="policy file written by `spectune plan`")
    p.add_argument("--engine", choices=ENGINES, required=True, help="serving engine")
    p.add_argument("--out", default="export", help="output folder (default ./export)")
    p.add_argument(
        "--context",
        type=int_range(0, 1 << 24),
        default=None,
        help="context length whose bucket policies to export (engines key by batch "
        "size only; default: the shortest-context buckets)",
    )
    p.add_argument(
        "--vllm-tree",
        action="store_true",
        help="vLLM before the May 2026 tree-attention removal: also export one "
        "static speculative_token_tree",
    )
    p.add_argument(
        "--trtllm-static-tree",
        action="store_true",
        help="TensorRT-LLM: export eagle_choices (static tree) instead of a dynamic tree",
    )
    p.set_defaults(func=run)
