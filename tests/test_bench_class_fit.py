"""benchmarks/bench_class_fit.py: its variants patch only this process's fit, and bad
arguments are refused (CPU; the refits themselves are benchmarks, not tests)."""

from __future__ import annotations

import numpy as np
import pytest

import benchmarks.bench_class_fit as bcf
import spectune.planner.forward as fwd
import spectune.validate.fit as fit
from spectune.specs import load_hardware
from spectune.specs.calibration import Calibration


@pytest.fixture
def restored(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever a variant patches comes back after the test."""
    monkeypatch.setattr(fit, "WEIGHTS", dict(fit.WEIGHTS))
    monkeypatch.setattr(fit, "PARAMS", fit.PARAMS)
    monkeypatch.setattr(fit, "_calibration", fit._calibration)
    monkeypatch.setattr(fwd, "elementwise_time", fwd.elementwise_time)
    monkeypatch.setattr(fit, "predict_row", fit.predict_row)


def test_the_launch_variant_fits_the_class_rows_and_three_more_terms(restored: None) -> None:
    bcf.apply("launch", 0.25)
    assert all(fit.WEIGHTS[k] == 0.25 for k in bcf.CLASS_ROWS)
    names = [n for n, *_ in fit.PARAMS]
    assert names[-3:] == ["gemm_fixed_us", "attn_fixed_us", "ew_floor_us"]
    x = [start for *_, start in fit.PARAMS]
    x[-3:] = [4.0, 6.0, 2.5]
    cal = fit._calibration(x, "h100-sxm", Calibration(), fit.PARAMS)
    assert cal.gemm_fixed_s == pytest.approx(4e-6) and cal.attention_fixed_s == pytest.approx(6e-6)
    assert cal.elementwise_floor_s == pytest.approx(2.5e-6)
    # a tiny elementwise kernel now costs the floor, a large one its bytes at the rate
    from spectune.planner.operators import Rates

    r = Rates.resolve(load_hardware("h100-sxm"), cal)
    assert float(fwd.elementwise_time(r, np.asarray(1024.0))) == pytest.approx(2.5e-6)
    assert float(fwd.elementwise_time(r, np.asarray(0.0))) == 0.0
    assert float(fwd.elementwise_time(r, np.asarray(1e10))) > 1e-3


def test_base_only_weights_the_class_rows(restored: None) -> None:
    params = fit.PARAMS
    bcf.apply("base", 0.5)
    assert params == fit.PARAMS and fit.WEIGHTS["verify_linear"] == 0.5


@pytest.mark.parametrize("argv", [[], ["launch", "--weight"], ["launch", "--weight", "x"]])
def test_bad_arguments_exit_2(argv: list[str], restored: None) -> None:
    assert bcf.main(argv) == 2


def test_an_unknown_variant_is_refused(restored: None) -> None:
    with pytest.raises(SystemExit, match="unknown variant"):
        bcf.apply("nope", 0.5)


def test_the_logits_variant_moves_the_logits_pass_to_the_other_class(restored: None) -> None:
    from spectune.planner.costmodel import CostModel
    from spectune.specs import load_model

    cm = CostModel(load_hardware("h100-sxm"), load_model("llama-3.1-8b"))
    a = {"batch": 4, "tokens": 16, "context": 4096}
    before = {k: fit.predict_row(cm, k, a) for k in ("verify", *bcf.CLASS_ROWS)}
    bcf.apply("logits", 0.5)
    after = {k: fit.predict_row(cm, k, a) for k in ("verify", *bcf.CLASS_ROWS)}
    moved = before["verify_linear"] - after["verify_linear"]
    assert moved > 0 and after["verify_other"] - before["verify_other"] == pytest.approx(moved)
    assert after["verify"] == before["verify"]
    assert after["verify_attention"] == before["verify_attention"]
