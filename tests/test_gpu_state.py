"""executor.gpu_state: the SM clock and power sampled while a run is timed, and the run record's
"gpu_state" field (validate.measure.gpu_state)."""

from __future__ import annotations

import copy
import json
import math
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectune.executor import gpu_state as gs
from spectune.specs import SpecError
from spectune.validate.measure import gpu_state, validate_calibration_run, validate_measurement

FOLDER = Path(__file__).resolve().parent.parent / "measurements" / "h100-newuser17"


def _fake_nvml(clocks: list[int], power_mw: int = 690_000, limit_mw: int = 700_000) -> Any:
    """A stand-in pynvml: clock readings from `clocks` in turn (the last one repeated)."""
    it = iter(clocks)
    last = {"v": clocks[-1]}

    def clock(_h: object, _kind: int) -> int:
        last["v"] = next(it, last["v"])
        return last["v"]

    return types.SimpleNamespace(
        NVML_CLOCK_SM=1,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetHandleByUUID=lambda u: ("h", u),
        nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetClockInfo=clock,
        nvmlDeviceGetPowerUsage=lambda _h: power_mw,
        nvmlDeviceGetEnforcedPowerLimit=lambda _h: limit_mw,
    )


@pytest.fixture
def fake_gpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    import torch

    seen: dict[str, object] = {}

    def props(i: int) -> Any:
        seen["index"] = i
        return types.SimpleNamespace(uuid="b0844e23-0114-b0ce-f5af-04c638aec3d6")

    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    monkeypatch.setitem(sys.modules, "pynvml", _fake_nvml([1980, 1410, 1600]))
    return seen


def test_the_sampler_summarizes_clock_and_power(fake_gpu: dict[str, object]) -> None:
    with gs.GpuSampler(0, period_s=0.001) as s:
        deadline = time.monotonic() + 10.0
        while len(s._clocks) < 5 and time.monotonic() < deadline:
            time.sleep(0.001)
    st_ = s.state()
    assert st_ is not None and st_["samples"] >= 5
    assert st_["sm_clock_min_mhz"] == 1410.0
    assert st_["power_w"] == 690.0 and st_["power_limit_w"] == 700.0
    assert st_["at_power_limit"] == 1.0  # 690 W >= 97% of 700 W
    gpu_state(st_, "run")  # the record it makes passes the document's validator
    assert fake_gpu["index"] == 0


def test_no_nvml_records_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    with gs.GpuSampler(0) as s:
        pass
    assert s.state() is None


def test_a_cpu_session_records_nothing(fake_gpu: dict[str, object]) -> None:
    with gs.GpuSampler(None) as s:  # measure_runs' device index on CPU
        pass
    assert s.state() is None and "index" not in fake_gpu


def test_summarize() -> None:
    assert gs.summarize([], [], 700.0) is None
    out = gs.summarize([1980, 1500, 1900], [300.0, 700.0, 690.0], 700.0)
    assert out == {
        "sm_clock_mhz": 1900.0,
        "sm_clock_min_mhz": 1500.0,
        "samples": 3,
        "power_w": 690.0,
        "power_limit_w": 700.0,
        "at_power_limit": pytest.approx(2 / 3),
    }
    assert "at_power_limit" not in gs.summarize([1980], [300.0], None)  # type: ignore[operator]


GOOD = {"sm_clock_mhz": 1950.0, "sm_clock_min_mhz": 1410.0, "samples": 240, "power_w": 580.0,
        "power_limit_w": 700.0, "at_power_limit": 0.15}  # fmt: skip


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"sm_clock_mhz": math.nan}, "sm_clock_mhz"),
        ({"at_power_limit": 1.5}, "at_power_limit"),
        ({"samples": 2.5}, "must be an integer"),
        ({"power_w": -1.0}, "power_w"),
        ({"clock": 1.0}, "unknown field 'clock'"),
    ],
)
def test_documents_refuse_a_malformed_gpu_state(change: dict[str, object], match: str) -> None:
    doc = json.loads((FOLDER / "execute-planned.json").read_text())
    for key in ("gpu_state", "ar_gpu_state"):
        good = copy.deepcopy(doc)
        good["runs"][1][key] = dict(GOOD)
        validate_measurement(good, "m.json")
        bad = copy.deepcopy(doc)
        bad["runs"][1][key] = {**GOOD, **change}
        with pytest.raises(SpecError, match=match):
            validate_measurement(bad, "m.json")
    for missing in ("sm_clock_mhz", "samples"):
        with pytest.raises(SpecError, match=f"'{missing}' is missing"):
            gpu_state({k: v for k, v in GOOD.items() if k != missing}, "run")


def test_a_calibration_runs_speculative_runs_may_carry_it() -> None:
    run = json.loads((FOLDER / "calibrate-run.json").read_text())
    run["spec_runs"]["runs"][0]["gpu_state"] = dict(GOOD)
    validate_calibration_run(run, "calibrate-run.json")
    run["spec_runs"]["runs"][0]["gpu_state"] = {**GOOD, "power_limit_w": 0.0}
    with pytest.raises(SpecError, match="power_limit_w"):
        validate_calibration_run(run, "calibrate-run.json")


@given(st.dictionaries(st.sampled_from([*GOOD, "x"]), st.floats(allow_nan=True), max_size=7))
def test_arbitrary_states_are_accepted_or_refused_cleanly(state: dict[str, float]) -> None:
    try:
        gpu_state(state, "run")
    except SpecError as e:
        assert str(e).startswith("run:")


def test_the_first_gpu_recorded_runs_carry_a_plausible_state() -> None:
    """measurements/h200-newuser10 was timed with the sampler on an H200: every run and its
    baseline carry a state the validator accepts, sampled more than once, with the lowest clock
    at or under the median, and the H200's 700 W limit."""
    folder = FOLDER.parent / "h200-newuser10"
    run = json.loads((folder / "calibrate-run.json").read_text())
    docs = {"calibrate-run.json": run["spec_runs"]["runs"]}
    for name in ("execute-planned.json", "execute-trace-humaneval.json"):
        docs[name] = json.loads((folder / name).read_text())["runs"]
    for name, runs in docs.items():
        assert runs, name
        for i, r in enumerate(runs):
            for key in ("gpu_state", "ar_gpu_state"):
                state = r[key]
                gpu_state(state, f"{name} runs[{i}].{key}")
                assert state["samples"] >= 2
                assert 0 < state["sm_clock_min_mhz"] <= state["sm_clock_mhz"] <= 2100
                assert state["power_limit_w"] == pytest.approx(700.0)
                assert 0.0 <= state["at_power_limit"] <= 1.0


@pytest.mark.gpu
def test_the_sampler_reads_this_gpu() -> None:
    """On a GPU with its driver and nvidia-ml-py (the gpu extra): a third of a second of
    matmuls gives several samples of a plausible clock and the enforced power limit."""
    import torch

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    with gs.GpuSampler(torch.cuda.current_device(), period_s=0.02) as s:
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            a = (a @ a).clamp_(-1, 1)
        torch.cuda.synchronize()
    st_ = s.state()
    assert st_ is not None, (
        "no NVML: install the gpu extra (nvidia-ml-py) on a machine with a driver"
    )
    gpu_state(st_, "run")
    assert st_["samples"] >= 3
    assert 200 <= st_["sm_clock_min_mhz"] <= st_["sm_clock_mhz"] <= 3500
    assert st_.get("power_limit_w", 0) > 0
