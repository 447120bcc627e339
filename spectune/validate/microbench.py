"""Closed-form rates from GPU micro-benchmark rows (pure numpy; no GPU needed here).

spectune's calibration fit is spectune.validate.fit.fit_calibration (`spectune calibrate`: the
executor's verify grid, GEMM rows and loop phases). This module inverts the cost model's formula
for each kind of micro-benchmark row on its own, which benchmarks/bench_costmodel_gpu.py uses to
compare per-operator rates with the roofline. `invert_microbenchmarks` takes the rows. Each
row is a mapping with a "kind" and "seconds" (median time of one kernel, measured inside a CUDA
graph so it includes the graph's per-kernel launch gap), plus the fields of its kind:

    kind            fields                    fits
    launch          -                         launch_s (an empty kernel)
    eager_launch    -                         eager_launch_s (an empty kernel, no graph)
    copy            bytes                     elementwise_bw_efficiency (bytes read + written);
                                              launch_s too when no launch rows are given
    gemm            m, n, k, weight_bytes     weight_bw_efficiency, gemm_fixed_s (a line through
                                              rows far below the ridge); gemm_tokens /
                                              gemm_flops_efficiency (all rows)
    attention       kv_bytes, flops           attention_bw_efficiency, attention_fixed_s (rows of
                                              low FLOP/byte); attention_flops_efficiency (rows
                                              above the ridge)
    allreduce       bytes, tp                 interconnect_efficiency, allreduce_latency_s
    step_overhead   batch                     step_overhead_s, per_request_overhead_s
    tree_build      -                         tree_build_s
    retrieval       requests                  retrieval_per_request_s

Fields with no rows keep their defaults (None: the HardwareSpec figure). The fit inverts the
cost model's own formulas (operators.py), so the fitted model reproduces each measured row.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from spectune.planner.operators import ACT_BYTES, FLOPS_PER_MAC, Rates, gemm_effective_rows
from spectune.specs.calibration import Calibration
from spectune.specs.errors import SpecError
from spectune.specs.hardware import HardwareSpec

FIELDS: dict[str, tuple[str, ...]] = {
    "launch": (),
    "eager_launch": (),
    "copy": ("bytes",),
    "gemm": ("m", "n", "k", "weight_bytes"),
    "attention": ("kv_bytes", "flops"),
    "allreduce": ("bytes", "tp"),
    "step_overhead": ("batch",),
    "tree_build": (),
    "retrieval": ("requests",),
}


def _columns(rows: list[Mapping[str, Any]]) -> dict[str, dict[str, np.ndarray]]:
    """Rows grouped by kind into float arrays per field; SpecError names a bad row."""
    grouped: dict[str, list[Mapping[str, Any]]] = {k: [] for k in FIELDS}
    for i, row in enumerate(rows):
        kind = row.get("kind")
        if kind not in FIELDS:
            raise SpecError(
                f"measurement row {i}: unknown kind {kind!r}; known: {', '.join(FIELDS)}"
            )
        for key in ("seconds", *FIELDS[kind]):
            v = row.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not np.isfinite(v) or v < 0:
                raise SpecError(
                    f"measurement row {i} ({kind}): field {key!r} must be a number >= 0"
                )
        grouped[kind].append(row)
    return {
        kind: {key: np.array([float(r[key]) for r in rs]) for key in ("seconds", *FIELDS[kind])}
        for kind, rs in grouped.items()
        if rs
    }


def _line(kind: str, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least-squares (intercept, slope) of y = a + b x in relative error (sizes span orders of
    magnitude), both clipped at 0."""
    if x.size < 2 or np.ptp(x) == 0:
        raise SpecError(
            f"{kind} rows: need two or more distinct sizes to separate the fixed cost from the "
            "per-unit cost"
        )
    b, a = np.polyfit(x, y, 1, w=1.0 / np.maximum(y, 1e-12))
    return max(float(a), 0.0), max(float(b), 0.0)


def _bandwidth_fit(
    kind: str, nbytes: np.ndarray, seconds: np.ndarray, launch: float, peak_bytes_per_s: float
) -> tuple[float | None, float]:
    """(fraction of peak bandwidth, fixed seconds beyond the launch) of memory-bound kernels:
    a line through (bytes, seconds) when the rows have two or more sizes, else the ratio of
    sums with no fixed part."""
    if np.unique(nbytes).size >= 2:
        a, b = _line(kind, nbytes, seconds)
        if b > 0:
            return min(1.0 / (b * peak_bytes_per_s), 1.0), max(a - launch, 0.0)
    busy = np.maximum(seconds - launch, 1e-12)
    return _fraction(np.array([nbytes.sum() / (peak_bytes_per_s * busy.sum())])), 0.0


def _fraction(values: np.ndarray) -> float | None:
    """Median of achieved fractions of peak, clipped to (0, 1]; None without values."""
    v = values[np.isfinite(values) & (values > 0)]
    return None if v.size == 0 else float(min(np.median(v), 1.0))


def _gemm_curve(
    r: Rates, g: dict[str, np.ndarray], launch: float | np.ndarray
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Efficiency per charged row count: eff = FLOPs(M_eff) / (peak * (t - launch)), median per
    M_eff, then lowered where needed so that M/eff never falls with M. `launch`: the time of
    each row that is not its busy time (s, scalar or per row)."""
    m_eff = np.array([gemm_effective_rows(r, m, n) for m, n in zip(g["m"], g["n"], strict=True)])
    peak = np.array([r.gemm_peak(wb) for wb in g["weight_bytes"]])
    busy = np.maximum(g["seconds"] - launch, 1e-12)
    eff = FLOPS_PER_MAC * m_eff * g["n"] * g["k"] / (peak * busy)
    grid = np.unique(m_eff)
    curve = [float(min(np.median(eff[m_eff == x]), 1.0)) for x in grid]
    for i in range(1, len(curve)):  # keep M/eff non-decreasing: time never falls as M grows
        curve[i] = float(min(curve[i], curve[i - 1] * grid[i] / grid[i - 1]))
    return tuple(float(x) for x in grid), tuple(curve)


def invert_microbenchmarks(
    rows: Iterable[Mapping[str, Any]], hardware: HardwareSpec, *, source: str = ""
) -> Calibration:
    """A Calibration for `hardware` from micro-benchmark rows, each field by inverting the cost
    model's own formula for its rows (see the module docstring). The calibration fit of spectune
    is spectune.validate.fit.fit_calibration; this closed form serves the GPU cost-model benchmark."""
    rows = list(rows)
    if not rows:
        raise SpecError("no measurement rows to fit a calibration from")
    cols = _columns(rows)
    defaults = Calibration()
    fit: dict[str, Any] = {}
    r = Rates.resolve(hardware, defaults)

    if "launch" in cols:
        fit["launch_s"] = float(np.median(cols["launch"]["seconds"]))
    if "eager_launch" in cols:
        fit["eager_launch_s"] = float(np.median(cols["eager_launch"]["seconds"]))
    if "copy" in cols:
        a, b = _line("copy", cols["copy"]["bytes"], cols["copy"]["seconds"])
        fit.setdefault("launch_s", a)
        if b > 0:
            fit["elementwise_bw_efficiency"] = min(1.0 / (b * hardware.hbm_bytes_per_s), 1.0)
    launch = fit.get("launch_s", hardware.launch_s)
    ridge = r.peak_bf16_flops * hardware.gemm_efficiency / r.weight_bytes_per_s  # FLOP/byte

    if "gemm" in cols:
        g = cols["gemm"]
        weight_bytes = g["n"] * g["k"] * g["weight_bytes"]
        # rows far below the ridge point (M < knee / 4) stream weights: time = launch + fixed +
        # bytes / (bw * eff)
        knee = np.array([r.gemm_peak(wb) for wb in g["weight_bytes"]]) * hardware.gemm_efficiency
        knee = knee * g["weight_bytes"] / (2 * r.weight_bytes_per_s)
        small = g["m"] < knee / 4
        fixed, streaming = 0.0, small
        if small.any():
            eff, fixed = _bandwidth_fit(
                "gemm", weight_bytes[small], g["seconds"][small], launch, hardware.hbm_bytes_per_s
            )
            fit["weight_bw_efficiency"], fit["gemm_fixed_s"] = eff, fixed
            if eff is not None:  # every row within 2% of its fitted memory term streams
                io = g["m"] * (g["n"] + g["k"]) * ACT_BYTES  # operators.gemm_time's activations
                memory = (weight_bytes + io) / (hardware.hbm_bytes_per_s * eff) + fixed
                streaming = small | (g["seconds"] - launch <= 1.02 * memory)
        # the fixed part rides on the weight stream (operators.gemm_time): off the streaming
        # rows (whose FLOP rate then stays below their memory bound), kept in the others
        fit["gemm_tokens"], fit["gemm_flops_efficiency"] = _gemm_curve(
            r, g, launch + np.where(streaming, fixed, 0.0)
        )

    if "attention" in cols:
        a_ = cols["attention"]
        intensity = a_["flops"] / np.maximum(a_["kv_bytes"], 1.0)
        low, high = intensity < ridge / 4, intensity > ridge  # surely memory / compute bound
        fixed = 0.0
        if low.any():
            eff, fixed = _bandwidth_fit(
                "attention",
                a_["kv_bytes"][low],
                a_["seconds"][low],
                launch,
                hardware.hbm_bytes_per_s,
            )
            fit["attention_bw_efficiency"], fit["attention_fixed_s"] = eff, fixed
        if high.any():
            busy = np.maximum(a_["seconds"][high] - launch - fixed, 1e-12)
            fit["attention_flops_efficiency"] = _fraction(
                np.array([a_["flops"][high].sum() / (hardware.peak_bf16_flops * busy.sum())])
            )

    if "allreduce" in cols:
        ar = cols["allreduce"]
        ring = 2 * (ar["tp"] - 1) / np.maximum(ar["tp"], 1) * ar["bytes"]
        lat, slope = _line("allreduce", ring / hardware.interconnect_bytes_per_s, ar["seconds"])
        fit["allreduce_latency_s"] = lat
        if slope > 0:
            fit["interconnect_efficiency"] = min(1.0 / slope, 1.0)

    if "step_overhead" in cols:
        fixed, per_req = _line(
            "step_overhead", cols["step_overhead"]["batch"], cols["step_overhead"]["seconds"]
        )
        fit["step_overhead_s"], fit["per_request_overhead_s"] = fixed, per_req
    if "tree_build" in cols:
        fit["tree_build_s"] = float(np.median(cols["tree_build"]["seconds"]))
    if "retrieval" in cols:
        rq = cols["retrieval"]
        fit["retrieval_per_request_s"] = float(
            np.median(rq["seconds"] / np.maximum(rq["requests"], 1))
        )

    fit = {k: v for k, v in fit.items() if v is not None}
    text = source or f"fit_calibration from {len(rows)} measurements ({', '.join(sorted(cols))})"
    return Calibration(hardware=hardware.name, source=text, **fit)
