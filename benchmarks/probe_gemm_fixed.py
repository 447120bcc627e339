"""The per-GEMM fixed cost the fit holds (validate.fit.gemm_stream_line's intercept): with and without it (CPU)

    python -m benchmarks.probe_gemm_fixed                      # every folder of bench_refit
    python -m benchmarks.probe_gemm_fixed benchmarks/results/tp_h100x2_b

A one-GPU calibration cannot tell a weight GEMM's fixed time (ramp, tail, split-K reduce) from
its weight bandwidth: every one-GPU forward of the target runs the same kernels. Tensor
parallelism halves the bytes but not the kernels, so a fit that folds the fixed part into
weight_bw_efficiency prices the shard low. The GEMM micro-benchmarks `spectune calibrate` times
on one GPU separate them (the intercept of time vs bytes at M <= 64), and the fit holds
gemm_fixed_s there; operators.gemm_time charges it to the weight stream only:
max(compute, memory + gemm_fixed_s).

Each folder is refitted twice (bench_refit.refit's way: calibrate-run.json + the one-GPU
documents; nothing at tp > 1 enters), without the term (hold_gemm_fixed=False: gemm_fixed_s 0)
and with it, and re-checked. It prints, per folder and file, verify MAPE and worst (mean)
speedup error of both, then the shard compute (verify-tp*.json "seconds_nocomm") priced without
its collectives, then one JSON document.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_refit import FOLDERS, ROOT, _cell, _load, _per_file, check_with
from spectune.planner.costmodel import CostModel
from spectune.specs import ModelSpec, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.fit import fit_calibration


def shard_model(spec: ModelSpec, tp: int) -> ModelSpec:
    """The shape one rank of a split forward computes, as a one-GPU model: heads, KV heads,
    ffn and vocabulary divided by tp (executor.tp.shard_spec, with the LM head's split)."""
    return dataclasses.replace(
        spec,
        heads=spec.heads // tp,
        kv_heads=spec.kv_heads // tp,
        ffn=spec.ffn // tp,
        vocab=spec.vocab // tp,
    )


def shard_time(cm: CostModel, tp: int, batch: int, tokens: int, context: int) -> float:
    """Seconds of one rank's compute in a forward of cm's target split over tp GPUs (a split
    run's "seconds_nocomm"): the one-GPU forward of the shard's shape (shard_model), so no
    collectives, no layout copy of gathered logits, and the logits pass over this rank's
    vocabulary share."""
    one = CostModel(cm.hardware, shard_model(cm.target, tp), cm.drafter, calibration=cm.calibration)
    return float(np.asarray(one.verify_time(batch, tokens, context)).reshape(-1)[0])


def shard_errors(src: Path, cal: Calibration) -> dict[str, list[float]]:
    """verify-tp*.json -> the relative error of each row's shard compute (shard_time) against
    "seconds_nocomm"."""
    out: dict[str, list[float]] = {}
    for p in sorted(src.glob("verify-tp*.json")):
        doc = _load(p)
        hw = load_hardware(doc["hardware"])
        cm = CostModel(hw, load_model(doc["target"]), load_model(doc["drafter"]), calibration=cal)
        out[p.name] = [
            shard_time(cm, doc["tp"], row["batch"], row["tokens"], row["context"])
            / row["seconds_nocomm"]
            - 1
            for row in doc["verify"]
        ]
    return out


def variant(folder: str, extra: tuple[str, ...], hold: bool) -> dict[str, Any]:
    src = ROOT / folder
    run = _load(src / "calibrate-run.json")
    docs = [_load(src / name) for name in extra]
    cal, report = fit_calibration(run, docs, hold_gemm_fixed=hold)
    res = check_with(src, cal)
    return {
        "folder": folder,
        "held": hold,
        "gemm_fixed_us": cal.gemm_fixed_s * 1e6,
        "weight_bw_efficiency": cal.weight_bw_efficiency,
        "params": report["params"],
        "verify_mape": res.verify_mape,
        "worst": res.worst_speedup_error,
        "files": _per_file(res),
        "shard": shard_errors(src, cal),
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", help="folders of bench_refit (default: all)")
    args = ap.parse_args(argv)
    folders = {f: FOLDERS.get(f, ()) for f in args.folders} if args.folders else FOLDERS
    results = []
    print("per file: verify MAPE, worst (mean) |speedup error|; refit without -> with the term")
    for folder, extra in folders.items():
        a = variant(folder, extra, False)
        b = variant(folder, extra, True)
        results.extend([a, b])
        print(
            f"{folder}: gemm_fixed {b['gemm_fixed_us']:.2f} us, weight_bw_efficiency "
            f"{a['weight_bw_efficiency']:.3f} -> {b['weight_bw_efficiency']:.3f}; verify MAPE "
            f"{100 * a['verify_mape']:.2f}% -> {100 * b['verify_mape']:.2f}%, worst speedup "
            f"error {100 * a['worst']:.1f}% -> {100 * b['worst']:.1f}%"
        )
        for name in sorted(b["files"]):
            print(f"  {name:<28} {_cell(a['files'].get(name, {}))}  ->  {_cell(b['files'][name])}")
        for name, errs in b["shard"].items():
            mape = [float(np.mean(np.abs(x["shard"][name]))) for x in (a, b)]
            print(
                f"  {name} shard compute MAPE {100 * mape[0]:.2f}% -> {100 * mape[1]:.2f}% "
                f"(rows: {' '.join(f'{100 * e:+.1f}' for e in errs)})"
            )
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
