"""The in-forward all-reduce offset (validate.fit.fit_inforward_offset, which `spectune
calibrate --tp N` adds to the all-reduce law at N) read off a split verify grid, and
benchmarks/probe_allreduce_offset.py over it (CPU, on the committed 2x H100 TP folder)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from benchmarks.probe_allreduce_offset import ROOT, main, offsets
from spectune.cli.calibrate import format_report
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import calibrations_in
from spectune.validate.fit import INFORWARD_OFFSET_MAX_S, fit_inforward_offset, fit_interconnect

SRC = ROOT / "benchmarks/results/tp_h100x2_c"


def _cal() -> Calibration:
    return next(iter(calibrations_in(SRC).values()))


def _planted(per_allreduce_s: float) -> dict:
    """verify-tp2.json with its collectives set to the model's + the planted cost per
    all-reduce (two a layer)."""
    doc = json.loads((SRC / "verify-tp2.json").read_text())
    target = load_model(doc["target"])
    cm = CostModel(
        load_hardware(doc["hardware"]), target, load_model(doc["drafter"]), tp=2,
        calibration=_cal(),
    )  # fmt: skip
    for r in doc["verify"]:
        comm = float(np.asarray(cm.verify_breakdown(r["batch"], r["tokens"], r["context"])["comm"]))
        r["seconds"] = r["seconds_nocomm"] + comm + per_allreduce_s * 2 * target.layers
    return doc


@pytest.mark.parametrize("planted", [0.0, 4e-6, -2e-6, 2 * INFORWARD_OFFSET_MAX_S, -1.0])
def test_offset_recovers_a_planted_cost_and_is_bounded(planted: float) -> None:
    # either sign: an all-reduce in the forward may cost less than the sweep timed it, but no
    # regime's latency goes below zero
    cal = _cal()
    moved, rep = fit_inforward_offset(_planted(planted), cal)
    least = min(row[2] for row in cal.allreduce_law if int(row[0]) == 2)
    want = float(np.clip(planted, -least, INFORWARD_OFFSET_MAX_S))
    assert rep is not None and rep["tp"] == 2 and rep["points"] == 12
    assert rep["offset_us"] == pytest.approx(want * 1e6, abs=1e-6)
    for a, b in zip(cal.allreduce_law, moved.allreduce_law, strict=True):
        extra = want if int(a[0]) == 2 else 0.0
        assert b[2] == pytest.approx(a[2] + extra, abs=1e-15)
        assert (b[0], b[1], b[3]) == (a[0], a[1], a[3])
    assert moved.allgather_law == cal.allgather_law
    line = format_report({"inforward_allreduce": rep})
    assert "inside the split forward" in line and "tp 2" in line


def test_no_offset_without_its_inputs() -> None:
    cal = _cal()
    doc = _planted(4e-6)
    for r in doc["verify"]:
        del r["seconds_nocomm"]
    assert fit_inforward_offset(doc, cal) == (cal, None)  # no grid timed without collectives
    lawless = dataclasses.replace(cal, allreduce_law=())
    assert fit_inforward_offset(_planted(4e-6), lawless) == (lawless, None)  # no law at tp 2
    assert fit_inforward_offset({**_planted(4e-6), "tp": 1}, cal) == (cal, None)


def test_probe_reports_the_shifted_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for p in SRC.glob("*.json"):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "verify-tp2.json").write_text(json.dumps(_planted(3e-6)))
    moved, offs = offsets(tmp_path, _cal())
    assert offs == {2: pytest.approx(3e-6, abs=1e-12)}
    assert moved.allreduce_law != _cal().allreduce_law
    assert main([str(SRC.relative_to(ROOT))]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc[0]["offset_s"]["2"] > 0 and "execute-tp2.json" in doc[0]["after"]


def test_calibrate_tp_run_shifts_its_law(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spectune calibrate --from-run` of a split run (grid with and without collectives, the
    sweep's rows): the interconnect refit, then the law at its tp raised by the planted cost."""
    from spectune.cli import main as cli

    doc = _planted(5e-6)
    doc["collectives"] = json.loads((SRC / "calibrate-run.json").read_text())["collectives"]
    run, out = tmp_path / "run.json", tmp_path / "cal.json"
    run.write_text(json.dumps(doc))
    base = SRC / "calibration-h100-sxm.json"
    assert cli(["calibrate", "--from-run", str(run), "--base", str(base), "--out", str(out)]) == 0
    assert "inside the split forward: +5.00 us" in capsys.readouterr().out
    got = Calibration.load(out)
    unshifted, _ = fit_interconnect(doc["collectives"], doc["hardware"], Calibration.load(base))
    for a, b in zip(unshifted.allreduce_law, got.allreduce_law, strict=True):
        assert b[2] == pytest.approx(a[2] + (5e-6 if int(a[0]) == 2 else 0.0), abs=1e-12)


def test_calibrate_split_grid_without_a_sweep_shifts_the_base_law(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A split grid without all-reduce rows (benchmarks/bench_tp.py's verify-tpN.json) keeps
    --base's interconnect terms and raises its law at the grid's tp; without --base it is
    refused with exit code 2, naming the file."""
    from spectune.cli import main as cli

    doc = _planted(5e-6)
    doc["collectives"] = []
    run, out = tmp_path / "verify-tp2.json", tmp_path / "cal.json"
    run.write_text(json.dumps(doc))
    base = SRC / "calibration-h100-sxm.json"
    assert cli(["calibrate", "--from-run", str(run), "--base", str(base), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "inside the split forward: +5.00 us" in printed and "--base's" in printed
    got, before = Calibration.load(out), Calibration.load(base)
    for a, b in zip(before.allreduce_law, got.allreduce_law, strict=True):
        assert b[2] == pytest.approx(a[2] + (5e-6 if int(a[0]) == 2 else 0.0), abs=1e-12)
    assert cli(["calibrate", "--from-run", str(run), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "pass --base" in err and str(run) in err and not (tmp_path / "x.json").exists()
