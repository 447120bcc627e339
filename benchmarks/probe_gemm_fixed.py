"""Does a per-GEMM fixed cost explain why tp 2 forwards of Llama-3.1-8B are priced low? (CPU)

    python -m benchmarks.probe_gemm_fixed                      # every folder of bench_refit
    python -m benchmarks.probe_gemm_fixed --form stream benchmarks/results/tp_h100x2_b

A one-GPU calibration cannot tell a weight GEMM's fixed time (ramp, tail, split-K reduce) from
its weight bandwidth: every one-GPU forward of the target runs the same kernels, so the fit
puts Calibration.launch_s and gemm_fixed_s at 0 and folds the fixed part into
weight_bw_efficiency. Tensor parallelism halves the bytes but not the kernels, so the folded
part is halved too and the shard is priced low. The GEMM micro-benchmarks `spectune calibrate`
already times on one GPU (five weight shapes of the target, back to back in a CUDA graph) do
separate them: at every M <= 64, time vs weight bytes over the shapes is a line whose intercept
is the fixed part (`micro_intercept`).

Each variant refits every folder (bench_refit.refit's way: calibrate-run.json + the one-GPU
documents; nothing at tp > 1 enters) with gemm_fixed_s held at that intercept, and re-checks
the folder:
- form 'add' (operators.gemm_time as it is): max(compute, memory) + gemm_fixed_s;
- form 'stream': max(compute, memory + gemm_fixed_s), the fixed part paid by the weight
  stream only (this probe swaps operators.gemm_time for the run; the library is unchanged).
It prints, per folder and file, verify MAPE and worst (mean) speedup error beside the refit
without the term, then the shard compute (verify-tp*.json "seconds_nocomm") priced without
its collectives, then one JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_refit import FOLDERS, ROOT, _cell, _load, _per_file, check_with
from spectune.planner import forward, operators
from spectune.planner.costmodel import CostModel
from spectune.planner.operators import ACT_BYTES, LOGIT_BYTES, elementwise_time
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.fit import fit_calibration

#: largest M whose micro-benchmark rows stream weights (below the ridge on H100/H200)
STREAM_M = 64


def micro_intercept(run: dict[str, Any]) -> float:
    """Median over M <= STREAM_M of the intercept of GEMM seconds vs bytes (N*K*2 weights +
    M*(N+K)*2 activations) over the run's weight shapes, s."""
    rows = [g for g in run.get("gemm", []) if g["m"] <= STREAM_M]
    out = []
    for m in sorted({g["m"] for g in rows}):
        at = [g for g in rows if g["m"] == m]
        if len(at) < 2:
            continue
        b = np.array([(g["n"] * g["k"] + m * (g["n"] + g["k"])) * ACT_BYTES for g in at], float)
        t = np.array([g["seconds"] for g in at])
        coef = np.polyfit(b, t, 1)
        out.append(float(coef[1]))
    if not out:
        raise ValueError("calibrate-run.json has no GEMM rows at M <= 64 of two shapes")
    return float(np.median(out))


@contextlib.contextmanager
def stream_form() -> Iterator[None]:
    """operators.gemm_time (and forward's reference) as max(compute, memory + gemm_fixed_s)."""
    orig = operators.gemm_time

    def gemm_time(r: Any, m: Any, n: float, k: float, fmt: Any) -> Any:
        m = np.asarray(m, dtype=np.float64)
        m_eff = operators.gemm_effective_rows(r, m, n, fmt.tile_m)
        flops = operators.FLOPS_PER_MAC * m_eff * n * k
        compute = flops / (fmt.peak_flops * r.gemm_eff(m_eff) * fmt.flops_scale)
        bytes_ = n * k * fmt.weight_bytes + m * (k + n) * ACT_BYTES
        memory = bytes_ / (r.weight_bytes_per_s * fmt.bw_scale) + r.gemm_fixed_s
        return np.where(m > 0, np.maximum(compute, memory), 0.0)

    operators.gemm_time = gemm_time  # type: ignore[assignment]
    forward.gemm_time = gemm_time  # type: ignore[assignment]
    try:
        yield
    finally:
        operators.gemm_time = orig  # type: ignore[assignment]
        forward.gemm_time = orig  # type: ignore[assignment]


def shard_errors(src: Path, cal: Calibration) -> dict[str, list[float]]:
    """verify-tp*.json -> the relative error of each row's shard compute: the tp forward's
    price less its collectives ('comm'), their launches (2 per layer + the gather), the
    gathered logits' layout copy and the logits pass beyond this rank's vocabulary share,
    against "seconds_nocomm"."""
    out: dict[str, list[float]] = {}
    for p in sorted(src.glob("verify-tp*.json")):
        doc = _load(p)
        hw = load_hardware(doc["hardware"])
        target = load_model(doc["target"])
        cm = CostModel(hw, target, load_model(doc["drafter"]), calibration=cal, tp=doc["tp"])
        r = cm.rates
        errs = []
        for row in doc["verify"]:
            b, n, c = row["batch"], row["tokens"], row["context"]
            parts = cm.verify_breakdown(b, n, c)
            total = sum(float(np.asarray(v).reshape(-1)[0]) for v in parts.values())
            lm = float(cm._graph_batch(np.asarray(float(b)))[0]) * n
            v = target.lm_vocab
            total -= float(np.asarray(parts["comm"]).reshape(-1)[0])
            total -= (2 * target.layers + 1) * r.launch_s
            total -= float(elementwise_time(r, 2 * lm * v * ACT_BYTES))
            total -= float(elementwise_time(r, 2 * lm * v * LOGIT_BYTES)) * (1 - 1 / cm.tp)
            errs.append(total / row["seconds_nocomm"] - 1)
        out[p.name] = errs
    return out


def variant(folder: str, extra: tuple[str, ...], form: str) -> dict[str, Any]:
    src = ROOT / folder
    run = _load(src / "calibrate-run.json")
    docs = [_load(src / name) for name in extra]
    fixed = 0.0 if form == "none" else micro_intercept(run)
    ctx = stream_form() if form == "stream" else contextlib.nullcontext()
    with ctx:
        cal, report = fit_calibration(run, docs, base=Calibration(gemm_fixed_s=fixed))
        res = check_with(src, cal)
        shard = shard_errors(src, cal)
    return {
        "folder": folder,
        "form": form,
        "gemm_fixed_us": fixed * 1e6,
        "weight_bw_efficiency": cal.weight_bw_efficiency,
        "params": report["params"],
        "verify_mape": res.verify_mape,
        "worst": res.worst_speedup_error,
        "files": _per_file(res),
        "shard": shard,
    }


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folders", nargs="*", help="folders of bench_refit (default: all)")
    ap.add_argument("--form", choices=("add", "stream"), default="stream")
    args = ap.parse_args(argv)
    folders = {f: FOLDERS.get(f, ()) for f in args.folders} if args.folders else FOLDERS
    results = []
    print("per file: verify MAPE, worst (mean) |speedup error|; refit without -> with the term")
    for folder, extra in folders.items():
        a = variant(folder, extra, "none")
        b = variant(folder, extra, args.form)
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
