"""Pruned trees on the GPU: dense dynamic top-k 6/10/32 against the same tree with dynamic-depth
pruning (prune_threshold 0.02 and 0.05), Llama-3.1-8B + its EAGLE-3 head at real shape,
context 4096, batch 1, 8, 32, 64; each against the no-speculation baseline at the same batch.

    PYTHONUNBUFFERED=1 python benchmarks/bench_executor_prune.py --out $OUT [--steps 20]
        [--calibration measurements/h200-rerun/calibration-h200.json]

A pruned run verifies only the kept nodes (a ragged batch of T = sum of kept tokens, padded to
a multiple of 16 per CUDA graph), so its verify time should follow the mean kept tokens that the
planner's cost model prices. For every run the script prints the measured speedup beside two
predictions: the planner's (closed-form objective: acceptance-model expected tokens, planner
tree size) and the check's (`spectune check`: the measured tokens per step and measured mean
verified tokens, so it tests the timing model alone), and the planner's vs the measured mean
verified tokens per sequence.

Writes under --out: measurement-prune.json (spectune.measurement/v1, `verified_mean` per run),
the calibration used (copied, so `spectune check $OUT` re-predicts the same numbers) and
prune-summary.json. Prints a table, then one JSON line. About 2-3 minutes on an H100/H200
(session start and GEMM autotune ~40 s, 12 runs + 4 baselines of --steps steps each).
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch

from spectune.executor.session import Session, SessionConfig, measure_runs
from spectune.planner.acceptance import acceptance_model
from spectune.planner.objective import closed_form_objective
from spectune.specs import TreePolicy, load_model, write_json_atomic
from spectune.specs.calibration import Calibration
from spectune.validate.check import check_folder
from spectune.validate.measure import (
    format_table,
    gpu_hardware_name,
    measurement_doc,
    script_command,
)

DENSE = TreePolicy("dynamic-topk", 6, 10, 32)
THRESHOLDS = (0.02, 0.05)


def _calibration(path: str | None, hardware: str) -> Path | None:
    """The calibration to predict with: the one given, else the newest committed for this GPU."""
    if path:
        return Path(path)
    root = Path(__file__).resolve().parent.parent / "measurements"
    for folder in (f"{hardware}-rerun", hardware):
        cand = root / folder / f"calibration-{hardware}.json"
        if cand.is_file():
            return cand
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workload", default="mt-bench")
    ap.add_argument("--calibration", default=None, help="calibration JSON (default: committed)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev)
    hw = gpu_hardware_name(gpu)
    target, drafter = load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
    batches = [int(b) for b in args.batches.split(",")]
    cfg = SessionConfig(max_batch=max(batches), max_context=args.context, max_tree=DENSE.budget)
    session = Session(target, drafter, cfg, dev)
    print(
        f"{gpu} ({hw}); session up in {time.time() - t0:.1f} s; attention: "
        f"{session.attention_backend}",
        flush=True,
    )
    policies = {"dense": DENSE}
    for p in THRESHOLDS:
        policies[f"p{p:g}"] = TreePolicy("dynamic-topk", 6, 10, 32, p)
    runs: list[tuple[int, TreePolicy | None, str]] = [
        (b, pol, label) for b in batches for label, pol in policies.items()
    ]
    acc = acceptance_model(args.workload)
    recs = measure_runs(session, runs, args.context, acc, args.steps, keep_going=True)
    print(f"runs done at {time.time() - t0:.0f} s", flush=True)
    mdoc = measurement_doc(
        gpu=gpu,
        hardware=hw,
        target=target.name,
        drafter=drafter.name,
        workload=args.workload,
        context=args.context,
        steps=args.steps,
        attention=session.attention_backend,
        runs=recs,
        extra={"command": script_command("benchmarks/bench_executor_prune.py", vars(args))},
    )
    write_json_atomic(out / "measurement-prune.json", mdoc)

    # ---- predictions -------------------------------------------------------------------------
    cal_path = _calibration(args.calibration, hw)
    cal = Calibration.load(cal_path) if cal_path else None
    if cal_path is not None:
        shutil.copyfile(cal_path, out / cal_path.name)
    checked = {r.what: r for r in check_folder(out).speedup}
    planner = closed_form_objective(
        target.name, drafter.name, hw, args.workload, calibration=cal, turnover=False
    )
    rows = []
    for r in recs:
        pol = TreePolicy(**r["policy"])
        b = r["batch"]
        plan_speedup = planner(pol, b, args.context) / planner(None, b, args.context)
        label = f"B={b} {r['label']} {pol.depth}/{pol.topk}/{pol.budget}"
        if pol.prune_threshold > 0:
            label += f"/p{pol.prune_threshold:g}"
        check_row = checked.get(f"speedup {label}")
        rows.append(
            {
                "batch": b,
                "label": r["label"],
                "prune_threshold": pol.prune_threshold,
                "verified_mean": r["verified_mean"],
                "planner_tree_tokens": planner.tree_tokens(pol),
                "tokens_per_step": r["tokens_per_step"],
                "planner_tokens_per_step": planner.expected_tokens(pol),
                "verify_ms": r["phases_ms"]["verify"],
                "step_ms": r["phases_ms"]["step"],
                "speedup": r["speedup"],
                "predicted_speedup_planner": plan_speedup,
                "predicted_speedup_check": check_row.predicted if check_row else None,
            }
        )
    summary = {
        "gpu": gpu,
        "hardware": hw,
        "calibration": str(cal_path) if cal_path else None,
        "context": args.context,
        "steps": args.steps,
        "rows": rows,
        "seconds": time.time() - t0,
    }
    write_json_atomic(out / "prune-summary.json", summary)
    print(format_table(mdoc))
    print(
        f"{'batch':>5} {'policy':<8} {'N meas':>7} {'N plan':>7} {'tok/st':>6} {'plan':>5} "
        f"{'verify':>7} {'step':>7} {'speedup':>7} {'pred(plan)':>10} {'pred(check)':>11}"
    )
    for x in rows:
        pc = x["predicted_speedup_check"]
        print(
            f"{x['batch']:>5} {x['label']:<8} {x['verified_mean']:>7.2f} "
            f"{x['planner_tree_tokens']:>7.2f} {x['tokens_per_step']:>6.2f} "
            f"{x['planner_tokens_per_step']:>5.2f} {x['verify_ms']:>7.2f} {x['step_ms']:>7.2f} "
            f"{x['speedup']:>7.2f} {x['predicted_speedup_planner']:>10.2f} "
            f"{'-' if pc is None else f'{pc:.2f}':>11}"
        )
    print(f"total {time.time() - t0:.0f} s")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
