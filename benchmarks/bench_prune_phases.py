"""Where a pruned step's predicted speedup goes wrong: its phases measured and predicted.

    python -m benchmarks.bench_prune_phases                  # the committed calibrations
    python -m benchmarks.bench_prune_phases --refit          # each folder refitted (bench_refit)
    python -m benchmarks.bench_prune_phases measurements/h200-newuser3 ...

Every speculative run of the folders' documents (executions, calibrate-run.json's own spec runs,
tp > 1 runs) is priced as `spectune check` prices it (spectune.validate.check.price_run: the
StepBreakdown over the measured tree tokens, their spread and the padded draft extend) with the
folder's calibration, committed or (--refit) refitted by benchmarks.bench_refit's fit. Per run
it lists each phase measured / predicted and its share of the step's error, (predicted -
measured) / measured step: draft, verify, draft extend and the rest (tree, accept, compact and
overhead against the breakdown's overhead, retrieval and pruning), then the step, the step
without speculation (AR) and the speedup error. The summary groups runs by kind (pruned:
prune_threshold > 0; echo: a shared budget above batch 1; dense: the others) and batch (1,
8, >= 32): mean and worst |speedup error| and each phase's mean share, so the phase that
carries a kind's error stands out (over every run). A table of the pruned runs and the runs
measured beside them (same document and batch), the summary, then one JSON document on the
last line.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.bench_refit import FOLDERS, ROOT
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.specs.io import loads_json, read_bytes_bounded
from spectune.validate.check import MEASUREMENT_SCHEMA, calibrations_in, price_run
from spectune.validate.fit import fit_calibration
from spectune.validate.measure import RUN_SCHEMA, doc_tp, spec_run_measurements

PHASES = ("draft", "verify", "extend", "rest")
EXTRA_FOLDERS = ("measurements/h200-replan",)  # pruned runs, no calibrate-run.json to refit


def _load(p: Path) -> Any:
    return loads_json(read_bytes_bounded(p), str(p))


def _documents(folder: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """(file name, measurement document) of every measurement and calibration run's spec runs."""
    for p in sorted(folder.glob("*.json")):
        data = _load(p)
        if not isinstance(data, dict):
            continue
        if data.get("schema") == MEASUREMENT_SCHEMA:
            yield p.name, data
        elif data.get("schema") == RUN_SCHEMA:
            for doc in spec_run_measurements(data):
                yield p.name, doc


def _calibration(folder: Path, refit: bool) -> dict[str, Calibration]:
    """hardware -> the folder's committed calibration, or its refit (bench_refit's inputs)."""
    if not refit or not (folder / "calibrate-run.json").is_file():
        return calibrations_in(folder)
    key = str(folder.relative_to(ROOT))
    docs = [_load(folder / name) for name in FOLDERS.get(key, ())]
    cal, _ = fit_calibration(_load(folder / "calibrate-run.json"), docs)
    return {cal.hardware: cal}


def phase_rows(folder: Path, refit: bool = False) -> list[dict[str, Any]]:
    """One row per speculative run of the folder (see the module docstring)."""
    cals = _calibration(folder, refit)
    rows = []
    for name, doc in _documents(folder):
        hw = load_hardware(doc["hardware"])
        cm = CostModel(
            hw,
            load_model(doc["target"]),
            load_model(doc["drafter"]),
            tp=doc_tp(doc, name),
            calibration=cals.get(hw.name),
        )
        planned: dict[str, Any] = {}
        for r in doc["runs"]:
            if r["policy"] is None:
                continue
            step, n = price_run(cm, doc, r, planned)
            ph, b = r["phases_ms"], r["batch"]
            pred = {
                "draft": float(step.draft_s) * 1e3,
                "verify": float(step.verify_s) * 1e3,
                "extend": float(step.extend_s) * 1e3,
                "rest": float(step.overhead_s + step.retrieval_s + step.prune_s) * 1e3,
            }
            meas = {
                "draft": ph["draft"],
                "verify": ph["verify"],
                "extend": ph["extend"],
                "rest": ph["step"] - ph["draft"] - ph["verify"] - ph["extend"],
            }
            total = float(step.total_s) * 1e3
            ar = float(cm.iteration(None, b, doc["context"]).total_s) * 1e3
            pol = r["policy"]
            rows.append({
                "folder": str(folder.relative_to(ROOT)), "file": name, "batch": b,
                "tp": doc_tp(doc, name), "policy": r["label"], "kind": _kind(pol, b),
                "graft": pol["graft_budget"], "tokens": n, "tokens_cv": r.get("verified_cv"),
                "measured_ms": meas, "predicted_ms": pred,
                "share": {k: (pred[k] - meas[k]) / ph["step"] for k in PHASES},
                "step_ms": (ph["step"], total), "ar_ms": (r["ar_step_ms"], ar),
                "speedup_error": r["tokens_per_step"] / total * ar / r["speedup"] - 1.0,
            })  # fmt: skip
    return rows


def _kind(policy: dict[str, Any], batch: int) -> str:
    """pruned (prune_threshold > 0), echo (a shared budget above batch 1: also a ragged
    verify, unpruned) or dense."""
    if policy["prune_threshold"] > 0:
        return "pruned"
    return "echo" if policy.get("shared_budget") and batch > 1 else "dense"


def _group(r: dict[str, Any]) -> str:
    size = "B1" if r["batch"] == 1 else "B8" if r["batch"] < 32 else "B32+"
    return f"{r['kind']} {size}"


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """kind and batch group -> runs, mean and worst |speedup error|, mean share per phase."""
    out: dict[str, dict[str, float]] = {}
    for g in sorted({_group(r) for r in rows}):
        sel = [r for r in rows if _group(r) == g]
        errs = [abs(r["speedup_error"]) for r in sel]
        out[g] = {"runs": len(sel), "mean": sum(errs) / len(errs), "worst": max(errs)}
        for k in PHASES:
            out[g][k] = sum(r["share"][k] for r in sel) / len(sel)
        out[g]["ar"] = sum(r["ar_ms"][1] / r["ar_ms"][0] - 1 for r in sel) / len(sel)
    return out


def _rounded(x: Any) -> Any:
    """x with every float to 5 significant digits (the JSON line stays short)."""
    if isinstance(x, float):
        return float(f"{x:.5g}")
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_rounded(v) for v in x]
    return x


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("folders", nargs="*", help="folders (default: bench_refit's and h200-replan)")
    p.add_argument("--refit", action="store_true", help="refit each folder's calibrate-run.json")
    args = p.parse_args(argv)
    folders = args.folders or [*FOLDERS, *EXTRA_FOLDERS]
    rows: list[dict[str, Any]] = []
    for f in folders:
        rows += phase_rows(ROOT / f, args.refit)
    print(
        f"calibration: {'refitted' if args.refit else 'committed'}; phase cells: measured / "
        "predicted ms (share of the step error); rest: tree + accept + compact + overhead"
    )
    print(
        f"{'folder':<26} {'file':<16} {'B':>3} {'policy':<24} {'N':>5} {'cv':>4} "
        + " ".join(f"{k:>19}" for k in PHASES)
        + f" {'step':>15} {'AR':>7} {'speedup':>7}"
    )
    # pruned runs and the runs beside them (same document and batch): pruned vs dense
    beside = {(r["folder"], r["file"], r["batch"]) for r in rows if r["kind"] == "pruned"}
    shown = [r for r in rows if (r["folder"], r["file"], r["batch"]) in beside]
    for r in shown:
        cells = " ".join(
            f"{r['measured_ms'][k]:>6.2f}/{r['predicted_ms'][k]:<6.2f}({r['share'][k]:+5.1%})"
            for k in PHASES
        )
        cv = "-" if r["tokens_cv"] is None else f"{r['tokens_cv']:.2f}"
        step, ar = r["step_ms"], r["ar_ms"]
        print(
            f"{r['folder'][-26:]:<26} {r['file'][:16]:<16} {r['batch']:>3} {r['policy'][:24]:<24} "
            f"{r['tokens']:>5.1f} {cv:>4} {cells} {step[0]:>7.2f}/{step[1]:<7.2f} "
            f"{ar[1] / ar[0] - 1:>+7.1%} {r['speedup_error']:>+7.1%}"
        )
    s = summary(rows)
    print("\nsummary: |speedup error| mean / worst; mean share of the step error per phase; AR")
    for g, v in s.items():
        shares = " ".join(f"{k} {v[k]:+5.1%}" for k in PHASES)
        print(
            f"  {g:<12} {int(v['runs']):>4} runs  {v['mean']:5.1%} / {v['worst']:5.1%}  "
            f"{shares}  AR {v['ar']:+5.1%}"
        )
    keys = ("folder", "file", "batch", "policy", "kind", "tokens", "tokens_cv", "share",
            "speedup_error")  # fmt: skip
    compact = [_rounded({k: r[k] for k in keys}) for r in shown]
    print(json.dumps({"refit": args.refit, "summary": _rounded(s), "rows": compact}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
