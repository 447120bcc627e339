"""The "gemm_plan" field of measurement and calibration-run documents: the GEMM variant each
weight shape and token bucket ran in the process that measured them (kernels.gemm.GemmPlan)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectune.kernels.gemm import VARIANTS, GemmPlan
from spectune.specs import SpecError
from spectune.validate.measure import (
    MAX_PLAN_ENTRIES,
    gemm_plan,
    validate_calibration_run,
    validate_measurement,
)

PLAN = GemmPlan(
    {(6144, 4096, 1, False): "splitk1/32x128/4w5s", (4096, 14336, 16, True): "cublas",
     (28672, 4096, 64, False): "splitk4/128x128/8w3s"}
).to_dict()  # fmt: skip


#: a committed run's documents (written before the field existed)
FOLDER = Path(__file__).resolve().parent.parent / "measurements" / "h100-newuser15"


def _docs() -> list[tuple[dict[str, Any], Any]]:
    return [
        (json.loads((FOLDER / "execute-planned.json").read_text()), validate_measurement),
        (json.loads((FOLDER / "calibrate-run.json").read_text()), validate_calibration_run),
    ]


def test_every_autotune_variant_is_accepted() -> None:
    for v in VARIANTS:
        assert gemm_plan({"gemm_plan": {"4096x4096@1": v}}, "doc") == {"4096x4096@1": v}
    assert gemm_plan({}, "doc") == {}
    assert gemm_plan({"gemm_plan": PLAN}, "doc") == PLAN


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (["cublas"], "must be an object"),
        ({"4096x4096": "cublas"}, "is not NxK@M"),
        ({"4096x4096@1+gelu": "cublas"}, "is not NxK@M"),
        ({"4096x4096@1": "triton"}, "is not a GEMM variant"),
        ({"4096x4096@1": 3}, "is not a GEMM variant"),
        ({f"{n}x4096@1": "cublas" for n in range(MAX_PLAN_ENTRIES + 1)}, "more than"),
    ],
)
def test_documents_refuse_a_malformed_plan(plan: object, match: str) -> None:
    for doc, validate in _docs():
        validate(doc, "doc.json")  # valid without a plan
        bad = copy.deepcopy(doc)
        bad["gemm_plan"] = plan
        with pytest.raises(SpecError, match=match):
            validate(bad, "doc.json")
        good = copy.deepcopy(doc)
        good["gemm_plan"] = PLAN
        validate(good, "doc.json")


@given(st.dictionaries(st.text(max_size=20), st.text(max_size=20), max_size=5))
def test_arbitrary_plans_are_accepted_or_refused_cleanly(plan: dict[str, str]) -> None:
    try:
        out = gemm_plan({"gemm_plan": plan}, "doc")
    except SpecError as e:
        assert "gemm_plan" in str(e)
    else:
        assert out == plan
