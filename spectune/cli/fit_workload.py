"""`spectune fit-workload TRACES... --out workload.json`: fit a workload preset (positional,
confidence-calibration and retrieval profiles) from recorded spectune.trace/v1 traces, and
report how well it predicts the replayed mean accepted length (optionally on held-out
requests that the fit did not see). The workload records the (target, drafter) pair of the
traces; using it with another pair warns (an error with --strict)."""

from __future__ import annotations

import argparse
import json

from spectune.cli.common import check_out_path, int_range, ints
from spectune.specs.errors import SpecError
from spectune.specs.io import write_json_atomic
from spectune.specs.policy import MAX_BUDGET


def run(args: argparse.Namespace) -> int:
    from spectune.traces.fit import (
        LoadedTraces,
        fit_workload,
        load_traces,
        predicted_tokens,
        reference_policy,
        replayed_tokens,
        split_requests,
        workload_to_dict,
    )

    check_out_path(args.out)
    traces = load_traces(args.traces)
    train, held = split_requests(traces.steps, args.holdout_every)
    if not train:
        raise SpecError("no steps left to fit after holding out requests")
    fit_on = LoadedTraces(traces.headers, train, traces.paths)
    name = args.name or "fitted-" + "-".join(sorted({h.prompt_set for h in traces.headers}))
    wl = fit_workload(fit_on, name, acceptance=args.acceptance)
    doc = workload_to_dict(wl)
    report = []
    for budget in args.budgets:
        pol = reference_policy(traces.max_depth, traces.max_topk, budget)
        row = {
            "budget": budget,
            "predicted": round(predicted_tokens(pol, wl), 4),
            "replayed_fit": round(replayed_tokens(pol, train), 4),
        }
        if held:
            row["replayed_held_out"] = round(replayed_tokens(pol, held), 4)
            row["held_out_error"] = round(row["predicted"] / row["replayed_held_out"] - 1, 4)
        report.append(row)
        print(
            f"budget {budget:3d}: predicted {row['predicted']:.3f} tokens/step, replayed "
            f"{row['replayed_fit']:.3f} on the {len({s.request for s in train})} fitted requests"
            + (
                f", {row['replayed_held_out']:.3f} on {len({s.request for s in held})} held-out "
                f"({100 * row['held_out_error']:+.1f}%)"
                if held
                else ""
            )
        )
    write_json_atomic(args.out, doc)  # last: a failure above leaves no file behind
    print(
        f"wrote {args.out} ({wl.name}, acceptance {wl.acceptance}, {len(train)} steps fitted; "
        f"recorded for target {wl.target!r} + drafter {wl.drafter!r}: applying it to another "
        "pair warns)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "workload": wl.name,
                    "out": args.out,
                    "target": wl.target,
                    "drafter": wl.drafter,
                    "check": report,
                }
            )
        )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit-workload", help="fit a workload preset from recorded traces (spectune.trace/v1)"
    )
    p.add_argument("traces", nargs="+", help="trace files (.jsonl or .jsonl.gz)")
    p.add_argument("--out", required=True, help="workload JSON to write")
    p.add_argument("--name", help="preset name (default: fitted-<prompt sets>)")
    p.add_argument(
        "--acceptance",
        choices=("confidence", "positional"),
        default="confidence",
        help="acceptance model the preset selects (both profiles are fitted either way)",
    )
    p.add_argument(
        "--holdout-every",
        type=int_range(0, 1_000_000),
        default=0,
        help="hold out every N-th request (sorted by id) from the fit and check on them",
    )
    p.add_argument(
        "--budgets",
        type=ints(2, MAX_BUDGET),
        default=[8, 16, 32, 64],
        help="verify budgets to check",
    )
    p.add_argument("--json", action="store_true", help="print the check as JSON last")
    p.set_defaults(func=run)
