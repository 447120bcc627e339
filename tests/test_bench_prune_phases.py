"""benchmarks/bench_prune_phases.py: every run's phase shares add up to its step error, the
speedup error is check's, and runs are told apart by kind. CPU only."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_prune_phases import ROOT, main, phase_rows
from spectune.validate.check import check_folder

FOLDER = "measurements/h200-newuser3"


def test_phase_shares_add_up_to_the_step_error() -> None:
    rows = phase_rows(ROOT / FOLDER)
    assert {r["kind"] for r in rows} == {"dense", "echo", "pruned"}
    for r in rows:
        meas, pred = r["step_ms"]
        assert sum(r["share"].values()) == pytest.approx((pred - meas) / meas, abs=1e-9)
        # the measured phases are the step's (rest: what draft, verify and extend leave)
        assert sum(r["measured_ms"].values()) == pytest.approx(meas, rel=1e-12)


def test_speedup_errors_are_checks() -> None:
    """The same prediction as `spectune check` (check.price_run), run by run."""
    rows = phase_rows(ROOT / FOLDER)
    errors = sorted(r["speedup_error"] for r in rows)
    checked = sorted(r.error for r in check_folder(ROOT / FOLDER).speedup)
    assert errors == pytest.approx(checked, abs=1e-12)


def test_table_then_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([FOLDER]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    doc = json.loads(out[-1])
    assert doc["refit"] is False and "pruned B32+" in doc["summary"]
    assert all(r["kind"] in ("dense", "echo", "pruned") for r in doc["rows"])
    assert any(line.startswith("summary:") for line in out)
