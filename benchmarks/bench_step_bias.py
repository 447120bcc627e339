"""Structural variants of the attention and small-kernel prices, judged by refitting every
committed calibration run (CPU).

    python -m benchmarks.bench_step_bias VARIANT [folder ...]

The one-token verify pass (the no-speculation step every predicted speedup divides by) is
priced 1-5% high in every new-user folder (benchmarks/results/forward_kernels_h100.md: the
fit streams the weight GEMMs 10-13% slow and prices decode attention at small batch and the
~130 small kernels per forward nearly free). Each variant changes how the cost model prices
attention or the small kernels, refits each folder with the committed fit
(benchmarks.bench_refit.refit) and reports per folder verify MAPE, worst speedup error and the
N = 1 bias (bench_refit.n1_bias). Variants (physical values from the H100 kernel profile,
benchmarks/results/classes_h100.txt: attention 6.2 us per layer at B1 x 1 over 512 keys,
4-5 us intercept of attention time vs KV bytes; the other kernels 2.5-3 us each):

    base          the cost model as it is
    attn_add5     attention_fixed_s held at 5 us (added to every attention launch)
    attn_floor6   attention = max(roofline, 6 us) per launch
    ew_floor2.5   every elementwise kernel = max(bytes / bandwidth, 2.5 us)
    launch2.5     launch_s held at 2.5 us (every kernel, GEMMs included)
    gemm_fixed0   gemm_fixed_s held at 0 instead of the GEMM micro-benchmarks' intercept
    a+b           two of them

Prints the per-folder table, then one JSON document on its last line.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import Any

import numpy as np

import benchmarks.bench_refit as br
import spectune.planner.forward as fwd
import spectune.validate.fit as fit
from spectune.planner import operators as ops
from spectune.specs.calibration import Calibration
from spectune.validate.check import CheckResult

US = 1e-6


def _attention_floor(floor_s: float) -> Any:
    def attention_time(r: ops.Rates, kv: Any, flops: Any, io: Any) -> Any:
        t = ops.attention_time(r, kv, flops, io)
        return np.where(t > 0, np.maximum(t, floor_s), 0.0)

    return attention_time


def _elementwise_floor(floor_s: float) -> Any:
    def elementwise_time(r: ops.Rates, bytes_: Any) -> Any:
        t = ops.elementwise_time(r, bytes_)
        return np.where(np.asarray(bytes_) > 0, np.maximum(t, floor_s), 0.0)

    return elementwise_time


def _hold(name: str, value: float) -> None:
    """Fit parameter `name` held at `value` (added to validate.fit.PARAMS where the fit holds
    it outside them, as launch_us at 0)."""
    if name not in {n for n, *_ in fit.PARAMS}:
        fit.PARAMS = (*fit.PARAMS, (name, value, value + 1e-9, value))
    fit.PARAMS = tuple(
        (n, value, value + 1e-9, value) if n == name else (n, lo, hi, x0)
        for n, lo, hi, x0 in fit.PARAMS
    )


def apply(variant: str) -> None:
    """Patch the cost model / fit for `variant` (this process only): base, attn_add<us>,
    attn_floor<us>, ew_floor<us>, launch<us>, gemm_fixed<us>, or several joined by "+"."""
    base: dict[str, float] = {}
    for part in variant.split("+"):
        if part == "base":
            continue
        name = part.rstrip("0123456789.")
        us = float(part[len(name) :]) * US
        if name == "attn_add":
            base["attention_fixed_s"] = us
        elif name == "gemm_fixed":
            base["gemm_fixed_s"] = us
        elif name == "attn_floor":
            fwd.attention_time = _attention_floor(us)  # type: ignore[assignment]
        elif name == "ew_floor":
            fwd.elementwise_time = _elementwise_floor(us)  # type: ignore[assignment]
        elif name == "launch":
            _hold("launch_us", us / US)
        else:
            raise SystemExit(f"unknown variant {part}")
    if base:
        br.fit_calibration = functools.partial(  # type: ignore[assignment]
            fit.fit_calibration,
            base=Calibration(**base),  # type: ignore[arg-type]
            hold_gemm_fixed="gemm_fixed_s" not in base,
        )


def step_exact(res: CheckResult) -> tuple[float, float]:
    """Worst |speedup error| and mean signed speedup error with the no-speculation step priced
    exactly: each speedup error e_s divided through by its own file's and batch's baseline
    verify error e_ar, (1 + e_s) / (1 + e_ar) - 1 (predicted speedup = tokens per step / spec
    step * no-speculation step)."""
    ar = {(r.file, _batch(r.what)): r.error for r in res.verify if r.what.endswith("(baseline)")}
    adj = [(1 + r.error) / (1 + ar.get((r.file, _batch(r.what)), 0.0)) - 1 for r in res.speedup]
    if not adj:
        return 0.0, 0.0
    return max(abs(e) for e in adj), sum(adj) / len(adj)


def _batch(what: str) -> int:
    m = re.search(r"B=(\d+)", what)
    return int(m.group(1)) if m else 0


def main(argv: list[str]) -> int:
    variant, folders = argv[0], argv[1:] or list(br.FOLDERS)
    apply(variant)
    out = []
    print(
        f"variant {variant}: refit verify MAPE, worst |speedup error|, N=1 bias grid / step, "
        "worst | mean signed speedup error with the no-speculation step exact"
    )
    for folder in folders:
        src = br.ROOT / folder
        if not (src / "calibrate-run.json").is_file():
            continue
        docs = [br._load(src / name) for name in br.FOLDERS.get(folder, ())]
        cal, report = br.fit_calibration(br._load(src / "calibrate-run.json"), docs)
        res = br.check_with(src, cal)
        bias = br.n1_bias(res)
        worst, mean = step_exact(res)
        print(
            f"  {folder:<40} {100 * res.verify_mape:5.2f}% {100 * res.worst_speedup_error:5.1f}%"
            f"  {br._pct(bias['grid']):>6} / {br._pct(bias['step']):>6}"
            f"  {100 * worst:5.1f}% | {br._pct(mean):>6}"
        )
        out.append({"folder": folder, "verify_mape": res.verify_mape,
                    "worst": res.worst_speedup_error, "n1_bias": bias,
                    "step_exact": {"worst": worst, "mean": mean},
                    "params": report["params"]})  # fmt: skip
    print(json.dumps({"variant": variant, "folders": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
