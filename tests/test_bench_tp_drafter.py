"""benchmarks/bench_tp.py's drafter-step table: a split grid's steps beside tp 1's (CPU)."""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.bench_tp import _draft_steps
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration

MODELS = {"hardware": "h200", "target": "llama-3.1-8b", "drafter": "eagle3-llama-3.1-8b"}


def _row(b: int, w: int, seconds: float, **extra: float) -> dict[str, Any]:
    return {"batch": b, "tokens": w, "context": 4096, "seconds": seconds, **extra}


def test_a_tp2_step_is_set_beside_the_same_step_at_tp1() -> None:
    docs = {
        "calibrate-run.json": {**MODELS, "draft": [_row(1, 4, 290e-6), _row(8, 4, 330e-6)]},
        "verify-tp2.json": {
            **MODELS,
            "tp": 2,
            "draft": [
                _row(1, 4, 237e-6, seconds_nocomm=200e-6),
                _row(8, 10, 327e-6, seconds_nocomm=270e-6),  # no tp 1 step of this shape
            ],
        },
    }
    tp_of = {"calibrate-run.json": 1, "verify-tp2.json": 2}
    lines: list[str] = []
    rows = _draft_steps(docs, tp_of, {}, lines)
    assert [(r["batch"], r["width"]) for r in rows] == [(1, 4), (8, 10)]
    first, second = rows
    assert first["vs_tp1_us"] == pytest.approx(-53.0)
    assert first["collectives_us"] == pytest.approx(37.0)
    # the priced change is the model's own step at tp 2 less its step at tp 1: the shard's
    # GEMMs get cheaper, its collectives are added
    hw, t, d = (load_hardware("h200"), load_model(MODELS["target"]), load_model(MODELS["drafter"]))

    def price(tp: int) -> float:
        cm = CostModel(hw, t, d, tp=tp, calibration=Calibration())
        parts = cm.draft_step_breakdown(1, 4, 4096)
        return sum(float(v) for v in parts.values()) + float(cm.draft_select_time(4))

    assert first["model_vs_tp1_us"] == pytest.approx((price(2) - price(1)) * 1e6)
    assert first["model_vs_tp1_us"] < 0
    assert "vs_tp1_us" not in second
    assert "vs tp 1" in lines[1] and len(lines) == 4
