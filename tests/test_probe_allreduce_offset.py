"""benchmarks/probe_allreduce_offset.py: the in-forward all-reduce offset it reads off a split
verify grid, and the law it shifts (CPU, on the committed 2x H100 TP folder)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.probe_allreduce_offset import MAX_OFFSET_S, ROOT, offsets, shifted
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.validate.check import calibrations_in

SRC = ROOT / "benchmarks/results/tp_h100x2_c"


def _planted(tmp_path: Path, per_allreduce_s: float) -> Path:
    """The folder with verify-tp2.json's collectives set to the model's + the planted offset."""
    for p in SRC.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    cal = next(iter(calibrations_in(tmp_path).values()))
    doc = json.loads((tmp_path / "verify-tp2.json").read_text())
    target = load_model(doc["target"])
    cm = CostModel(
        load_hardware(doc["hardware"]), target, load_model(doc["drafter"]), tp=2, calibration=cal
    )
    for r in doc["verify"]:
        comm = float(np.asarray(cm.verify_breakdown(r["batch"], r["tokens"], r["context"])["comm"]))
        r["seconds"] = r["seconds_nocomm"] + comm + per_allreduce_s * (2 * target.layers + 1)
    (tmp_path / "verify-tp2.json").write_text(json.dumps(doc))
    return tmp_path


@pytest.mark.parametrize("planted", [0.0, 4e-6, 2 * MAX_OFFSET_S])
def test_offset_recovers_a_planted_cost_and_is_bounded(tmp_path: Path, planted: float) -> None:
    folder = _planted(tmp_path, planted)
    cal = next(iter(calibrations_in(folder).values()))
    assert offsets(folder, cal)[2] == pytest.approx(min(planted, MAX_OFFSET_S), abs=1e-12)


def test_shift_raises_only_that_tps_latency() -> None:
    cal = next(iter(calibrations_in(SRC).values()))
    assert any(int(row[0]) == 2 for row in cal.allreduce_law)
    out = shifted(cal, {2: 3e-6, 4: 1e-6})
    for a, b in zip(cal.allreduce_law, out.allreduce_law, strict=True):
        extra = {2: 3e-6, 4: 1e-6}.get(int(a[0]), 0.0)
        assert b[2] == pytest.approx(a[2] + extra) and (b[0], b[1], b[3]) == (a[0], a[1], a[3])
    assert out.allgather_law == cal.allgather_law
