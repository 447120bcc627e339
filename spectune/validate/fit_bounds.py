"""Physical bounds on the calibration fit, and which fitted parameters the data determined.

A least-squares fit of many efficiencies to whole-forward timings can trade them against each
other: a GEMM efficiency above what the GPU's matmul reaches, offset by an elementwise
efficiency far below it, prices the same verify passes while the parameters stop meaning what
their names say. So every efficiency is bounded by what the GPU was measured to do in the same
calibration run (spectune.executor.calibrate):

    read-stream efficiencies (weights, attention KV) <= read_bytes_per_s / HBM peak
    elementwise efficiency (reads and writes)        <= copy_bytes_per_s / HBM peak
    FLOP efficiencies (the GEMM curve's e_max, attention) <= matmul_flops / bf16 peak

i.e. <= 1 against the measured read and copy bandwidths and matmul rate. Weight streaming and
the attention KV read are reads: on HBM3/HBM3e a read-only stream runs faster than a copy
(which turns the bus around between reads and writes), so bounding them by the copy rate would
push them against that bound and the fit would move the difference into other parameters. The
read ceiling is the largest measured read rate: of a sum kernel, a copy, and the weight
GEMMs' stream (validate.fit.gemm_stream_line). A run without the read figure bounds
reads by the copy rate; a run without any figure is bounded by the peaks (1). The report gives each efficiency as a fraction of its measured
ceiling next to the fitted value, and says which parameters the data determined: a parameter
is `determined` when it sits inside its bounds and its relative standard error (from the
Jacobian of the weighted log residuals at the solution, J^T J inverted through its singular
values; a direction the data leave unconstrained gives its parameters an infinite error) is
below DETERMINED_REL_SE; `at_bound` when the data push it against a bound (the bound, not the data,
sets it); `weak` otherwise (the data hardly move it: its start value or a trade-off stands).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from spectune.specs.hardware import HardwareSpec

#: efficiency parameter -> the measured ceiling that bounds it
CEILING_OF = {
    "weight_bw_efficiency": "read",
    "attention_bw_efficiency": "read",
    "elementwise_bw_efficiency": "copy",
    "gemm_emax": "matmul",
    "attention_flops_efficiency": "matmul",
}
DETERMINED_REL_SE = 0.25
AT_BOUND_REL = 1e-3  # within this fraction of the range from a bound: at the bound
RCOND = 1e-6  # singular values of the relative Jacobian below this fraction: unconstrained


def ceilings(
    run: dict[str, Any], hw: HardwareSpec, stream_bytes_per_s: float | None = None
) -> dict[str, float]:
    """{'copy': measured copy bytes/s / HBM peak, 'read': the largest of the measured read,
    copy and weight-stream bytes/s / HBM peak, 'matmul': measured matmul FLOP/s / bf16 peak},
    each at most 1 (1 where the run did not measure it; without a read figure 'read' is the
    larger of 'copy' and the stream). `stream_bytes_per_s`: the rate the run's weight GEMMs
    stream at (validate.fit.gemm_stream_line), a read too: on an H200 it passes the sum
    kernels' read rate (4.47 vs 4.12 TB/s, benchmarks/results/tp_h200x4_b)."""
    copy = run.get("copy_bytes_per_s")
    read = run.get("read_bytes_per_s")
    matmul = run.get("matmul_flops")
    copy_frac = min(1.0, float(copy) / hw.hbm_bytes_per_s) if copy else 1.0
    read_frac = min(1.0, max(float(read) / hw.hbm_bytes_per_s, copy_frac)) if read else copy_frac
    if stream_bytes_per_s:
        read_frac = max(read_frac, min(1.0, stream_bytes_per_s / hw.hbm_bytes_per_s))
    return {
        "copy": copy_frac,
        "read": read_frac,
        "matmul": min(1.0, float(matmul) / hw.peak_bf16_flops) if matmul else 1.0,
    }


def bounded(
    params: Sequence[tuple[str, float, float, float]], ceiling: dict[str, float]
) -> tuple[tuple[str, float, float, float], ...]:
    """The (name, lower, upper, start) table with each efficiency's upper bound cut to its
    measured ceiling (the lower bound and the start kept below it)."""
    out = []
    for name, lo, hi, x0 in params:
        if name in CEILING_OF:
            hi = min(hi, ceiling[CEILING_OF[name]])
            lo = min(lo, 0.5 * hi)
            x0 = min(max(x0, lo), hi)
        out.append((name, lo, hi, x0))
    return tuple(out)


def identified(
    names: Sequence[str],
    x: np.ndarray,
    jac: np.ndarray,
    resid: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
) -> dict[str, Any]:
    """Which parameters the data determined (see the module docstring): lists 'determined',
    'at_bound', 'weak', and 'rel_se' per parameter (None where J^T J gives none: at a bound,
    or a parameter the residuals do not depend on)."""
    span = np.maximum(hi - lo, 1e-12)
    at = (np.abs(x - lo) <= AT_BOUND_REL * span) | (np.abs(hi - x) <= AT_BOUND_REL * span)
    free = ~at
    m, n = jac.shape
    dof = max(m - int(free.sum()), 1)
    s2 = float(resid @ resid) / dof
    rel = np.full(n, np.inf)
    if free.any():
        # sensitivities to relative changes; directions the data do not constrain (singular
        # values below RCOND of the largest) give their parameters an infinite error
        jf = jac[:, free] * np.maximum(np.abs(x[free]), 1e-12)
        _, sv, vt = np.linalg.svd(jf, full_matrices=False)
        small = sv <= RCOND * max(float(sv.max()), 1e-300)
        inv2 = np.where(small, 0.0, 1.0 / np.maximum(sv, 1e-300) ** 2)
        var = (vt.T**2 @ inv2) * s2
        loose = ((vt.T**2)[:, small] > 1e-6).any(axis=1)
        rel[free] = np.where(loose, np.inf, np.sqrt(var))
    out: dict[str, Any] = {"determined": [], "at_bound": [], "weak": [], "rel_se": {}}
    for i, name in enumerate(names):
        out["rel_se"][name] = float(rel[i]) if np.isfinite(rel[i]) else None
        if at[i]:
            out["at_bound"].append(name)
        elif rel[i] < DETERMINED_REL_SE:
            out["determined"].append(name)
        else:
            out["weak"].append(name)
    return out


def bounds_report(
    params: Sequence[tuple[str, float, float, float]],
    x: np.ndarray,
    ceiling: dict[str, float],
    run: dict[str, Any],
    hw: HardwareSpec,
) -> dict[str, Any]:
    """Each efficiency beside its measured ceiling: the fitted fraction of peak, the ceiling
    (a fraction of peak), their ratio (<= 1), and the absolute rate it prices at."""
    out: dict[str, Any] = {
        "copy_bytes_per_s": run.get("copy_bytes_per_s"),
        "read_bytes_per_s": run.get("read_bytes_per_s"),
        "matmul_flops": run.get("matmul_flops"),
        "copy_fraction_of_peak": ceiling["copy"],
        "read_fraction_of_peak": ceiling["read"],
        "matmul_fraction_of_peak": ceiling["matmul"],
    }
    for (name, *_), v in zip(params, x, strict=True):
        kind = CEILING_OF.get(name)
        if kind is None:
            continue
        peak = hw.peak_bf16_flops if kind == "matmul" else hw.hbm_bytes_per_s
        out[name] = {
            "fitted": float(v),
            "ceiling": ceiling[kind],
            "of_ceiling": float(v) / ceiling[kind],
            "rate": float(v) * peak,
            "unit": "FLOP/s" if kind == "matmul" else "bytes/s",
        }
    return out
