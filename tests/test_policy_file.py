"""The policy file: round trips, atomic writes, errors that name the bad field, and the file
`spectune plan` writes."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from spectune.cli import main
from spectune.specs.errors import SpecError
from spectune.specs.policy import (
    SCHEMA,
    Bucket,
    ChainChoice,
    PolicyTable,
    Prediction,
    TreePolicy,
)

TABLE = PolicyTable(
    target="llama-3.1-8b",
    drafter="eagle3-llama-3.1-8b",
    hardware="h100-sxm",
    buckets=(
        Bucket(
            (1, 4),
            (0, 8191),
            TreePolicy("dynamic-topk", 7, 8, 64, 0.01, 8),
            Prediction(512.5, 3.2, 4.1),
            ChainChoice(5, 400.0, 2.5),
        ),
        Bucket((5, 128), (0, 8191), TreePolicy("static", 4, 2, 9), Prediction(900.0, 1.4, 2.2)),
        Bucket((129, 1024), (0, 8191), None, Prediction(1000.0, 1.0, 1.0), ChainChoice(0, 1e3, 1)),
    ),
    tp=2,
    workload="mt-bench",
    temperature=0.7,
    provenance={"spectune": "0.1.0", "trials": 48, "study": "x"},
)


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "policy.json"
    TABLE.save(path)
    assert PolicyTable.load(path) == TABLE
    data = json.loads(path.read_text())
    assert data["schema"] == SCHEMA
    assert data["buckets"][2]["policy"] is None  # off
    assert "chain" not in data["buckets"][1]  # optional field stays out when absent
    assert [p.name for p in path.parent.iterdir()] == ["policy.json"]  # no temp files left


def test_round_trip_dict_and_lookup() -> None:
    again = PolicyTable.from_dict(json.loads(json.dumps(TABLE.to_dict())))
    assert again == TABLE
    assert again.lookup(1, 100) == TABLE.buckets[0].policy
    assert again.lookup(200, 100) is None
    assert again.lookup(5000, 100_000) is None  # past the last bucket: the nearest


def test_overwrite_is_atomic(tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    path.write_text("old")
    TABLE.save(path)
    assert PolicyTable.load(path) == TABLE


def _bad(mutate: Any) -> dict[str, Any]:
    data = TABLE.to_dict()
    mutate(data)
    return data


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.update(schema="spectune.policy/v0"), "schema"),
        (lambda d: d.pop("buckets"), "buckets"),
        (lambda d: d.update(buckets=[]), "buckets"),
        (lambda d: d.pop("target"), "target"),
        (lambda d: d.update(tp=0), "tp"),
        (lambda d: d.update(temperature="hot"), "temperature"),
        (lambda d: d["buckets"][0].update(batch=[4, 1]), "buckets[0].batch"),
        (lambda d: d["buckets"][1].update(context="all"), "buckets[1].context"),
        (lambda d: d["buckets"][0].update(extra=1), "extra"),
        (lambda d: d["buckets"][0]["policy"].update(budget=1), "budget"),
        (lambda d: d["buckets"][0]["policy"].update(builder="beam"), "builder"),
        (lambda d: d["buckets"][0]["policy"].update(depht=3), "depht"),
        (lambda d: d["buckets"][0]["policy"].pop("topk"), "topk"),
        (lambda d: d["buckets"][0]["policy"].update(graft_budget=200), "graft_budget"),
        (lambda d: d["buckets"][0]["predicted"].update(tokens_per_s="fast"), "tokens_per_s"),
        (lambda d: d["buckets"][0]["chain"].update(draft_tokens=-1), "draft_tokens"),
        (lambda d: d["buckets"][0].update(policy=[1, 2]), "buckets[0].policy"),
        (lambda d: d.update(provenance=[]), "provenance"),
    ],
)
def test_malformed_files_name_the_field(mutate: Any, field: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(_bad(mutate)))
    with pytest.raises(SpecError) as e:
        PolicyTable.load(path)
    assert field in str(e.value)
    assert str(path) in str(e.value)


def test_not_json_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        PolicyTable.load(path)
    with pytest.raises(SpecError, match="no such policy file"):
        PolicyTable.load(tmp_path / "nope.json")
    with pytest.raises(SpecError, match="top level"):
        PolicyTable.from_dict([1, 2])  # type: ignore[arg-type]


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-5, 300)
    | st.floats(allow_nan=False)
    | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    key=st.sampled_from(["batch", "context", "policy", "predicted", "chain"]),
    value=json_values,
)
def test_any_bucket_value_loads_or_gives_a_spec_error(key: str, value: Any) -> None:
    data = TABLE.to_dict()
    data["buckets"][0][key] = value
    with contextlib.suppress(SpecError):
        PolicyTable.from_dict(data)


@given(
    field=st.sampled_from(
        ["builder", "depth", "topk", "budget", "prune_threshold", "graft_budget"]
    ),
    value=json_values,
)
def test_any_policy_field_value_loads_or_gives_a_spec_error(field: str, value: Any) -> None:
    data = TABLE.to_dict()
    data["buckets"][0]["policy"][field] = value
    try:
        PolicyTable.from_dict(data)
    except SpecError as e:
        assert field in str(e)


def test_plan_writes_a_loadable_policy_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`spectune plan` end to end, on the small analytic objective of test_search."""
    from test_search import fake_objective

    import spectune.cli.plan as plan_cli
    from spectune.planner.search import Scorer

    obj = fake_objective()
    monkeypatch.setattr(plan_cli, "build_scorer", lambda s: (Scorer(obj, obj.step_latency), obj))
    out = tmp_path / "policy.json"
    rc = main(
        [
            "plan",
            "--out",
            str(out),
            "--trials",
            "6",
            "--batch-edges",
            "1,8",
            "--context-edges",
            "4096,32768",
            "--seed",
            "3",
        ]
    )
    assert rc == 0
    table = PolicyTable.load(out)
    assert [b.batch for b in table.buckets] == [(1, 1), (1, 1), (2, 8), (2, 8)]
    assert table.target == "llama-3.1-8b" and table.hardware == "h100-sxm"
    assert table.provenance["trials"] >= 4 * 6 and table.provenance["seed"] == 3
    for b in table.buckets:
        assert b.predicted is not None and b.predicted.speedup > 0 and b.chain is not None
    printed = capsys.readouterr()
    assert "vs default" in printed.out and "wrote" in printed.out
    assert "planning [" in printed.err  # the progress bar


def test_plan_rejects_bad_arguments(tmp_path: Path) -> None:
    assert main(["plan", "--out", str(tmp_path / "p.json"), "--trials", "0"]) == 2
    assert main(["plan", "--out", str(tmp_path / "p.json"), "--storage", "redis://x"]) == 2


def test_plan_multi_objective_prints_the_front(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from test_search import fake_objective

    import spectune.cli.plan as plan_cli
    from spectune.planner.search import Scorer

    obj = fake_objective()
    monkeypatch.setattr(plan_cli, "build_scorer", lambda s: (Scorer(obj, obj.step_latency), obj))
    out = tmp_path / "policy.json"
    args = [
        "plan",
        "--out",
        str(out),
        "--trials",
        "12",
        "--batch-edges",
        "1",
        "--context-edges",
        "4096",
        "--multi-objective",
        "--quiet",
    ]
    assert main(args) == 0
    assert "pareto" in capsys.readouterr().out
    assert main([*args, "--max-step-ms", "13"]) == 0
    policy = PolicyTable.load(out).buckets[0].policy
    assert obj.step_latency(policy, 1, 2048) <= 0.013


def test_closed_form_objective_prices_with_a_calibration(tmp_path: Path) -> None:
    """closed_form_objective(calibration=...) takes a Calibration or its file; it is the cost
    model the objective prices every step with, and another GPU's calibration is refused."""
    from spectune.planner.costmodel import CostModel
    from spectune.planner.objective import closed_form_objective
    from spectune.specs import load_hardware, load_model
    from spectune.specs.calibration import Calibration

    cal = Calibration(hardware="h200", draft_step_s=500e-6, weight_bw_efficiency=0.7)
    cal.save(tmp_path / "cal.json")
    names = ("llama-3.1-8b", "eagle3-llama-3.1-8b", "h200", "mt-bench")
    policy = TreePolicy("dynamic-topk", 5, 4, 8)
    plain = closed_form_objective(*names, samples=64)
    for given_cal in (cal, tmp_path / "cal.json", str(tmp_path / "cal.json")):
        obj = closed_form_objective(*names, samples=64, calibration=given_cal)
        assert obj.cost_model.calibration == cal
        cm = CostModel(
            load_hardware("h200"), load_model(names[0]), load_model(names[1]), calibration=cal
        )
        acc = obj.expected_tokens(policy)
        tokens = obj.tree_tokens(policy)
        want = float(cm.iteration(policy, 1, 4096, tokens=tokens, accepted=acc).total_s)
        assert obj.step_time(policy, 1, 4096) == pytest.approx(want)
        # 5 draft steps x 500 us of bookkeeping, and slower weights: a longer step
        assert obj.step_time(policy, 1, 4096) > plain.step_time(policy, 1, 4096) + 5 * 400e-6
    with pytest.raises(SpecError, match="fitted on 'h200'"):
        closed_form_objective(
            "llama-3.1-8b", "eagle3-llama-3.1-8b", "h100-sxm", "mt-bench", calibration=cal
        )


def test_plan_with_a_calibration_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`spectune plan --calibration FILE`: the GPU follows the file, the file is in the
    provenance, and its prices drive the plan (costly draft steps: lower predicted speedup)."""
    from spectune.specs.calibration import Calibration

    def plan(cal: Calibration, name: str, *extra: str) -> PolicyTable:
        path = tmp_path / f"{name}.json"
        cal.save(path)
        out = tmp_path / f"policy-{name}.json"
        args = [
            "plan",
            "--calibration",
            str(path),
            "--out",
            str(out),
            "--trials",
            "6",
            "--batch-edges",
            "1",
            "--context-edges",
            "4096",
            "--quiet",
            *extra,
        ]
        assert main(args) == 0
        return PolicyTable.load(out)

    cheap = plan(Calibration(hardware="h200", draft_step_s=0.0), "cheap")
    costly = plan(Calibration(hardware="h200", draft_step_s=2e-3), "costly")
    assert cheap.hardware == costly.hardware == "h200"
    assert str(tmp_path / "costly.json") in str(costly.provenance["calibration"])
    fast, slow = cheap.buckets[0].predicted, costly.buckets[0].predicted
    assert fast is not None and slow is not None and slow.speedup < fast.speedup
    capsys.readouterr()
    # another GPU than the calibration's is an error naming both
    bad = [
        "plan",
        "--calibration",
        str(tmp_path / "cheap.json"),
        "--gpu",
        "h100-sxm",
        "--out",
        str(tmp_path / "x.json"),
        "--trials",
        "2",
        "--quiet",
    ]
    assert main(bad) == 2
    assert "h200" in capsys.readouterr().err
    missing = [
        "plan",
        "--calibration",
        str(tmp_path / "nope.json"),
        "--out",
        str(tmp_path / "x.json"),
    ]
    assert main(missing) == 2
