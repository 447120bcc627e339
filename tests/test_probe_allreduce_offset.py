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
from spectune.specs.calibration import Calibration, link_law_time
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


def _law(cal: Calibration, sizes: np.ndarray) -> np.ndarray:
    return link_law_time(cal.allreduce_law, "all_reduce", 2, sizes)


#: the message sizes tp_h100x2_c's split grid times (B x N tokens of hidden 4096, bf16)
SIZES = np.array(
    sorted({r["batch"] * r["tokens"] * 4096 * 2.0
            for r in json.loads((SRC / "verify-tp2.json").read_text())["verify"]})
)  # fmt: skip
#: 1 B to 1 GiB
FINE = np.geomspace(1, 2**30, 2000)


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
    assert all(b["offset_us"] == pytest.approx(want * 1e6, abs=1e-6) for b in rep["by_size"])
    # the same cost at every size: the law moves by it at every size the grid timed, below the
    # smallest and above the largest; between them it never falls
    assert _law(moved, SIZES) == pytest.approx(_law(cal, SIZES) + want, abs=1e-12)
    outside = FINE[(SIZES[0] > FINE) | (SIZES[-1] <= FINE)]
    assert _law(moved, outside) == pytest.approx(_law(cal, outside) + want, abs=1e-12)
    assert np.all(np.diff(_law(moved, FINE)) >= 0)
    assert moved.allgather_law == cal.allgather_law
    line = format_report({"inforward_allreduce": rep})
    assert "inside the split forward" in line and "tp 2" in line and "by size" in line


def _planted_by_size(cost: dict[float, float], base: float) -> dict:
    """_planted(base), with `cost` (bytes -> s an all-reduce) in place of `base` at those sizes."""
    doc = _planted(0.0)
    layers = load_model(doc["target"]).layers
    for r in doc["verify"]:
        b = r["batch"] * r["tokens"] * 4096 * 2
        r["seconds"] += cost.get(b, base) * 2 * layers
    return doc


def test_each_size_timed_twice_keeps_its_own_offset() -> None:
    # tp_h100x2_c's grid (N 1 / 16 / 64) times 512 tokens (4 MiB) and 64 tokens twice, every
    # other size once: 4 MiB costs 6 us more than the rest, which cost 1 us
    cal = _cal()
    mib4 = 512 * 4096 * 2.0
    moved, rep = fit_inforward_offset(_planted_by_size({mib4: 7e-6}, 1e-6), cal)
    assert rep is not None
    got = {b["bytes"]: (b["offset_us"], b["points"]) for b in rep["by_size"]}
    assert got[mib4] == (pytest.approx(7.0), 2)
    assert got[64 * 8192.0] == (pytest.approx(1.0), 2)
    once = [b for b in rep["by_size"] if b["points"] == 1]
    assert once and all(b["offset_us"] == pytest.approx(1.0) for b in once)  # the median of all
    # the law passes through each size's time + its own cost, and never falls with size
    for b, extra in ((mib4, 7e-6), (64 * 8192.0, 1e-6), (8192.0, 1e-6)):
        assert _law(moved, np.array([b]))[0] == pytest.approx(_law(cal, np.array([b]))[0] + extra)
    assert np.all(np.diff(_law(moved, FINE)) >= 0)


def test_a_cheaper_size_cannot_make_a_larger_message_faster() -> None:
    # a large offset at the smallest size timed twice and a negative one at the largest: the
    # pieces after the large one are raised to meet it
    doc = json.loads((SRC / "verify-tp2.json").read_text())
    sizes = sorted({r["batch"] * r["tokens"] * 4096 * 2.0 for r in doc["verify"]})
    twice = [b for b in sizes if sum(
        r["batch"] * r["tokens"] * 4096 * 2.0 == b for r in doc["verify"]) >= 2]  # fmt: skip
    lo, hi = twice[0], twice[-1]
    moved, _ = fit_inforward_offset(_planted_by_size({lo: 40e-6, hi: -5e-6}, 0.0), _cal())
    assert np.all(np.diff(_law(moved, FINE)) >= 0)
    # the law's bandwidths stay, within the link (Rates.resolve checks)
    hw = load_hardware(doc["hardware"])
    assert max(r[3] for r in moved.allreduce_law) <= hw.interconnect_bytes_per_s
    CostModel(hw, load_model(doc["target"]), load_model(doc["drafter"]), tp=2, calibration=moved)
    assert _law(moved, np.array([lo]))[0] == pytest.approx(_law(_cal(), np.array([lo]))[0] + 40e-6)


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
    assert _law(got, SIZES) == pytest.approx(_law(unshifted, SIZES) + 5e-6, abs=1e-12)


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
    assert _law(got, SIZES) == pytest.approx(_law(before, SIZES) + 5e-6, abs=1e-12)
    # the other tp keep their rows
    assert [r for r in got.allreduce_law if r[0] != 2] == [
        r for r in before.allreduce_law if r[0] != 2
    ]
    assert cli(["calibrate", "--from-run", str(run), "--out", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err
    assert "pass --base" in err and str(run) in err and not (tmp_path / "x.json").exists()
