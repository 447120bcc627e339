"""The weight stream of a GEMM (fixed part and rate), read off the GEMM micro-benchmarks: the fit
holds the fixed part, which the weight stream alone pays; the rate is a read the ceiling admits."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectune.planner.operators import Rates, gemm_time
from spectune.specs import load_hardware
from spectune.specs.calibration import Calibration
from spectune.validate.fit import GEMM_FIXED_MAX_S, gemm_stream_line
from spectune.validate.fit_bounds import ceilings

H100 = load_hardware("h100-sxm")
SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def _run(fixed_s: float, bw: float = 2.9e12, ms: tuple[int, ...] = (1, 16, 64, 256)) -> dict:
    rows = []
    for n, k in SHAPES:
        for m in ms:
            b = (n * k + m * (n + k)) * 2
            rows.append({"m": m, "n": n, "k": k, "seconds": fixed_s + b / bw})
    return {"gemm": rows}


def _fixed(run: dict) -> float | None:
    line = gemm_stream_line(run)
    return None if line is None else line.fixed_s


@given(st.floats(0.0, 15e-6), st.floats(1e12, 4.8e12))
def test_line_recovers_the_fixed_part_and_the_rate(fixed_s: float, bw: float) -> None:
    got = gemm_stream_line(_run(fixed_s, bw))
    assert got is not None
    assert got.fixed_s == pytest.approx(fixed_s, abs=2e-8)
    assert got.bytes_per_s == pytest.approx(bw, rel=1e-6)


def test_line_bounds_and_absence() -> None:
    assert gemm_stream_line({}) is None
    assert gemm_stream_line(_run(5e-6, ms=(128, 256))) is None  # no streaming rows
    one_shape = {"gemm": [r for r in _run(5e-6)["gemm"] if (r["n"], r["k"]) == SHAPES[0]]}
    assert gemm_stream_line(one_shape) is None  # one shape: no line
    assert _fixed(_run(1e-3)) == GEMM_FIXED_MAX_S
    negative = _run(0.0)
    for r in negative["gemm"]:
        r["seconds"] -= 3e-6
    assert _fixed(negative) == 0.0
    flat = _run(5e-6)
    for r in flat["gemm"]:
        r["seconds"] = 5e-6  # time that does not grow with bytes is no stream
    assert gemm_stream_line(flat) is None


def test_the_stream_is_a_read_the_ceiling_admits() -> None:
    """A weight stream measured above the sum kernel's read rate raises the read ceiling (an
    H200 streams GEMM weights at 4.47 TB/s and sums at 4.12); one below it leaves it."""
    run = {"copy_bytes_per_s": 0.8 * H100.hbm_bytes_per_s,
           "read_bytes_per_s": 0.85 * H100.hbm_bytes_per_s}  # fmt: skip
    assert ceilings(run, H100)["read"] == pytest.approx(0.85)
    assert ceilings(run, H100, 0.93 * H100.hbm_bytes_per_s)["read"] == pytest.approx(0.93)
    assert ceilings(run, H100, 0.5 * H100.hbm_bytes_per_s)["read"] == pytest.approx(0.85)
    assert ceilings(run, H100, 2 * H100.hbm_bytes_per_s)["read"] == 1.0


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
