"""`spectune export`: write a policy file as SGLang, vLLM or TensorRT-LLM configuration and a
launch script beside it.

--engine takes an engine profile (`spectune presets` lists them: sglang, vllm, vllm-0.11,
trtllm, trtllm-1.4, trtllm-stage1) or a profile file. Engines load the models' Hugging Face
repo ids unless --model-path / --draft-model-path name other checkpoints. Each output is checked
against the engine's own rules. Engines express less than a spectune table (one tree shape,
batch size only); what had to be approximated is printed here and written into the files. The table's Scenario (its workload, GPU, models and
calibration) gives the tree shapes and the closed form that fits the engines' one global shape
(planner.export.export_table, which the dashboards' Planner page calls too). --target /
--drafter export the table for another pair (planner.export.for_pair): the engine loads those
models, and the shapes and the fit take that pair's acceptance (its preset, or the nearest with
a warning; --strict makes that an error).
"""

from __future__ import annotations

import argparse
import sys

from spectune.cli.common import (
    add_strict,
    check_out_path,
    engine_option,
    int_range,
    scenario_with_flags,
)
from spectune.planner.export import export_table, for_pair
from spectune.specs.policy import PolicyTable


def run(args: argparse.Namespace) -> int:
    check_out_path(args.out, folder=True)
    profile = engine_option(
        "vllm-0.11" if args.engine == "vllm" and args.vllm_tree else args.engine
    )
    table = PolicyTable.load(args.policy)
    pair = {n: getattr(args, n) for n in ("target", "drafter") if getattr(args, n) is not None}
    if pair:
        table = for_pair(table, scenario_with_flags(table.scenario, pair, args.policy))
    export, why = export_table(
        table,
        profile,
        context=args.context,
        trtllm_static_tree=True if args.trtllm_static_tree else None,
        model_path=args.model_path,
        draft_model_path=args.draft_model_path,
    )
    if why:
        print(f"note: {why}", file=sys.stderr)
    for path in export.write(args.out):
        print(f"wrote {path}")
    if export.approximations:
        print(f"{profile.name} cannot express all of {args.policy}; approximated:", file=sys.stderr)
        for note in export.approximations:
            print(f"  - {note}", file=sys.stderr)
    else:
        print(f"{profile.name} expresses {args.policy} exactly")
    print(f"launch: {args.out}/launch_{export.engine}.sh")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="write a policy file as SGLang / vLLM / TensorRT-LLM configuration",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("policy", help="policy file written by `spectune plan`")
    p.add_argument(
        "--engine",
        required=True,
        help="engine profile: sglang, vllm, vllm-0.11, trtllm, trtllm-1.4, trtllm-stage1 "
        "(`spectune presets`), or a profile JSON/TOML file",
    )
    p.add_argument(
        "--target",
        help="export for this target (preset or spec file) instead of the policy file's; "
        "the engine loads it and the tree shapes take the new pair's acceptance",
    )
    p.add_argument(
        "--drafter",
        help="export for this drafter (preset or spec file, or 'none') instead of the policy "
        "file's",
    )
    add_strict(p)
    p.add_argument(
        "--model-path",
        default=None,
        help="target checkpoint the engine loads (Hugging Face repo id or local folder; "
        "default: the target preset's hf_repo)",
    )
    p.add_argument(
        "--draft-model-path",
        default=None,
        help="draft checkpoint (Hugging Face repo id or local folder; default: the drafter "
        "preset's hf_repo)",
    )
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
        help="with --engine vllm: export for vllm-0.11 (one static speculative_token_tree; "
        "releases before the May 2026 tree-attention removal)",
    )
    p.add_argument(
        "--trtllm-static-tree",
        action="store_true",
        help="TensorRT-LLM: export eagle_choices (static tree) instead of a dynamic tree",
    )
    p.set_defaults(func=run)
