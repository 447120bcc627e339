"""`spectune cost`: price target verify passes, drafter steps and plain decode steps on a GPU.

Every combination of --batch x --tokens x --context gives one row. With --json the output is
exactly {"rows": [{"batch", "tokens", "context", "verify_s", "draft_step_s", "ar_step_s",
"breakdown": {class: seconds}}]}; other tools read that shape. With --intermediate (hierarchical
drafting's intermediate model) each row also has "intermediate_verify_s": one intermediate
forward over the same shape, what a hierarchical round pays to verify the drafter's tree.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from typing import Any

import numpy as np

from spectune.cli.common import add_intermediate, int_range, ints, json_text
from spectune.cli.outputs import add_csv_plot, check_csv_plot, write_outputs
from spectune.planner.costmodel import BREAKDOWN_KEYS, CostModel
from spectune.specs import Calibration, SpecError, load_hardware, load_model
from spectune.specs.compat import check_intermediate, check_pair

MS = 1e3  # milliseconds per second, for the table


def build_rows(
    cm: CostModel, batch: list[int], tokens: list[int], context: list[int]
) -> list[dict[str, Any]]:
    """One row per (batch, tokens, context), all priced in one vectorised call per method."""
    grid = np.array(list(itertools.product(batch, tokens, context)), dtype=np.float64)
    b, n, c = grid[:, 0], grid[:, 1], grid[:, 2]
    parts = cm.verify_breakdown(b, n, c)
    verify = np.sum(np.stack([parts[k] for k in BREAKDOWN_KEYS]), axis=0)
    draft = cm.draft_step_time(b, n, c)
    ar = cm.iteration(None, b, c).total_s
    inter = cm.intermediate_verify_time(b, n, c) if cm.intermediate is not None else None
    rows = []
    for i in range(grid.shape[0]):
        extra = {} if inter is None else {"intermediate_verify_s": float(inter[i])}
        rows.append(
            {
                "batch": int(b[i]),
                "tokens": int(n[i]),
                "context": int(c[i]),
                "verify_s": float(verify[i]),
                "draft_step_s": float(draft[i]),
                "ar_step_s": float(ar[i]),
                "breakdown": {k: float(parts[k][i]) for k in BREAKDOWN_KEYS},
                **extra,
            }
        )
    return rows


def _print_table(cm: CostModel, rows: list[dict[str, Any]]) -> None:
    drafter = cm.drafter.name if cm.drafter else "none"
    if cm.intermediate is not None:
        drafter += f", intermediate {cm.intermediate.name}"
    print(
        f"{cm.target.name} (drafter {drafter}) on {cm.tp} x {cm.hardware.name}; "
        f"memory floor {cm.memory_floor_time() * MS:.3f} ms, "
        f"GEMM knee ~{cm.knee_tokens():.0f} tokens/pass; times in ms, x_floor = verify / floor"
    )
    floor = cm.memory_floor_time()
    head = ["batch", "tokens", "context", "verify", "x_floor", "draft_step", "ar_step"]
    inter = ["int_verify"] if cm.intermediate is not None else []
    print(" ".join(f"{h:>11}" for h in [*head, *inter, *BREAKDOWN_KEYS]))
    for r in rows:
        cells = [str(r["batch"]), str(r["tokens"]), str(r["context"])]
        cells += [f"{r['verify_s'] * MS:.3f}", f"{r['verify_s'] / floor:.2f}"]
        cells += [f"{r[k] * MS:.3f}" for k in ("draft_step_s", "ar_step_s")]
        cells += [f"{r['intermediate_verify_s'] * MS:.3f}" for _ in inter]
        cells += [f"{r['breakdown'][k] * MS:.3f}" for k in BREAKDOWN_KEYS]
        print(" ".join(f"{c:>11}" for c in cells))


def run(args: argparse.Namespace) -> int:
    check_csv_plot(args)
    hardware = load_hardware(args.gpu)
    target = load_model(args.target)
    drafter = None if args.drafter.lower() == "none" else load_model(args.drafter)
    calibration = Calibration.load(args.calibration) if args.calibration else None
    if args.tp < 1:
        raise SpecError(f"--tp must be a positive integer, got {args.tp}")
    check_pair(target, drafter)
    inter = load_model(args.intermediate) if args.intermediate else None
    inter_drafter = load_model(args.intermediate_drafter) if args.intermediate_drafter else None
    if inter_drafter is not None and inter is None:
        raise SpecError("--intermediate-drafter needs --intermediate")
    if inter is not None:
        check_intermediate(target, inter, inter_drafter or drafter)
    cm = CostModel(
        hardware,
        target,
        drafter,
        tp=args.tp,
        calibration=calibration,
        intermediate=inter,
        intermediate_drafter=inter_drafter,
    )
    rows = build_rows(cm, args.batch, args.tokens, args.context)
    if args.json:
        print(json_text({"rows": rows}))
    else:
        _print_table(cm, rows)
    write_outputs(
        args,
        [csv_row(r) for r in rows],
        draw_costs(rows),
        title=f"{cm.target.name} on {cm.tp} x {cm.hardware.name}: one verify pass",
        xlabel="tree tokens per sequence",
        ylabel="verify pass, ms",
        out=sys.stderr if args.json else None,
    )
    return 0


def csv_row(r: dict[str, Any]) -> dict[str, Any]:
    """A row of the table, its breakdown flattened (seconds)."""
    flat = {k: v for k, v in r.items() if k != "breakdown"}
    flat.update({f"verify_{k}_s": v for k, v in r["breakdown"].items()})
    return flat


def draw_costs(rows: list[dict[str, Any]]) -> Any:
    """Verify-pass time against tree tokens per sequence, one line per (batch, context)."""

    def draw(ax: Any) -> None:
        for batch, context in dict.fromkeys((r["batch"], r["context"]) for r in rows):
            rs = [r for r in rows if r["batch"] == batch and r["context"] == context]
            ax.plot(
                [r["tokens"] for r in rs],
                [r["verify_s"] * MS for r in rs],
                "o-",
                label=f"batch {batch}, context {context}",
            )
        ax.set_xscale("log", base=2)

    return draw


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "cost",
        help="roofline times of verify, draft and decode steps",
        description="Price one target verify pass (batch x tokens tree tokens per sequence over "
        "context cached tokens), one drafter step over the same shape, and one plain decode "
        "step, with the verify breakdown by operator class.",
    )
    p.add_argument("--target", default="llama-3.1-8b", help="target model preset or JSON/TOML path")
    p.add_argument(
        "--drafter",
        default="eagle3-llama-3.1-8b",
        help="drafter preset or path (EAGLE-3 head or a draft model); 'none' for no model drafter",
    )
    add_intermediate(p)
    p.add_argument("--gpu", default="h100-sxm", help="GPU preset or JSON/TOML path")
    p.add_argument("--tp", type=int_range(1, 64), default=1, help="tensor-parallel GPUs")
    p.add_argument(
        "--batch", type=ints(1, 1 << 16), default=[1, 8, 64], help="batch sizes, e.g. 1,8,64"
    )
    p.add_argument(
        "--tokens",
        type=ints(1, 1 << 16),
        default=[1, 16, 64],
        help="tree tokens per sequence, e.g. 1,16,64",
    )
    p.add_argument(
        "--context", type=ints(0, 1 << 24), default=[4096], help="cached tokens per sequence"
    )
    p.add_argument(
        "--calibration",
        default=None,
        help="calibration JSON/TOML (spectune calibrate; default: none, the preset efficiencies)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_csv_plot(p, "the rows (seconds)")
    p.set_defaults(func=run)
