"""benchmarks/probe_shard_factor.py: the split grid's compute factor and the patch that applies
it to the target's forwards at one tp only, restored afterwards (CPU, committed TP folder)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import spectune.planner.forward as forward
from benchmarks.probe_shard_factor import ROOT, base_calibration, compute_factor, scaled
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model

SRC = ROOT / "benchmarks/results/tp_h200x2_c"


def _cm(tp: int) -> CostModel:
    return CostModel(
        load_hardware("h200"), load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b"),
        tp=tp, calibration=base_calibration(SRC),
    )  # fmt: skip


def test_scaled_multiplies_the_targets_compute_at_one_tp_and_is_undone() -> None:
    orig = forward.ForwardPricer.forward
    tp2, tp1 = _cm(2), _cm(1)
    plain2 = tp2.verify_breakdown(8, 16, 4096)
    plain1 = float(np.asarray(tp1.verify_time(8, 16, 4096)))
    draft = float(np.asarray(tp2.draft_step_time(8, 4, 4096)))
    with scaled({2: 0.5}):
        half = tp2.verify_breakdown(8, 16, 4096)
        assert float(np.asarray(tp1.verify_time(8, 16, 4096))) == pytest.approx(plain1)
        assert float(np.asarray(tp2.draft_step_time(8, 4, 4096))) == pytest.approx(draft)
    for k, v in plain2.items():
        want = float(np.asarray(v)) * (1.0 if k == "comm" else 0.5)
        assert float(np.asarray(half[k])) == pytest.approx(want)
    assert forward.ForwardPricer.forward is orig


def test_compute_factor_of_the_committed_grid() -> None:
    grid = json.loads((SRC / "verify-tp2.json").read_text())
    f = compute_factor(grid, base_calibration(SRC))
    assert f is not None and 0.94 < f < 0.98  # the no-collective shard runs ~4% under the price
    assert (
        compute_factor(
            {
                **grid,
                "verify": [
                    {k: v for k, v in r.items() if k != "seconds_nocomm"} for r in grid["verify"]
                ],
            },
            base_calibration(SRC),
        )
        is None
    )
