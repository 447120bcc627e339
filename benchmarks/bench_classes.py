"""How the cost model splits a forward against how the GPU did, class by class (CPU).

    python -m benchmarks.bench_classes                              # measurements/h100-newuser5
    python -m benchmarks.bench_classes measurements/h100-newuser5 ...

For every verify-grid row of a folder's calibrate-run.json that carries its kernel time by
class (`spectune calibrate --kernel-classes`: linear_s = weight GEMMs + logits, attention_s =
tree attention + merges; other = the rest of the forward's time), the folder's calibration
prices the same forward (CostModel.verify_breakdown: linear = qkv_o + mlp + lm_head, attention,
other = elementwise + launches) and the table gives each class measured / priced, beside the
kernels per forward the profile counted and the cost model's count. The fit reports these
classes (validate.fit.CLASS_PARTS) but does not fit them; this table is where a change that
would let it starts. Prints the table, then one JSON document on its last line.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.specs.io import loads_json, read_bytes_bounded
from spectune.validate.check import calibrations_in
from spectune.validate.fit import CLASS_PARTS

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ("measurements/h100-newuser5",)
PROBE_LAUNCH_S = 1e-6  # a launch cost that makes the breakdown's "launch" count the kernels


def _parts(cm: CostModel, r: dict[str, Any]) -> dict[str, float]:
    p = cm.verify_breakdown(r["batch"], r["tokens"], r["context"])
    return {
        kind.removeprefix("verify_"): float(sum(np.asarray(p[c]) for c in cols))
        for kind, cols in CLASS_PARTS.items()
    }


def folder_rows(folder: Path) -> list[dict[str, Any]]:
    run = loads_json(read_bytes_bounded(folder / "calibrate-run.json"), str(folder))
    cal = calibrations_in(folder)[run["hardware"]]
    hw, target, drafter = (
        load_hardware(run["hardware"]),
        load_model(run["target"]),
        load_model(run["drafter"]),
    )
    cm = CostModel(hw, target, drafter, calibration=cal)
    counter = CostModel(
        hw, target, drafter, calibration=dataclasses.replace(cal, launch_s=PROBE_LAUNCH_S)
    )
    out = []
    for r in run.get("verify", []):
        if "linear_s" not in r or "attention_s" not in r:
            continue
        meas = {
            "linear": r["linear_s"],
            "attention": r["attention_s"],
            "other": r["seconds"] - r["linear_s"] - r["attention_s"],
        }
        kernels = float(
            np.asarray(counter.verify_breakdown(r["batch"], r["tokens"], r["context"])["launch"])
        )
        out.append({
            "folder": str(folder), "batch": r["batch"], "tokens": r["tokens"],
            "context": r["context"], "seconds": r["seconds"],
            "priced_s": float(np.asarray(cm.verify_time(r["batch"], r["tokens"], r["context"]))),
            "measured": meas, "priced": _parts(cm, r),
            "kernels": r.get("kernels"), "model_kernels": round(kernels / PROBE_LAUNCH_S),
        })  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    folders = [ROOT / f for f in (argv or DEFAULT)]
    rows = [row for f in folders for row in folder_rows(f)]
    if not rows:
        print("no verify rows with kernel time by class (spectune calibrate --kernel-classes)")
        return 1
    print("ms measured / priced (error) per class; kernels per forward: profiled / cost model")
    print(f"{'B':>3} {'N':>4} {'C':>5} {'forward':>22} {'linear':>24} {'attention':>22} "
          f"{'other':>22} {'kernels':>9}")  # fmt: skip
    errs: dict[str, list[float]] = {"forward": [], "linear": [], "attention": [], "other": []}
    for r in rows:
        cells = []
        for k, m, p in (
            ("forward", r["seconds"], r["priced_s"]),
            *((k, r["measured"][k], r["priced"][k]) for k in ("linear", "attention", "other")),
        ):
            e = p / m - 1 if m > 0 else float("nan")
            errs[k].append(abs(e))
            cells.append(f"{m * 1e3:7.3f}/{p * 1e3:7.3f} ({e:+5.0%})")
        print(f"{r['batch']:>3} {r['tokens']:>4} {r['context']:>5} {cells[0]:>22} {cells[1]:>24} "
              f"{cells[2]:>22} {cells[3]:>22} {r['kernels'] or 0:>4.0f}/{r['model_kernels']:<4}")  # fmt: skip
    summary = {k: float(np.nanmean(v)) for k, v in errs.items()}
    print("MAPE: " + ", ".join(f"{k} {v:.1%}" for k, v in summary.items()))
    print(json.dumps({"bench": "classes", "mape": summary, "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
