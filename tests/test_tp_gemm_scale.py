"""Calibration.tp_gemm_scale: weight-GEMM time at a tensor-parallel degree and hidden size scaled by
row count (specs.calibration.tp_gemm_scale_at, planner.forward.ForwardPricer._linear), and its
fit from a split verify grid (validate.fit.fit_tp_gemm_scale, which `spectune calibrate
--from-run verify-tpN.json --base` runs after the in-forward all-reduce offset)."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.planner.costmodel import CostModel
from spectune.planner.forward import ATTENTION, COMM, LM_HEAD, MLP, QKV_O
from spectune.specs import SpecError, load_hardware, load_model
from spectune.specs.calibration import (
    TP_GEMM_SCALE_MAX,
    TP_GEMM_SCALE_MIN,
    Calibration,
    tp_gemm_scale_at,
)
from spectune.validate.fit import TP_GEMM_SCALE_CLIP, fit_tp_gemm_scale

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "benchmarks/results/tp_h200x2_q"
H = 4096.0  # Llama-3.1-8B's hidden size
ROWS = ((2.0, H, 1.0, 1.0), (2.0, H, 32.0, 1.08), (2.0, H, 128.0, 0.96))


def _cm(cal: Calibration, tp: int = 2) -> CostModel:
    return CostModel(
        load_hardware("h200"), load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b"),
        tp=tp, calibration=cal,
    )  # fmt: skip


def test_factor_is_interpolated_in_log_rows_and_held_at_the_ends() -> None:
    got = tp_gemm_scale_at(ROWS, 2, 4096, [0.5, 1, 32, 128, 4096, math.sqrt(32 * 128)])
    assert got == pytest.approx([1.0, 1.0, 1.08, 0.96, 0.96, 1.02])
    # between 1 and 32 rows: a fifth of the way in log rows at 2 rows
    assert tp_gemm_scale_at(ROWS, 2, 4096, 2.0) == pytest.approx(1.0 + 0.08 / 5)
    # another tp, another hidden size, no rows: 1
    assert tp_gemm_scale_at(ROWS, 4, 4096, [1, 64]).tolist() == [1.0, 1.0]
    assert tp_gemm_scale_at(ROWS, 2, 8192, [1, 64]).tolist() == [1.0, 1.0]
    assert tp_gemm_scale_at((), 2, 4096, 7.0) == 1.0


def test_only_weight_gemms_of_that_tp_and_hidden_size_move() -> None:
    flat = Calibration(hardware="h200", tp_gemm_scale=((2.0, H, 1.0, 1.1),))
    plain, scaled = _cm(Calibration(hardware="h200")), _cm(flat)
    a, b = plain.verify_breakdown(8, 4, 4096), scaled.verify_breakdown(8, 4, 4096)
    for cls in (QKV_O, MLP):
        assert float(b[cls]) == pytest.approx(1.1 * float(a[cls]))
    # the LM head GEMM scales, its logits pass does not: more than a, less than 1.1 a
    assert float(a[LM_HEAD]) < float(b[LM_HEAD]) < 1.1 * float(a[LM_HEAD])
    for cls in (ATTENTION, COMM):
        assert float(b[cls]) == float(a[cls])
    # the EAGLE-3 head (hidden 4096, the target's layer shapes) takes the same factors; the
    # other tp and a target of another hidden size keep their price
    d0, d1 = plain.draft_step_breakdown(8, 4, 4096), scaled.draft_step_breakdown(8, 4, 4096)
    assert float(d1[MLP]) == pytest.approx(1.1 * float(d0[MLP]))
    assert float(d1[ATTENTION]) == float(d0[ATTENTION])
    wide = Calibration(hardware="h200", tp_gemm_scale=((2.0, 8192.0, 1.0, 1.1),))
    assert float(_cm(wide).verify_time(8, 4, 4096)) == float(plain.verify_time(8, 4, 4096))
    for tp in (1, 4):
        assert float(_cm(flat, tp).verify_time(8, 4, 4096)) == float(
            _cm(Calibration(hardware="h200"), tp).verify_time(8, 4, 4096)
        )


def test_rows_round_trip(tmp_path: Path) -> None:
    cal = Calibration(hardware="h200", tp_gemm_scale=ROWS)
    cal.save(tmp_path / "c.json")
    assert Calibration.load(tmp_path / "c.json").tp_gemm_scale == ROWS


@pytest.mark.parametrize(
    "rows",
    [
        ((2.0, 1.0, 1.0),),
        ((1.0, H, 1.0, 1.0),),
        ((2.5, H, 1.0, 1.0),),
        ((2.0, 0.0, 1.0, 1.0),),
        ((2.0, 4095.5, 1.0, 1.0),),
        ((2.0, H, 0.0, 1.0),),
        ((2.0, H, 1.0, TP_GEMM_SCALE_MAX * 1.01),),
        ((2.0, H, 1.0, TP_GEMM_SCALE_MIN * 0.99),),
        ((2.0, H, 1.0, float("nan")),),
        ((2.0, H, float("inf"), 1.0),),
        ((2.0, float("nan"), 1.0, 1.0),),
        ((2.0, H, 8.0, 1.0), (2.0, H, 8.0, 1.1)),
    ],
)
def test_malformed_rows_are_refused_naming_the_field(rows: tuple) -> None:
    with pytest.raises(SpecError, match="tp_gemm_scale"):
        Calibration(tp_gemm_scale=rows)


def test_a_file_with_a_bad_row_names_field_and_file(tmp_path: Path) -> None:
    doc = Calibration(hardware="h200").to_dict()
    doc["tp_gemm_scale"] = [[2, 4096, 8, 5.0]]
    path = tmp_path / "cal.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(SpecError, match="tp_gemm_scale") as err:
        Calibration.load(path)
    assert str(path) in str(err.value)


_num = st.floats(allow_nan=True, allow_infinity=True, width=64)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_num, _num, _num, _num), max_size=4))
def test_any_rows_are_accepted_in_bounds_or_refused(rows: list[tuple[float, ...]]) -> None:
    try:
        cal = Calibration(tp_gemm_scale=tuple(rows))
    except SpecError:
        return
    for tp, h, m, s in cal.tp_gemm_scale:
        assert tp == int(tp) >= 2 and h == int(h) >= 1 and m >= 1
        assert TP_GEMM_SCALE_MIN <= s <= TP_GEMM_SCALE_MAX
        got = tp_gemm_scale_at(cal.tp_gemm_scale, int(tp), int(h), [1.0, m, 1e6])
        assert np.all(np.isfinite(got))


def _grid(cal: Calibration, truth: tuple[tuple[float, ...], ...]) -> dict:
    """A split grid (B {1, 8} x N {1, 4, 16}: row counts 1, 4, 16, 8, 32, 128, each once) whose
    forwards cost what `cal` with the factors `truth` prices."""
    cm = _cm(dataclasses.replace(cal, tp_gemm_scale=truth))
    verify = [
        {"batch": b, "tokens": n, "context": 4096,
         "seconds": float(np.asarray(cm.verify_time(b, n, 4096)))}
        for b in (1, 8) for n in (1, 4, 16)
    ]  # fmt: skip
    return {"tp": 2, "hardware": "h200", "target": "llama-3.1-8b",
            "drafter": "eagle3-llama-3.1-8b", "verify": verify}  # fmt: skip


def test_fit_recovers_planted_factors_and_keeps_other_tp() -> None:
    truth = tuple((2.0, H, float(m), s) for m, s in
                  ((1, 1.01), (4, 1.03), (8, 1.05), (16, 1.04), (32, 1.09), (128, 0.95)))  # fmt: skip
    other = ((4.0, H, 8.0, 1.2), (2.0, 8192.0, 8.0, 0.9))
    cal = Calibration(hardware="h200", tp_gemm_scale=((2.0, H, 8.0, 1.2), *other))
    got, report = fit_tp_gemm_scale(_grid(Calibration(hardware="h200"), truth), cal)
    assert report is not None and (report["tp"], report["hidden"]) == (2, 4096)
    mine = sorted(r for r in got.tp_gemm_scale if r[:2] == (2.0, H))
    assert [r[2] for r in mine] == [r[2] for r in sorted(truth)]
    assert [r[3] for r in mine] == pytest.approx([r[3] for r in sorted(truth)], rel=1e-9)
    assert [r for r in got.tp_gemm_scale if r[:2] != (2.0, H)] == list(other)
    assert [b["points"] for b in report["by_rows"]] == [1] * 6


def test_fit_clips_and_skips_what_is_not_a_split_grid() -> None:
    cal = Calibration(hardware="h200")
    doc = _grid(cal, ())
    for r in doc["verify"]:
        r["seconds"] *= 3.0
    got, _ = fit_tp_gemm_scale(doc, cal)
    assert {r[3] for r in got.tp_gemm_scale} == {TP_GEMM_SCALE_CLIP[1]}
    assert fit_tp_gemm_scale({**doc, "tp": 1}, cal) == (cal, None)
    assert fit_tp_gemm_scale({**doc, "verify": []}, cal) == (cal, None)


def test_calibrate_from_a_split_grid_writes_and_reports_the_factors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spectune.cli import main as cli

    out = tmp_path / "cal.json"
    base = SRC / "calibration-h200.json"
    grid = SRC / "verify-tp2.json"
    assert cli(["calibrate", "--from-run", str(grid), "--base", str(base), "--out", str(out)]) == 0
    assert "weight GEMMs at tp 2 (hidden 4096) against their price" in capsys.readouterr().out
    rows = Calibration.load(out).tp_gemm_scale
    doc = json.loads(grid.read_text())
    assert sorted(r[2] for r in rows if r[:2] == (2.0, H)) == sorted(
        {float(r["batch"] * r["tokens"]) for r in doc["verify"]}
    )


def test_the_tp_summary_lists_the_factors(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/bench_tp.py summary prints each (tp, hidden)'s factors and carries them in
    its JSON (a folder with tp 2 fitted on the 8B and tp 4 on the 70B)."""
    from benchmarks.bench_tp import main

    folder = ROOT / "measurements/h200x4-tp"
    assert main(["summary", str(folder)]) == 0
    text = capsys.readouterr().out
    assert "weight GEMMs at tp 2 (hidden 4096) by rows: 1 x" in text
    assert "weight GEMMs at tp 4 (hidden 8192) by rows: 1 x" in text
    doc = json.loads(text.strip().splitlines()[-1])
    assert {(r[0], r[1]) for r in doc["tp_gemm_scale"]} == {(2.0, 4096.0), (4.0, 8192.0)}
