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
from spectune.specs.errors import SpecError
from spectune.validate.fit import GEMM_FIXED_MAX_S, gemm_stream_line
from spectune.validate.fit_bounds import ceilings

H100 = load_hardware("h100-sxm")
SHAPES = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))


def _run(
    fixed_s: float,
    bw: float = 2.9e12,
    ms: tuple[int, ...] = (1, 16, 64, 256),
    exposed: float = 0.0,
) -> dict:
    """GEMM rows of the form gemm_stream_line reads: fixed + bytes / bw + exposed * FLOPs / peak
    (the last only below the ridge: the rows at M > 64 are not read)."""
    rows = []
    for n, k in SHAPES:
        for m in ms:
            b = (n * k + m * (n + k)) * 2
            math = exposed * 2 * m * n * k / H100.peak_bf16_flops
            rows.append({"m": m, "n": n, "k": k, "seconds": fixed_s + b / bw + math})
    return {"hardware": "h100-sxm", "gemm": rows}


def _fixed(run: dict) -> float | None:
    line = gemm_stream_line(run)
    return None if line is None else line.fixed_s


@given(st.floats(0.0, 15e-6), st.floats(1e12, 4.8e12))
def test_line_recovers_the_fixed_part_and_the_rate(fixed_s: float, bw: float) -> None:
    got = gemm_stream_line(_run(fixed_s, bw))
    assert got is not None
    assert got.fixed_s == pytest.approx(fixed_s, abs=2e-8)
    assert got.bytes_per_s == pytest.approx(bw, rel=1e-6)


@given(st.floats(0.0, 15e-6), st.floats(1e12, 4.8e12), st.floats(0.0, 1.0))
def test_line_recovers_the_exposed_math(fixed_s: float, bw: float, exposed: float) -> None:
    """The stream slows as M grows by a share of the math at peak (an H100's weight GEMMs: 3.07
    TB/s at M = 1, 2.95 at M = 64): the line reads that share beside the rate at M -> 0."""
    got = gemm_stream_line(_run(fixed_s, bw, exposed=exposed))
    assert got is not None
    assert got.exposed == pytest.approx(exposed, abs=1e-6)
    assert got.bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert got.fixed_s == pytest.approx(fixed_s, abs=2e-8)


def test_exposed_needs_two_m_and_is_a_share() -> None:
    one_m = gemm_stream_line(_run(5e-6, ms=(16,), exposed=0.3))
    assert one_m is not None and one_m.exposed == 0.0  # the math is not told from the bytes
    faster = _run(5e-6, exposed=0.2)
    for r in faster["gemm"]:
        r["seconds"] -= 0.4 * 2 * r["m"] * r["n"] * r["k"] / H100.peak_bf16_flops
    got = gemm_stream_line(faster)  # a stream that speeds up with M hides more than all
    assert got is not None and got.exposed == 0.0
    nameless = _run(5e-6)
    del nameless["hardware"]
    with pytest.raises(SpecError, match="hardware"):
        gemm_stream_line(nameless)
    with pytest.raises(SpecError, match="gemm_exposed_compute"):
        Calibration(gemm_exposed_compute=1.5)


def test_exposed_math_rides_on_the_weight_stream() -> None:
    """gemm_time's stream side adds exposed x FLOPs / peak at the unpadded M; a compute-bound
    GEMM is unchanged, and time never falls as M grows."""
    base = Calibration(hardware="h100-sxm", weight_bw_efficiency=0.85)
    r0 = Rates.resolve(H100, base)
    r1 = Rates.resolve(H100, dataclasses.replace(base, gemm_exposed_compute=0.25))
    fmt = r0.dense_format(2)
    n, k = 28672, 4096
    m = np.array([1.0, 8.0, 33.0, 64.0, 65536.0])
    t0, t1 = gemm_time(r0, m, n, k, fmt), gemm_time(r1, m, n, k, fmt)
    np.testing.assert_allclose(
        (t1 - t0)[:4], 0.25 * 2 * m[:4] * n * k / H100.peak_bf16_flops, rtol=1e-9
    )
    assert t1[-1] == pytest.approx(t0[-1], rel=1e-12)
    grid = np.arange(1.0, 4097.0)
    assert np.all(np.diff(gemm_time(r1, grid, n, k, fmt)) >= -1e-15)


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
