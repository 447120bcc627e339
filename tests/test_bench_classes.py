"""benchmarks/bench_classes.py on the committed profiled run (CPU)."""

from __future__ import annotations

import json

import pytest

from benchmarks.bench_classes import main


def test_bench_classes_prices_every_profiled_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["bench"] == "classes" and len(doc["rows"]) == 32
    for r in doc["rows"]:
        assert r["measured"]["linear"] + r["measured"]["attention"] <= 1.1 * r["seconds"]
        assert r["model_kernels"] > 0 and r["kernels"] >= r["model_kernels"]
    assert doc["mape"]["forward"] < 0.05


def test_bench_classes_without_profiled_rows(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["measurements/h100-newuser3"]) == 1
    assert "kernel-classes" in capsys.readouterr().out
