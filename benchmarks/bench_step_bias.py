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
    a+b           two of them

Prints the per-folder table, then one JSON document on its last line.
"""

from __future__ import annotations

import functools
import json
import sys
from typing import Any

import numpy as np

import benchmarks.bench_refit as br
import spectune.planner.forward as fwd
import spectune.validate.fit as fit
from spectune.planner import operators as ops
from spectune.specs.calibration import Calibration

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
    fit.PARAMS = tuple(
        (n, value, value + 1e-9, value) if n == name else (n, lo, hi, x0)
        for n, lo, hi, x0 in fit.PARAMS
    )


def apply(variant: str) -> None:
    """Patch the cost model / fit for `variant` (this process only): base, attn_add<us>,
    attn_floor<us>, ew_floor<us>, launch<us>, or two of them joined by "+"."""
    for part in variant.split("+"):
        if part == "base":
            continue
        name = part.rstrip("0123456789.")
        us = float(part[len(name) :]) * US
        if name == "attn_add":
            base = Calibration(attention_fixed_s=us)
            br.fit_calibration = functools.partial(fit.fit_calibration, base=base)  # type: ignore[assignment]
        elif name == "attn_floor":
            fwd.attention_time = _attention_floor(us)  # type: ignore[assignment]
        elif name == "ew_floor":
            fwd.elementwise_time = _elementwise_floor(us)  # type: ignore[assignment]
        elif name == "launch":
            _hold("launch_us", us / US)
        else:
            raise SystemExit(f"unknown variant {part}")


def main(argv: list[str]) -> int:
    variant, folders = argv[0], argv[1:] or list(br.FOLDERS)
    apply(variant)
    out = []
    print(f"variant {variant}: refit verify MAPE, worst speedup error, N=1 bias grid / step")
    for folder in folders:
        if not (br.ROOT / folder / "calibrate-run.json").is_file():
            continue
        r = br.refit(folder, br.FOLDERS.get(folder, ()))
        a = r["after"]
        b = a["n1_bias"]
        print(
            f"  {folder:<40} {100 * a['verify_mape']:5.2f}% {100 * a['worst']:5.1f}%"
            f"  {br._pct(b['grid']):>6} / {br._pct(b['step']):>6}"
        )
        out.append({"folder": folder, "verify_mape": a["verify_mape"], "worst": a["worst"],
                    "n1_bias": b, "params": r["params"]})  # fmt: skip
    print(json.dumps({"variant": variant, "folders": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
