"""The CPU side of tensor-parallel measurements: documents record tp, `spectune check` prices
each at its tp, and the interconnect fit (validate.fit.fit_interconnect) recovers a link from
all-reduce timings and never passes the link's published bandwidth."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spectune.planner.costmodel import CostModel
from spectune.specs import SpecError, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import check_folder
from spectune.validate.fit import fit_calibration, fit_interconnect
from spectune.validate.measure import doc_tp, validate_calibration_run, validate_measurement

H200 = Path(__file__).parent.parent / "measurements" / "h200"


def _folder(tmp: Path, tp: int | None) -> Path:
    tmp.mkdir()
    shutil.copy(H200 / "calibration-h200.json", tmp)
    doc = json.loads((H200 / "execute-planned.json").read_text())
    if tp is not None:
        doc["tp"] = tp
    (tmp / "m.json").write_text(json.dumps(doc))
    return tmp


def test_check_prices_a_document_at_its_tp(tmp_path: Path) -> None:
    one = check_folder(_folder(tmp_path / "a", None))
    two = check_folder(_folder(tmp_path / "b", 2))
    assert len(one.verify) == len(two.verify) > 0
    # the same runs predicted on 2 GPUs: faster verifies (half the weights per GPU), and
    # exactly the cost model's tp-2 price
    for a, b in zip(one.verify, two.verify, strict=True):
        assert b.predicted < a.predicted
    cal = Calibration.load(H200 / "calibration-h200.json")
    cm = CostModel(
        load_hardware("h200"),
        load_model("llama-3.1-8b"),
        load_model("eagle3-llama-3.1-8b"),
        tp=2,
        calibration=cal,
    )
    first = json.loads((tmp_path / "b" / "m.json").read_text())["runs"][0]
    want = float(np.asarray(cm.verify_time(first["batch"], 1, 4096)).reshape(-1)[0])
    assert two.verify[0].predicted == pytest.approx(want)


@pytest.mark.parametrize("bad", [0, 65, 2.5, "4", True, None])
def test_tp_field_is_bounded(bad: Any) -> None:
    doc = json.loads((H200 / "execute-planned.json").read_text())
    doc["tp"] = bad
    with pytest.raises(SpecError, match="'tp'"):
        validate_measurement(doc, "m.json")
    assert doc_tp({"x": 1}, "w") == 1


def _rows(
    eff: float, lat: float, tps: tuple[int, ...] = (2, 4), step: float = 0.0
) -> list[dict[str, Any]]:
    link = load_hardware("h100-sxm").interconnect_bytes_per_s
    rows = []
    for tp in tps:
        for size in (4096 << i for i in range(0, 16, 2)):
            t = 2 * (tp - 1) / tp * size / (link * eff) + lat + 2 * (tp - 1) * step
            rows.append({"op": "all_reduce", "tp": tp, "bytes": size, "seconds": t})
            rows.append({"op": "broadcast", "tp": tp, "bytes": size, "seconds": 1.0})
    return rows


LAUNCH_S = 4e-6  # h100-sxm's HardwareSpec.launch_s: what Calibration() prices a kernel launch at


def test_interconnect_fit_recovers_the_link() -> None:
    # swept seconds per call include the call's launch, which the forward counts apart
    cal, report = fit_interconnect(_rows(0.78, 6e-6, step=0.6e-6), "h100-sxm", Calibration())
    assert cal.interconnect_efficiency == pytest.approx(0.78, rel=1e-3)
    assert cal.allreduce_latency_s == pytest.approx(6e-6 - LAUNCH_S, rel=1e-3)
    assert cal.allreduce_step_latency_s == pytest.approx(0.6e-6, rel=1e-2)
    assert report["mape_ring_allreduce_tp4"] < 1e-3 and report["mape_allreduce_tp4"] < 1e-3
    assert cal.hardware == "h100-sxm" and "fit_interconnect" in cal.source
    # the cost model then prices exactly those all-reduces, launch included: 4 ranks, 1 MiB
    # (the tp-4 regime law), and at tp 8, which the sweep lacks, the ring law
    from spectune.planner.operators import Rates, allreduce_time

    r = Rates.resolve(load_hardware("h100-sxm"), cal)
    want = 1.5 * 2**20 / (450e9 * 0.78) + 6e-6 + 6 * 0.6e-6
    assert float(allreduce_time(r, 2**20, 4)) + r.launch_s == pytest.approx(want, rel=1e-3)
    want8 = 1.75 * 2**20 / (450e9 * 0.78) + 6e-6 + 14 * 0.6e-6
    assert float(allreduce_time(r, 2**20, 8)) + r.launch_s == pytest.approx(want8, rel=1e-3)
    # one tp cannot tell a step latency from the fixed one: it stays 0
    one, _ = fit_interconnect(_rows(0.78, 9e-6, tps=(4,)), "h100-sxm", Calibration())
    assert one.allreduce_step_latency_s == 0.0
    assert one.allreduce_latency_s == pytest.approx(9e-6 - LAUNCH_S, rel=1e-3)


def test_interconnect_fit_is_bounded_by_the_published_link() -> None:
    # timings implying 1.5x NVLink 4's 450 GB/s per direction: the fit stops at the link
    cal, _ = fit_interconnect(_rows(1.5, 5e-6), "h100-sxm", Calibration())
    assert cal.interconnect_efficiency == pytest.approx(1.0)
    with pytest.raises(SpecError, match="all-reduce rows"):
        fit_interconnect(_rows(0.8, 5e-6, tps=())[:1], "h100-sxm", Calibration())


def test_fit_calibration_adds_the_interconnect_when_the_run_has_all_reduces() -> None:
    run = json.loads((H200 / "calibrate-run.json").read_text())
    run["collectives"] = [dict(r, tp=int(r["tp"])) for r in _rows(0.7, 12e-6)]
    validate_calibration_run(run, "run")
    cal, report = fit_calibration(run, max_nfev=3)
    assert cal.interconnect_efficiency == pytest.approx(0.7, rel=1e-3)
    # the swept 12 us include one launch, at the launch cost this fit found
    assert report["link_allreduce_latency_us"] == pytest.approx(12.0 - cal.launch_s * 1e6, 1e-3)
    assert {row[0] for row in cal.allreduce_law} == {2.0, 4.0}
    bad = dict(run, collectives=[{"op": "all_reduce", "tp": 1, "bytes": 8, "seconds": 1e-5}])
    with pytest.raises(SpecError, match="collectives"):
        validate_calibration_run(bad, "run")
