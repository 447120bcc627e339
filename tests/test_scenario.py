"""One Scenario from plan to every reader of the policy file: `spectune plan` records it, old
files get one made from their names, and simulate, execute and export take the file's scenario
(saying so when a flag changes it); export and the dashboards' Planner page write the same
files for the same table."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from spectune.cli import build_parser, main
from spectune.planner.objective import closed_form_objective, scenario_objective
from spectune.planner.space import EAGLE_DEFAULT, SGLANG_DEFAULT
from spectune.specs import (
    Bucket,
    PolicyTable,
    Prediction,
    Scenario,
    SpecError,
    TreePolicy,
    load_calibration,
)

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = ROOT / "measurements" / "h200" / "calibration-h200.json"
BIG = Scenario(
    target="llama-3.1-70b", drafter="eagle3-llama-3.1-70b", gpu="h200", tp=4, workload="mt-bench"
)


def table_for(scenario: Scenario) -> PolicyTable:
    """A small hand-made table for a scenario (a static bucket, so TensorRT-LLM needs shapes)."""
    buckets = (
        Bucket((1, 4), (0, 32768), EAGLE_DEFAULT, Prediction(100.0, 2.0, 4.0)),
        Bucket((5, 32), (0, 32768), TreePolicy("static", 5, 4, 16), Prediction(900.0, 1.5, 3.0)),
        Bucket((33, 256), (0, 32768), SGLANG_DEFAULT, Prediction(2000.0, 1.2, 2.5)),
    )
    return PolicyTable(
        target=scenario.target,
        drafter=scenario.drafter,
        hardware=scenario.gpu,
        buckets=buckets,
        tp=scenario.tp,
        workload=scenario.workload,
        scenario=scenario,
    )


# ---- the policy file ----------------------------------------------------------------------------


def test_a_plans_policy_file_round_trips_its_scenario(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_search import fake_objective

    import spectune.cli.plan as plan_cli
    from spectune.planner.search import Scorer

    seen: list[Scenario] = []
    obj = fake_objective()

    def scorer(s: Scenario) -> Any:
        seen.append(s)
        return Scorer(obj, obj.step_latency), obj

    monkeypatch.setattr(plan_cli, "build_scorer", scorer)
    out = tmp_path / "policy.json"
    args = ["plan", "--out", str(out), "--trials", "4", "--batch-edges", "1,8"]
    args += ["--context-edges", "4096", "--quiet", "--target", BIG.target, "--drafter"]
    args += [BIG.drafter, "--tp", "4", "--calibration", str(CALIBRATION)]
    args += ["--objective", "goodput", "--slo-tpot-ms", "40"]
    assert main(args) == 0
    want = BIG.replace(
        gpu=load_calibration(CALIBRATION).hardware,
        calibration=str(CALIBRATION.resolve()),
        objective="goodput",
        slo_tpot_ms=40.0,
    )
    assert seen == [want]  # the scorer is built from the Scenario the flags name
    doc = json.loads(out.read_text())
    assert doc["scenario"] == want.to_dict()
    table = PolicyTable.load(out)
    assert table.scenario == want
    assert PolicyTable.from_dict(table.to_dict()) == table


def test_old_policy_files_get_a_scenario_from_their_names() -> None:
    doc = table_for(BIG).to_dict()
    del doc["scenario"]
    table = PolicyTable.from_dict(doc, "old.json")
    assert table.scenario == BIG
    doc.update(drafter="", workload="")  # a retrieval-only plan of an older dashboard
    old = PolicyTable.from_dict(doc, "old.json").scenario
    assert not old.has_drafter and old.workload == ""


def test_a_scenario_that_disagrees_with_the_names_is_an_error() -> None:
    doc = table_for(BIG).to_dict()
    doc["scenario"]["gpu"] = "h100-sxm"
    with pytest.raises(SpecError, match=r"bad\.json: .*'scenario\.gpu'.*'hardware'"):
        PolicyTable.from_dict(doc, "bad.json")
    doc = table_for(BIG).to_dict()
    doc["scenario"]["tpp"] = 4
    with pytest.raises(SpecError, match=r"bad\.json: scenario: unknown field 'tpp'"):
        PolicyTable.from_dict(doc, "bad.json")


def test_build_table_records_the_scenario() -> None:
    from spectune.planner.buckets import buckets_from_edges
    from spectune.planner.search import SearchSettings, search
    from spectune.planner.table import build_table

    obj = scenario_objective(BIG.resolve())
    results = search(obj, buckets_from_edges((1,), (4096,)), SearchSettings(trials=3))
    table = build_table(results, obj, BIG, {})
    assert table.scenario == BIG
    assert (table.target, table.hardware, table.tp) == (BIG.target, BIG.gpu, BIG.tp)


# ---- the one objective --------------------------------------------------------------------------


def test_scenario_objective_is_what_plan_scores_with() -> None:
    """Turnover and the KV cap on, the calibration applied; decode_only leaves the first two
    out (what closed_form_objective gives by default)."""
    from spectune.simulator.scoring import build_scorer

    scn = Scenario(gpu="h200", calibration=str(CALIBRATION))
    planned = scenario_objective(scn.resolve())
    names = (scn.target, scn.drafter, scn.gpu, scn.workload)
    want = closed_form_objective(
        *names, turnover=True, kv_capacity=True, calibration=str(CALIBRATION)
    )
    scorer, closed = build_scorer(scn)
    for policy, b, c in ((SGLANG_DEFAULT, 8, 4096), (None, 64, 16384), (EAGLE_DEFAULT, 1, 512)):
        assert planned(policy, b, c) == want(policy, b, c)
        assert scorer.objective(policy, b, c) == want(policy, b, c)
        assert closed(policy, b, c) == want(policy, b, c)
    decode = scenario_objective(scn.resolve(), decode_only=True)
    plain = closed_form_objective(*names, calibration=str(CALIBRATION))
    assert decode(SGLANG_DEFAULT, 8, 4096) == plain(SGLANG_DEFAULT, 8, 4096)
    assert decode(SGLANG_DEFAULT, 8, 4096) != planned(SGLANG_DEFAULT, 8, 4096)
    uncalibrated = scenario_objective(scn.replace(calibration=None).resolve())
    assert uncalibrated(SGLANG_DEFAULT, 8, 4096) != planned(SGLANG_DEFAULT, 8, 4096)


# ---- readers of the policy file -----------------------------------------------------------------


def _write(tmp_path: Path, table: PolicyTable, name: str = "policy.json") -> Path:
    path = tmp_path / name
    table.save(path)
    return path


def test_simulate_takes_the_files_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, table_for(BIG))
    run = ["simulate", "--policy", str(path), "--requests", "12", "--qps", "2", "--quiet"]
    assert main(run) == 0
    out = capsys.readouterr()
    assert "llama-3.1-70b + eagle3-llama-3.1-70b on 1 x 4 x h200" in out.out
    assert "overrides" not in out.err

    def runs(args: list[str]) -> list[dict[str, Any]]:
        assert main([*args, "--json"]) == 0
        got = json.loads(capsys.readouterr().out)["runs"]
        return [{k: v for k, v in r.items() if k != "wall_s"} for r in got]

    flags = ["--target", BIG.target, "--drafter", BIG.drafter, "--gpu", "h200", "--tp", "4"]
    assert runs(run) == runs([*run, *flags])  # the file's scenario is the one simulated

    assert main([*run, "--gpu", "h100-sxm", "--json"]) == 0
    err = capsys.readouterr().err
    assert f"note: --gpu overrides {path}'s scenario: gpu h200 -> h100-sxm" in err
    assert err.count("overrides") == 1


def test_simulate_prices_with_the_files_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scn = Scenario(gpu="h200", calibration=str(CALIBRATION))
    path = _write(tmp_path, table_for(scn))
    run = ["simulate", "--policy", str(path), "--requests", "12", "--qps", "4", "--json"]
    run += ["--quiet"]
    assert main(run) == 0
    calibrated = json.loads(capsys.readouterr().out)["runs"][0]
    assert main([*run, "--calibration", "none"]) == 0
    captured = capsys.readouterr()
    plain = json.loads(captured.out)["runs"][0]
    assert f"calibration {CALIBRATION} -> None" in captured.err
    assert calibrated["tpot_p50_s"] != plain["tpot_p50_s"]


def test_execute_takes_the_files_scenario(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before any GPU work: the models and workload come from the file's scenario, and a
    flag that changes one says so."""
    from spectune.cli.execute import scenario_of

    table = table_for(BIG.replace(workload="humaneval"))
    path = _write(tmp_path, table)
    args = build_parser().parse_args(["execute", "--policy", str(path)])
    assert scenario_of(args, table) == table.scenario
    assert "overrides" not in capsys.readouterr().err
    args = build_parser().parse_args(["execute", "--policy", str(path), "--workload", "mt-bench"])
    assert scenario_of(args, table).workload == "mt-bench"
    err = capsys.readouterr().err
    assert f"note: --workload overrides {path}'s scenario: workload humaneval -> mt-bench" in err


def test_export_uses_the_files_scenario() -> None:
    """The engines' one global shape is fitted with the table's own closed form: its GPU,
    models, workload and calibration."""
    from spectune.planner.export import table_objective

    scn = Scenario(gpu="h200", workload="humaneval", calibration=str(CALIBRATION))
    evaluate, note = table_objective(table_for(scn))
    assert evaluate is not None and note == ""
    want = scenario_objective(scn.resolve())
    for b in (1, 8, 64):
        assert evaluate(SGLANG_DEFAULT, b, 4096) == want(SGLANG_DEFAULT, b, 4096)
    missing = table_for(scn.replace(calibration="/nowhere/calibration.json"))
    evaluate, note = table_objective(missing)
    assert evaluate is None and "nowhere" in note


def test_dashboard_exports_equal_the_export_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("streamlit")
    from spectune.dashboards import plans

    for scn in (Scenario(gpu="h200", calibration=str(CALIBRATION)), BIG):
        table = table_for(scn)
        path = _write(tmp_path, table, f"{scn.gpu}-{scn.tp}.json")
        exports, note = plans.engine_exports(table)
        assert note == ""
        for engine, exp in exports.items():
            out = tmp_path / f"{path.stem}-{engine}"
            if isinstance(exp, str):  # the engine cannot run this plan: both refuse alike
                capsys.readouterr()
                assert main(["export", "--engine", engine, str(path), "--out", str(out)]) == 2
                assert exp in capsys.readouterr().err
                continue
            assert main(["export", "--engine", engine, str(path), "--out", str(out)]) == 0
            written = {p.name: p.read_bytes() for p in out.iterdir()}
            assert written == {n: t.encode() for n, t in exp.files.items()}, engine
    capsys.readouterr()
