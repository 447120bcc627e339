"""`spectune fit-workload TRACES... --out workload.json`: fit a workload preset (positional,
confidence-calibration and retrieval profiles) from recorded spectune.trace/v1 traces, and
check how well it predicts the replayed mean accepted length on requests it did not see.

The written workload is fitted on every request. The check is k-fold cross-validation by
request (spectune.traces.fit.cross_validate, --folds): the requests are split into k folds,
and each fold's steps are predicted by a workload fitted on the other folds only; the table
shows that held-out prediction beside the replayed figure, and the in-sample prediction of the
written workload. Progress (loading, the fit, each fold) goes to stderr. The workload records
the (target, drafter) pair of the traces; using it with another pair warns (an error with
--strict)."""

from __future__ import annotations

import argparse
import json
import sys
import time

from spectune.cli.common import check_out_path, int_range, ints
from spectune.specs.io import write_json_atomic
from spectune.specs.policy import MAX_BUDGET

DEFAULT_FOLDS = 3


def run(args: argparse.Namespace) -> int:
    from spectune.traces.fit import (
        cross_validate,
        fit_workload,
        load_traces,
        predicted_tokens,
        reference_policy,
        workload_to_dict,
    )

    check_out_path(args.out)
    t0 = time.monotonic()

    def say(text: str) -> None:
        if not args.quiet:
            print(f"  [{time.monotonic() - t0:5.1f} s] {text}", file=sys.stderr, flush=True)

    traces = load_traces(args.traces)
    requests = len({s.request for s in traces.steps})
    say(f"read {len(traces.steps)} steps of {requests} requests from {len(args.traces)} file(s)")
    folds = min(args.folds, requests)
    if folds < args.folds:
        say(f"--folds {args.folds} > {requests} requests: {folds}-fold (one request per fold)")
    name = args.name or "fitted-" + "-".join(sorted({h.prompt_set for h in traces.headers}))
    say(f"fitting {name} on all {requests} requests")
    wl = fit_workload(traces, name, acceptance=args.acceptance)
    doc = workload_to_dict(wl)
    checks = []
    if folds >= 2:
        say(
            f"validating on held-out requests: {folds}-fold by request, each fold "
            f"predicted by a fit on the other {folds - 1}"
        )
        checks = cross_validate(
            traces,
            folds,
            args.budgets,
            args.acceptance,
            progress=lambda done, k: say(f"fold {done}/{k} done"),
        )
    report = []
    pols = {b: reference_policy(traces.max_depth, traces.max_topk, b) for b in args.budgets}
    for i, budget in enumerate(args.budgets):
        row: dict[str, float | int] = {
            "budget": budget,
            "predicted_in_sample": round(predicted_tokens(pols[budget], wl), 4),
        }
        if checks:
            c = checks[i]
            row.update(
                replayed=round(c.replayed, 4),
                predicted_held_out=round(c.predicted, 4),
                held_out_error=round(c.error, 4),
                folds=c.folds,
            )
        report.append(row)
    _print_report(report, folds, requests)
    write_json_atomic(args.out, doc)  # last: a failure above leaves no file behind
    print(
        f"wrote {args.out} ({wl.name}, acceptance {wl.acceptance}, fitted on all {requests} "
        f"requests ({len(traces.steps)} steps); recorded for target {wl.target!r} + drafter "
        f"{wl.drafter!r}: applying it to another pair warns)"
    )
    if args.json:
        print(
            json.dumps(
                {
                    "workload": wl.name,
                    "out": args.out,
                    "target": wl.target,
                    "drafter": wl.drafter,
                    "folds": folds if checks else 0,
                    "check": report,
                }
            )
        )
    return 0


def _print_report(report: list[dict[str, float | int]], folds: int, requests: int) -> None:
    """The check as a table of mean tokens per step (accepted drafts + the bonus token)."""
    held = "held_out_error" in report[0]
    if held:
        print(
            f"check on held-out requests ({folds}-fold cross-validation by request over "
            f"{requests} requests): mean tokens per verify step"
        )
    else:
        print("in-sample check only (fewer than 2 folds): mean tokens per verify step")
    head = f"{'budget':>6} {'in-sample pred':>14}"
    if held:
        head += f" {'held-out pred':>13} {'replayed':>9} {'held-out error':>14}"
    print(head)
    for r in report:
        line = f"{r['budget']:>6} {r['predicted_in_sample']:>14.3f}"
        if held:
            line += (
                f" {r['predicted_held_out']:>13.3f} {r['replayed']:>9.3f} "
                f"{100 * r['held_out_error']:>+13.1f}%"
            )
        print(line)


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
        "--folds",
        type=int_range(0, 100),
        default=DEFAULT_FOLDS,
        help="k of the k-fold cross-validation by request that checks the fit on held-out "
        "requests (each fold costs about one more fit; 0 or 1: in-sample check only)",
    )
    p.add_argument(
        "--budgets",
        type=ints(2, MAX_BUDGET),
        default=[8, 16, 32, 64],
        help="verify budgets (tree tokens per sequence) of the reference trees checked",
    )
    p.add_argument("--json", action="store_true", help="print the check as JSON last")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run)
