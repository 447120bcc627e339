"""benchmarks/probe_tp_forward.py --gemm-plan: the plan file it reads (CPU)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.probe_tp_forward import read_plan
from spectune.specs import SpecError

PLAN = {
    "3072x4096@32": "cublas",
    "3072x4096@64": "splitk1/128x128/8w3s",
    "4096x7168@32+silu": "splitk2",
}


def _write(tmp_path: Path, obj: object) -> str:
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(obj))
    return str(path)


def test_reads_a_documents_plan_and_a_bare_plan(tmp_path: Path) -> None:
    assert read_plan(_write(tmp_path, {"gpu": "x", "gemm_plan": PLAN})) == PLAN
    assert read_plan(_write(tmp_path, PLAN)) == PLAN


@pytest.mark.parametrize(
    "bad",
    [
        {"gemm_plan": {"3072x4096@33": "cublas"}},  # not a bucket of this build
        {"gemm_plan": {"3072x4096@32": "magic"}},  # not a variant
        {"gemm_plan": ["cublas"]},  # not an object
    ],
)
def test_refuses_a_malformed_plan_naming_the_file(tmp_path: Path, bad: object) -> None:
    path = _write(tmp_path, bad)
    with pytest.raises(SpecError, match=r"plan\.json"):
        read_plan(path)
