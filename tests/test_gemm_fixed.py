"""The per-GEMM fixed cost: read off the GEMM micro-benchmarks, paid by the weight stream only."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectune.planner.operators import Rates, gemm_time
from spectune.specs import load_hardware
from spectune.specs.calibration import Calibration
from spectune.validate.fit import GEMM_FIXED_MAX_S, gemm_fixed_intercept

H100 = load_hardware("h100-sxm")
SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def _run(fixed_s: float, bw: float = 2.9e12, ms: tuple[int, ...] = (1, 16, 64, 256)) -> dict:
    rows = []
    for n, k in SHAPES:
        for m in ms:
            b = (n * k + m * (n + k)) * 2
            rows.append({"m": m, "n": n, "k": k, "seconds": fixed_s + b / bw})
    return {"gemm": rows}


@given(st.floats(0.0, 15e-6), st.floats(1e12, 4.8e12))
def test_intercept_recovers_the_fixed_part(fixed_s: float, bw: float) -> None:
    got = gemm_fixed_intercept(_run(fixed_s, bw))
    assert got == pytest.approx(fixed_s, abs=2e-8)


def test_intercept_bounds_and_absence() -> None:
    assert gemm_fixed_intercept({}) is None
    assert gemm_fixed_intercept(_run(5e-6, ms=(128, 256))) is None  # no streaming rows
    one_shape = {"gemm": [r for r in _run(5e-6)["gemm"] if (r["n"], r["k"]) == SHAPES[0]]}
    assert gemm_fixed_intercept(one_shape) is None  # one shape: no line
    assert gemm_fixed_intercept(_run(1e-3)) == GEMM_FIXED_MAX_S
    negative = _run(0.0)
    for r in negative["gemm"]:
        r["seconds"] -= 3e-6
    assert gemm_fixed_intercept(negative) == 0.0


def test_fixed_part_rides_on_the_weight_stream() -> None:
    base = Calibration(hardware="h100-sxm", weight_bw_efficiency=0.85)
    fixed = dataclasses.replace(base, gemm_fixed_s=6e-6)
    r0, r1 = Rates.resolve(H100, base), Rates.resolve(H100, fixed)
    fmt = r0.dense_format(2)
    n, k = 4096, 4096
    m = np.array([1.0, 8.0, 64.0, 8192.0, 65536.0])
    t0, t1 = gemm_time(r0, m, n, k, fmt), gemm_time(r1, m, n, k, fmt)
    # streaming GEMMs pay it whole; a compute-bound one (M = 64k) hides it
    np.testing.assert_allclose((t1 - t0)[:3], 6e-6, rtol=1e-9)
    assert t1[-1] == pytest.approx(t0[-1], rel=1e-12)
    assert np.all(t1 >= t0) and np.all(t1 - t0 <= 6e-6 * (1 + 1e-9))
