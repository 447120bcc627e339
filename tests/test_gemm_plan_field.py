"""The kernel plans of measurement and calibration-run documents (specs.kernel_plan): the GEMM
variant each weight shape and token bucket ran ("gemm_plan", kernels.gemm.GemmPlan; run again
with `spectune execute --gemm-plan`) and the tree-attention launch tuned per verify shape
("attention_plan"); `spectune check` notes where a measurement's differ from its calibration
run's."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from spectune.kernels.gemm import M_BUCKETS, VARIANTS, GemmPlan, autotune, planned_seconds
from spectune.specs import SpecError
from spectune.specs.kernel_plan import (
    MAX_PLAN_ENTRIES,
    attention_key,
    attention_launch,
    check_attention_plan,
)
from spectune.validate.measure import (
    gemm_plan,
    validate_calibration_run,
    validate_measurement,
)

PLAN = GemmPlan(
    {(6144, 4096, 1, False): "splitk1/32x128/4w5s", (4096, 14336, 16, True): "cublas",
     (28672, 4096, 64, False): "splitk4/128x128/8w3s", (4096, 7168, 32, False): "cublaslt"}
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


# ---- the planned variants' timed seconds: kernels.gemm.planned_seconds, "gemm_plan_seconds" ----


def test_planned_seconds_are_the_planned_variants_timings() -> None:
    """Each entry's planned variant's timing; entries whose variant was not timed (a fixed
    plan's) and failed candidates give none."""
    plan = GemmPlan({(4096, 4096, 1, False): "splitk2", (4096, 4096, 16, False): "cublas",
                     (4096, 14336, 1, True): "cublaslt"})  # fmt: skip
    rows = [
        {"n": 4096, "k": 4096, "m": 1, "gated": False, "variant": "cublas", "seconds": 9e-6},
        {"n": 4096, "k": 4096, "m": 1, "gated": False, "variant": "splitk2", "seconds": 8e-6},
        {"n": 4096, "k": 4096, "m": 16, "gated": False, "variant": "cublas", "seconds": 1e-5},
        {"n": 4096, "k": 14336, "m": 1, "gated": True, "variant": "cublaslt", "error": "x"},
    ]
    assert planned_seconds(plan, rows) == {"4096x4096@1": 8e-6, "4096x4096@16": 1e-5}


@pytest.mark.parametrize(
    ("seconds", "match"),
    [
        ([1e-5], "must be an object"),
        ({"4096x4096@64": 1e-5}, "is not an entry of gemm_plan"),
        ({"6144x4096@1": 0.0}, "is not a number of seconds"),
        ({"6144x4096@1": -1e-5}, "is not a number of seconds"),
        ({"6144x4096@1": 2.0}, "is not a number of seconds"),
        ({"6144x4096@1": True}, "is not a number of seconds"),
        ({"6144x4096@1": "1e-5"}, "is not a number of seconds"),
        ({f"{n}x4096@1": 1e-5 for n in range(MAX_PLAN_ENTRIES + 1)}, "more than"),
    ],
)
def test_documents_refuse_malformed_plan_seconds(seconds: object, match: str) -> None:
    for doc, validate in _docs():
        bad = copy.deepcopy(doc)
        bad["gemm_plan"], bad["gemm_plan_seconds"] = PLAN, seconds
        with pytest.raises(SpecError, match=match):
            validate(bad, "doc.json")
        good = copy.deepcopy(doc)
        good["gemm_plan"], good["gemm_plan_seconds"] = PLAN, {"6144x4096@1": 1.2e-5}
        validate(good, "doc.json")


@given(st.dictionaries(st.sampled_from(sorted(PLAN)), st.floats(allow_nan=True), max_size=4))
def test_arbitrary_plan_seconds_are_accepted_or_refused_cleanly(seconds: dict[str, float]) -> None:
    try:
        gemm_plan({"gemm_plan": PLAN, "gemm_plan_seconds": seconds}, "doc")
    except SpecError as e:
        assert "gemm_plan_seconds" in str(e)
    else:
        assert all(0 < t <= 1 for t in seconds.values())


# ---- a recorded plan run again: GemmPlan.from_dict, autotune(fixed=), execute --gemm-plan ----

CHOICES = st.dictionaries(
    st.tuples(
        st.integers(1, 65536), st.integers(1, 65536), st.sampled_from(M_BUCKETS), st.booleans()
    ),
    st.sampled_from(VARIANTS),
    max_size=20,
)


@given(CHOICES)
def test_a_written_plan_reads_back_as_the_same_plan(choice: dict) -> None:
    plan = GemmPlan(choice)
    assert GemmPlan.from_dict(plan.to_dict(), "doc").choice == choice


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        ({"4096x4096@2": "cublas"}, "bucket 2 is not one of"),
        ({"4096x4096@1": "splitk3"}, "not a variant of this build"),
        ({"0x4096@1": "cublas"}, "zero dimension"),
        ({"4096x4096@1": "gemv"}, "is not a GEMM variant"),
    ],
)
def test_from_dict_refuses_what_this_build_cannot_run(plan: object, match: str) -> None:
    with pytest.raises(SpecError, match=match):
        GemmPlan.from_dict(plan, "cal.json")


def test_autotune_keeps_a_fixed_plans_shapes_untimed() -> None:
    """Every requested shape covered at every bucket: nothing is timed (so this runs on CPU),
    and the plan holds exactly the fixed choices of the requested shapes."""
    shapes, gated = [(6144, 4096), (4096, 4096)], [(4096, 14336)]
    full = {(n, k, m, g): VARIANTS[(n + m) % len(VARIANTS)]
            for n, k, g in [(6144, 4096, False), (4096, 4096, False), (4096, 14336, True),
                            (999, 4096, False)]
            for m in M_BUCKETS}  # fmt: skip
    plan, rows = autotune(shapes, torch.device("cpu"), gated=gated, fixed=GemmPlan(full))
    assert rows == []
    assert plan.choice == {key: v for key, v in full.items() if key[0] != 999}


def _doc(tmp_path: Path, doc: object) -> str:
    p = tmp_path / "run.json"
    p.write_text(json.dumps(doc))
    return str(p)


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"schema": "x"}, "no 'gemm_plan'"),
        ({"gemm_plan": {}}, "no 'gemm_plan'"),
        ([1, 2], "no 'gemm_plan'"),
        ({"gemm_plan": {"4096x4096@1": "gemv"}}, "is not a GEMM variant"),
        ({"gemm_plan": {"4096x4096": "cublas"}}, "is not NxK@M"),
    ],
)
def test_execute_refuses_a_document_without_a_usable_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], doc: object, match: str
) -> None:
    from spectune.cli import main

    argv = ["execute", "--policy", "dynamic-topk:5,4,8", "--gemm-plan", _doc(tmp_path, doc)]
    assert main(argv) == 2
    assert match in capsys.readouterr().err


def test_execute_reads_a_committed_calibrate_runs_plan_before_the_gpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plan is read and accepted first; on this CPU the command then stops at the GPU check."""
    from spectune.cli import main
    from spectune.cli.execute import read_gemm_plan

    run = FOLDER.parent / "h100-newuser17" / "calibrate-run.json"
    plan, gpu = read_gemm_plan(str(run))
    assert plan and GemmPlan.from_dict(plan, str(run)).to_dict() == plan
    assert gpu == "NVIDIA H100 80GB HBM3"
    if not torch.cuda.is_available():
        argv = ["execute", "--policy", "dynamic-topk:5,4,8", "--gemm-plan", str(run),
                "--out", str(tmp_path / "m.json")]  # fmt: skip
        assert main(argv) == 2
        assert "no CUDA GPU" in capsys.readouterr().err


@pytest.mark.gpu
def test_autotune_times_only_the_shapes_a_fixed_plan_lacks() -> None:
    dev = torch.device("cuda")
    kept = {(256, 256, m, False): "splitk2" for m in M_BUCKETS}
    partial = {(512, 256, 1, False): "splitk4"}  # one bucket only: the shape is timed whole
    plan, rows = autotune(
        [(256, 256), (512, 256)], dev, copies_bytes=1 << 20, fixed=GemmPlan(kept | partial)
    )
    assert {(r["n"], r["k"]) for r in rows} == {(512, 256)}
    assert all(plan.choice[key] == "splitk2" for key in kept)
    assert {m for n, _, m, _ in plan.choice if n == 512} == set(M_BUCKETS)


def test_check_notes_the_gemm_variants_a_measurement_ran_beyond_its_calibration() -> None:
    from spectune.validate.check import plan_differences

    run = {"4096x4096@1": "cublas", "6144x4096@1": "splitk1", "28672x4096@1": "cublas"}
    same = dict(run)
    other = {**run, "28672x4096@1": "splitk1/64x256/4w3s", "2048x4096@1": "splitk2"}  # + a shard
    plans = {"run.json": (True, run), "a.json": (False, same), "b.json": (False, other)}
    assert plan_differences(plans) == [
        ("b.json", "run.json", {"28672x4096@1": ("cublas", "splitk1/64x256/4w3s")})
    ]
    # no calibration run, or two of them: nothing to compare against
    assert plan_differences({"b.json": (False, other)}) == []
    assert plan_differences({**plans, "run2.json": (True, other)}) == []


def test_check_of_a_committed_folder_names_the_differing_plan(tmp_path: Path) -> None:
    """h200-newuser9's execute autotuned the gate|up GEMM at one token to split-K where its
    calibrate run had cuBLAS: spectune check says so (a note, not a failure)."""
    from spectune.validate.check import check_folder, format_check

    res = check_folder(FOLDER.parent / "h200-newuser9")
    notes = {name: diff for kind, name, _, diff in res.plan_notes if kind == "gemm_plan"}
    assert notes["execute-planned.json"]["28672x4096@1"] == ("cublas", "splitk1/64x256/4w3s")
    text = format_check(res, 0.10, 0.10)
    assert "note: execute-planned.json ran 2 GEMM variant(s)" in text
    assert text.splitlines()[-1].startswith("PASS")


# ---- the tree-attention launch tuned per verify shape: "attention_plan" ----


@pytest.mark.parametrize(
    ("label", "written"),
    [
        (["default"], "default"),
        ([64, 64, 4, 3, 8, True], "64x64/4w3s/s8/pdl"),
        ([32, 128, 4, 2, None, False], "32x128/4w2s/sauto"),
    ],
)
def test_attention_launch_written_form(label: list[object], written: str) -> None:
    assert attention_launch(label) == written
    check_attention_plan({attention_key(1, 64, 4096): written}, "doc")


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (["default"], "must be an object"),
        ({"B1xN64": "default"}, "is not B<b>xN<n>xC<c>"),
        ({"B1xN64xC4096": "fast"}, "is not a tree-attention launch"),
        ({"B1xN64xC4096": "64x64/4w3s/s8/tma"}, "is not a tree-attention launch"),
        ({f"B{b}xN1xC1": "default" for b in range(MAX_PLAN_ENTRIES + 1)}, "more than"),
    ],
)
def test_documents_refuse_a_malformed_attention_plan(plan: object, match: str) -> None:
    for doc, validate in _docs():
        bad = copy.deepcopy(doc)
        bad["attention_plan"] = plan
        with pytest.raises(SpecError, match=match):
            validate(bad, "doc.json")
        good = copy.deepcopy(doc)
        good["attention_plan"] = {"B8xN32xC4096": "64x64/4w3s/s4/pdl"}
        validate(good, "doc.json")


def test_the_session_keeps_the_fastest_tuned_launch() -> None:
    from types import SimpleNamespace

    from spectune.executor.session import Session

    s = SimpleNamespace(attention_plan={}, attention_rows=[])
    rows = [
        {"config": ["default"], "seconds": 2e-5, "calls": 16},
        {"config": [64, 64, 4, 3, 8, True], "seconds": 1.8e-5, "calls": 16},
        {"config": [128, 64, 8, 3, 4, True], "error": "out of resources"},
    ]
    Session._tuned(s, 1, 64, 4096, rows)  # type: ignore[arg-type]
    assert s.attention_plan == {"B1xN64xC4096": "64x64/4w3s/s8/pdl"}
    Session._tuned(s, 1, 64, 4096, [])  # tuned before: the pick stands
    assert s.attention_plan == {"B1xN64xC4096": "64x64/4w3s/s8/pdl"}
    assert len(s.attention_rows) == 1
    s.gemm_plan, s.gemm_plan_seconds = {}, {}
    assert Session.kernel_plans(s) == {"attention_plan": {"B1xN64xC4096": "64x64/4w3s/s8/pdl"}}  # type: ignore[arg-type]


def test_check_notes_tree_attention_launches_too(tmp_path: Path) -> None:
    import shutil

    from spectune.validate.check import check_folder

    src = FOLDER.parent / "h100-newuser17"
    for f in ("calibrate-run.json", "execute-planned.json", "calibration-h100-sxm.json"):
        shutil.copy(src / f, tmp_path / f)
    for f, launch in (("calibrate-run.json", "default"), ("execute-planned.json", "64x64/4w3s/s8")):
        doc = json.loads((tmp_path / f).read_text())
        doc["attention_plan"] = {"B1xN1xC4096": launch, "B1xN8xC4096": "default"}
        (tmp_path / f).write_text(json.dumps(doc))
    res = check_folder(tmp_path)
    assert ("attention_plan", "execute-planned.json", "calibrate-run.json",
            {"B1xN1xC4096": ("default", "64x64/4w3s/s8")}) in res.plan_notes  # fmt: skip
