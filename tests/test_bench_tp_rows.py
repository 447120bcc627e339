"""benchmarks/bench_tp_rows.py: the TP execution rows of a folder, grouped over hosts."""

from __future__ import annotations

from typing import Any

import pytest

import benchmarks.bench_tp_rows as tool
from spectune.validate.check import calibrations_in

FOLDER = "benchmarks/results/tp_h100x2_h"


@pytest.fixture
def committed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder's committed calibration in place of a refit (the fit takes ~15 s)."""

    def cal(folder: str, extra: tuple[str, ...], *a: Any, **k: Any) -> tuple[Any, dict]:
        return next(iter(calibrations_in(tool.ROOT / folder).values())), {}

    monkeypatch.setattr(tool, "refit_calibration", cal)


def test_rows_of_both_timings(committed: None) -> None:
    got = tool.rows(FOLDER, ())
    # 12 runs, timed twice (execute-tp2.json and its repeat)
    assert len(got) == 24 and {r[0] for r in got} == {2}
    assert {r[1] for r in got} == {1, 8, 32, 64}
    b64 = [e for tp, b, label, e in got if b == 64 and label == "planned"]
    # check.txt of the folder: B64 planned 4/2/5 at +3.2% and +3.8%
    assert sorted(b64) == [pytest.approx(0.032, abs=1e-3), pytest.approx(0.038, abs=1e-3)]


def test_table(committed: None, capsys: pytest.CaptureFixture[str]) -> None:
    assert tool.main([FOLDER]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:4] == ["tp", "gpu", "B", "label"]
    row = next(line for line in out if " 64 planned " in line)
    assert row.split()[1] == "h100" and row.split()[-1] == "2"
    assert tool.gpu_of("measurements/h200x4-tp") == "h200"
