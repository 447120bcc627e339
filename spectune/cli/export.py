"""`spectune export`: write a policy file as SGLang, vLLM or TensorRT-LLM configuration.

Each output is checked against the engine's own rules. Engines express less than a spectune
table (one tree shape, batch size only); what had to be approximated is printed here and
written into the exported files. The table's Scenario (its workload, GPU, models and
calibration) gives the tree shapes and the closed form that fits the engines' one global shape
(planner.export.export_table, which the dashboards' Planner page calls too).
"""

from __future__ import annotations

import argparse
import sys

from spectune.planner.export import ENGINES, export_table
from spectune.specs.policy import PolicyTable


def run(args: argparse.Namespace) -> int:
    table = PolicyTable.load(args.policy)
    export, why = export_table(
        table,
        args.engine,
        context=args.context,
        vllm_tree=args.vllm_tree,
        trtllm_static_tree=True if args.trtllm_static_tree else None,
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
        type=int,
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
