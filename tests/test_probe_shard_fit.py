"""benchmarks/probe_shard_fit.py: the shard's one-GPU shape, its rows, and a patch of the fit
that prices them and leaves validate.fit as it was (CPU, on the committed 2x H100 TP folder)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

import spectune.validate.fit as fit
from benchmarks.probe_gemm_fixed import shard_model
from benchmarks.probe_shard_fit import KIND, ROOT, patch, shard_rows
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import calibrations_in

SRC = ROOT / "benchmarks/results/tp_h100x2_c"


def test_shard_model_divides_the_split_widths() -> None:
    full = load_model("llama-3.1-8b")
    half = shard_model(full, 2)
    assert (half.heads, half.kv_heads, half.ffn, half.lm_vocab) == (16, 4, 7168, 64128)
    assert (half.hidden, half.layers, half.head_dim) == (full.hidden, full.layers, full.head_dim)


def test_shard_rows_read_the_no_collective_points_of_the_asked_tp(tmp_path: Path) -> None:
    shutil.copy(SRC / "verify-tp2.json", tmp_path / "verify-tp2.json")
    doc = json.loads((SRC / "verify-tp2.json").read_text())
    rows = shard_rows(tmp_path, {2})
    assert len(rows) == len(doc["verify"])
    assert [s for _, _, s in rows] == [r["seconds_nocomm"] for r in doc["verify"]]
    assert all(k == KIND and a["tp"] == 2 for k, a, _ in rows)
    assert shard_rows(tmp_path, {4}) == []


def test_patch_prices_a_shard_row_as_its_one_gpu_forward() -> None:
    """A patched fit prices a shard row as a tp 1 CostModel of the shard's shape: between half
    and all of the full forward, and no collective in it; unpatched, the kind is unknown."""
    saved = fit._rows, fit.predict_row, dict(fit.WEIGHTS)
    cal: Calibration = next(iter(calibrations_in(SRC).values()))
    hw, target = load_hardware("h100-sxm"), load_model("llama-3.1-8b")
    cm = CostModel(hw, target, load_model("eagle3-llama-3.1-8b"), calibration=cal)
    args = {"batch": 32, "tokens": 16, "context": 4096, "tp": 2, "target": target.name}
    try:
        patch([(KIND, args, 1e-3)], 0.5)
        assert fit.WEIGHTS[KIND] == 0.5
        assert fit._rows({"verify": []}, [])[-1] == (KIND, args, 1e-3)
        shard = fit.predict_row(cm, KIND, args)
        full = float(np.asarray(cm.verify_time(32, 16, 4096)))
        assert 0.5 * full < shard < full
    finally:
        fit._rows, fit.predict_row = saved[0], saved[1]
        fit.WEIGHTS.clear()
        fit.WEIGHTS.update(saved[2])
    with pytest.raises(ValueError):
        fit.predict_row(cm, KIND, args)
