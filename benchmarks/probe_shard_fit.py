"""A TP folder refitted with its split forwards' compute as fit rows, and re-checked (CPU)

    python -m benchmarks.probe_shard_fit                         # the TP folders below
    python -m benchmarks.probe_shard_fit --tp 2 --weight 1 benchmarks/results/tp_h100x2_c

One GPU's forwards leave the split between the replicated kernels (norms, residuals, the
logits pass) and the sharded ones (weight GEMMs, attention) to the fit: the one-GPU rows are
priced right whichever way it trades them, and a tp > 1 forward, which halves only the sharded
part, is then priced off. A split run times each verify-grid point also without its
collectives ("seconds_nocomm" of verify-tpN.json): what one rank computes, which is the
forward of the shard's shape on one GPU (heads, KV heads, ffn and vocabulary divided by tp;
that shape could be timed on a one-GPU host just as well).

Per folder and `--weight` (0 = bench_refit's fit: calibrate-run.json + the one-GPU
measurement documents), the fit also takes those rows, priced by a one-GPU CostModel of the
shard's shape (no collectives); the folder is then re-checked with the in-forward all-reduce
offset of `spectune calibrate --tp` applied (probe_allreduce_offset.offsets), as a TP user's
calibration is. It prints the fitted efficiencies and, per file, verify MAPE and worst (mean)
speedup error, then one JSON document. The split grids are in sample at weight > 0; the
executions (execute-tpN.json) never are.

The fit's row list and pricing are patched in this process only (validate.fit._rows and
predict_row), as benchmarks/bench_step_bias.py patches its variants.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import spectune.validate.fit as fit
from benchmarks.bench_refit import FOLDERS, ROOT, _cell, _load, _per_file, check_with
from benchmarks.probe_allreduce_offset import offsets
from benchmarks.probe_gemm_fixed import shard_time
from spectune.planner.costmodel import CostModel
from spectune.specs import load_model

DEFAULT = (
    "benchmarks/results/tp_h100x2_c",
    "benchmarks/results/tp_h200x4_b",
    "measurements/h200x4-tp",
)
KIND = "verify_shard"


def shard_rows(folder: Path, tps: set[int]) -> list[tuple[str, dict[str, Any], float]]:
    """(KIND, arguments, seconds) of every verify-tpN.json point timed without collectives."""
    rows = []
    for vf in sorted(folder.glob("verify-tp*.json")):
        doc = _load(vf)
        if int(doc["tp"]) not in tps:
            continue
        for r in doc["verify"]:
            if "seconds_nocomm" in r:
                args = {"batch": r["batch"], "tokens": r["tokens"], "context": r["context"],
                        "tp": int(doc["tp"]), "target": doc["target"]}  # fmt: skip
                rows.append((KIND, args, float(r["seconds_nocomm"])))
    return rows


def patch(extra: list[tuple[str, dict[str, Any], float]], weight: float) -> None:
    """Make validate.fit take `extra` rows at `weight`, each priced as its shard's one-GPU
    forward (probe_gemm_fixed.shard_time) with the calibration being fitted."""
    rows, predict = fit._rows, fit.predict_row

    def _rows(run: dict[str, Any], measurements: Any) -> list[tuple[str, dict[str, Any], float]]:
        return rows(run, measurements) + extra

    def predict_row(cm: Any, kind: str, a: dict[str, Any]) -> float:
        if kind != KIND:
            return predict(cm, kind, a)
        full = CostModel(
            cm.hardware, load_model(a["target"]), cm.drafter, calibration=cm.calibration
        )
        return shard_time(full, a["tp"], a["batch"], a["tokens"], a["context"])

    fit._rows = _rows
    fit.predict_row = predict_row
    fit.WEIGHTS[KIND] = weight


def probe(folder: str, weight: float, tps: set[int]) -> dict[str, Any]:
    src = ROOT / folder
    saved = fit._rows, fit.predict_row, dict(fit.WEIGHTS)
    try:
        patch(shard_rows(src, tps) if weight > 0 else [], weight)
        docs = [_load(src / name) for name in FOLDERS.get(folder, ())]
        cal, report = fit.fit_calibration(_load(src / "calibrate-run.json"), docs)
    finally:
        fit._rows, fit.predict_row = saved[0], saved[1]
        fit.WEIGHTS.clear()
        fit.WEIGHTS.update(saved[2])
    moved, offs = offsets(src, cal)
    return {
        "folder": folder,
        "weight": weight,
        "params": report["params"],
        "mape_shard_after": report.get(f"mape_{KIND}_after"),
        "offset_s": offs,
        "files": _per_file(check_with(src, moved)),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", default=list(DEFAULT))
    ap.add_argument("--weight", type=float, action="append",
                    help="weights of the shard rows to try (repeatable; default 0 and 1)")  # fmt: skip
    ap.add_argument("--tp", default="2,4", help="the split grids that join the fit (default 2,4)")
    args = ap.parse_args(argv)
    tps = {int(t) for t in args.tp.split(",")}
    out = []
    for folder in args.folders:
        for w in args.weight or [0.0, 1.0]:
            r = probe(folder, w, tps)
            out.append(r)
            p = r["params"]
            shard = r["mape_shard_after"]
            print(
                f"{folder} weight {w:g} (tp {args.tp}): weight_bw {p['weight_bw_efficiency']:.3f}"
                f" elementwise {p['elementwise_bw_efficiency']:.3f} gemm_emax {p['gemm_emax']:.3f}"
                f" attention_flops {p['attention_flops_efficiency']:.3f}"
                + ("" if shard is None else f"; shard rows {100 * shard:.2f}%")
            )
            for name, f in sorted(r["files"].items()):
                print(f"  {name:<24} {_cell(f)}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
