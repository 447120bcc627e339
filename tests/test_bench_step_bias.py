"""The N = 1 bias and the speedup decomposition that benchmarks/bench_step_bias.py reports."""

from __future__ import annotations

import pytest

from benchmarks.bench_refit import n1_bias
from benchmarks.bench_step_bias import step_exact
from spectune.validate.check import CheckResult, Row


def _result() -> CheckResult:
    res = CheckResult()
    res.verify = [
        Row("calibrate-run.json", "verify B=1 N=1 C=4096", 1.02, 1.0),
        Row("calibrate-run.json", "verify B=64 N=1 C=512", 0.98 * 2, 2.0),
        Row("calibrate-run.json", "verify B=1 N=16 C=4096", 1.5, 1.0),  # not N = 1
        Row("execute.json", "verify B=8 N=1 C=4096 (baseline)", 1.04, 1.0),
        Row("execute.json", "verify B=32 N=1 C=4096 (baseline)", 1.0, 1.0),
    ]
    res.speedup = [
        Row("execute.json", "speedup B=8 x 6/8/32", 2.08, 2.0),  # +4%: all from the step
        Row("execute.json", "speedup B=32 x 6/8/32", 1.9, 2.0),  # -5%
    ]
    return res


def test_n1_bias_separates_grid_and_step() -> None:
    bias = n1_bias(_result())
    assert bias["grid"] == pytest.approx(0.0)
    assert bias["step"] == pytest.approx(0.02)
    assert n1_bias(CheckResult()) == {"grid": None, "step": None}


def test_step_exact_divides_out_each_batch_step_error() -> None:
    worst, mean = step_exact(_result())
    assert worst == pytest.approx(0.05)
    assert mean == pytest.approx((0.0 - 0.05) / 2)
