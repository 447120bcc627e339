"""benchmarks/bench_tp.py's pairing of a TP run's executions with their second timing."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_tp import _repeats, repeat_moves
from spectune.validate.check import check_folder

RUN = Path(__file__).resolve().parent.parent / "benchmarks/results/tp_h100x2_g/execute-tp2.json"


def _slower(doc: dict[str, Any], batch: int, step: float, ar: float) -> dict[str, Any]:
    """`doc` with every run at `batch` timed `step` x (its step) and `ar` x (its AR step)."""
    out = copy.deepcopy(doc)
    for r in out["runs"]:
        if r["batch"] == batch:
            r["phases_ms"] = {k: v * step for k, v in r["phases_ms"].items()}
            r["ar_step_ms"] *= ar
            r["speedup"] *= ar / step
    return out


def test_the_move_is_the_speedup_ratio_with_acceptance_held() -> None:
    first = json.loads(RUN.read_text())
    rows = repeat_moves(first, _slower(first, 32, step=1.02, ar=1.0))
    assert len(rows) == 12 and all(r["same_accept"] for r in rows)
    moved = {(r["batch"], r["label"]): r["move"] for r in rows}
    assert moved[(32, "vllm-k3")] == pytest.approx(1 / 1.02 - 1)
    assert moved[(64, "vllm-k3")] == pytest.approx(0.0)
    # an AR step as much slower as the step moves nothing
    same = repeat_moves(first, _slower(first, 8, step=1.03, ar=1.03))
    assert max(abs(r["move"]) for r in same) == pytest.approx(0.0, abs=1e-12)


def test_a_run_missing_from_the_repeat_is_left_out() -> None:
    first = json.loads(RUN.read_text())
    second = copy.deepcopy(first)
    second["runs"] = [r for r in second["runs"] if r["batch"] != 64]
    assert {r["batch"] for r in repeat_moves(first, second)} == {1, 8, 32}


def test_the_summary_pairs_a_folder_s_repeat(tmp_path: Path) -> None:
    src = RUN.parent
    for name in ("calibration-h100-sxm.json", "execute-tp2.json"):
        (tmp_path / name).write_bytes((src / name).read_bytes())
    first = json.loads(RUN.read_text())
    (tmp_path / "execute-tp2-repeat.json").write_text(
        json.dumps(_slower(first, 64, step=1.0, ar=1.01))
    )
    docs = {p.name: json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))}
    lines: list[str] = []
    out = _repeats(docs, check_folder(tmp_path).speedup, lines)
    rep = out["execute-tp2.json"]
    assert rep["moves_max"] == pytest.approx(0.01)
    b64 = [r for r in rep["rows"] if r["batch"] == 64]
    # the repeat's measured speedups are 1% higher at B64: check's errors there that much lower
    for r in b64:
        assert (1 + r["error"]) / (1 + r["error_repeat"]) - 1 == pytest.approx(r["move"])
        assert r["move"] == pytest.approx(0.01)
    assert any("repeat moves" in line for line in lines)
