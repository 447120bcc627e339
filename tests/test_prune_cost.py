"""The per-iteration cost of pruned trees (Calibration.prune_step_s, CostModel.prune_time /
option_time): validated and loaded like the other calibrated times, charged by the objective,
the simulator, the dashboards and `spectune check` exactly where a policy prunes, and fitted
back from measured pruned runs. CPU only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spectune.dashboards import data
from spectune.planner.costmodel import CostModel
from spectune.planner.objective import ClosedFormObjective
from spectune.simulator.steptime import StepPricer
from spectune.specs import SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import check_folder
from spectune.validate.measure import PHASE_KEYS, measurement_doc

HW, TARGET, DRAFTER = "h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b"
US = 1e-6
PRUNE_S = 170 * US  # a planted cost, unlike the 150 us default
DENSE = TreePolicy("dynamic-topk", 6, 10, 32)
PRUNED = dataclasses.replace(DENSE, prune_threshold=1e-3)
GRAFTED = dataclasses.replace(DENSE, graft_budget=4)
BOTH = dataclasses.replace(DENSE, prune_threshold=1e-3, graft_budget=4)


def _cm(cal: Calibration | None = None) -> CostModel:
    return CostModel(load_hardware(HW), load_model(TARGET), load_model(DRAFTER), calibration=cal)


def _scalar(x: object) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


# ---- the calibration field ---------------------------------------------------------------------


def test_prune_step_is_a_validated_time_with_a_documented_default() -> None:
    assert Calibration().prune_step_s == pytest.approx(150 * US)
    assert Calibration(prune_step_s=0.0).prune_step_s == 0.0
    with pytest.raises(SpecError, match="prune_step_s"):
        Calibration(prune_step_s=-1e-6)
    with pytest.raises(SpecError, match="prune_step_s"):
        Calibration(prune_step_s=float("nan"))
    help_ = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(Calibration)}
    assert "measurements/h200-replan" in help_["prune_step_s"]


def test_prune_step_round_trips_and_old_files_load_with_the_default(tmp_path: Path) -> None:
    cal = Calibration(hardware=HW, prune_step_s=PRUNE_S)
    assert cal.to_dict()["prune_step_s"] == PRUNE_S
    cal.save(tmp_path / "new.json")
    assert Calibration.load(tmp_path / "new.json") == cal
    old = Calibration(hardware=HW).to_dict()
    del old["prune_step_s"]  # a file written before the field existed
    (tmp_path / "old.json").write_text(json.dumps(old))
    assert Calibration.load(tmp_path / "old.json").prune_step_s == Calibration().prune_step_s
    bad = {**old, "prune_step_s": -0.5}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(SpecError, match=r"bad\.json.*prune_step_s"):
        Calibration.load(tmp_path / "bad.json")


# ---- the cost model ----------------------------------------------------------------------------


def test_option_time_charges_each_option_once() -> None:
    cm = _cm(Calibration(prune_step_s=PRUNE_S, retrieval_per_request_s=20 * US))
    b = np.array([1, 8, 64])
    assert cm.prune_time(b).shape == (3,)
    assert np.allclose(cm.prune_time(b), PRUNE_S, rtol=0, atol=0)
    assert np.all(cm.option_time(b, DENSE) == 0.0)
    assert np.array_equal(cm.option_time(b, PRUNED), cm.prune_time(b))
    assert np.array_equal(cm.option_time(b, GRAFTED), cm.retrieval_time(b))
    assert np.allclose(cm.option_time(b, BOTH), PRUNE_S + 20 * US * b, rtol=1e-15)
    assert cm.option_time(4, PRUNED).dtype == np.float64
    with pytest.raises(SpecError, match="batch"):
        cm.prune_time(-1)


# ---- the objective, the simulator and the dashboards ----------------------------------------------


def test_objective_charges_a_pruned_policy_exactly_prune_step_more() -> None:
    """At equal tree size (expected_tokens given: tree_tokens is the budget) and equal
    acceptance, the pruned policy's step costs prune_step_s more and nothing else."""
    cm = _cm(Calibration(prune_step_s=PRUNE_S))
    obj = ClosedFormObjective(cm, None, expected_tokens=lambda p: 3.5)
    batches = np.array([1, 8, 32, 64])
    for context in (512, 4096):
        dense = obj.step_times(DENSE, batches, context)
        pruned = obj.step_times(PRUNED, batches, context)
        assert np.allclose(pruned - dense, PRUNE_S, rtol=0, atol=1e-12)
        assert obj(PRUNED, 8, context) < obj(DENSE, 8, context)
    free = ClosedFormObjective(
        _cm(Calibration(prune_step_s=0.0)), None, expected_tokens=lambda p: 3.5
    )
    assert free.step_time(PRUNED, 8, 4096) == free.step_time(DENSE, 8, 4096)


def test_simulator_step_time_charges_a_pruned_policy_exactly_prune_step_more() -> None:
    pricer = StepPricer(_cm(Calibration(prune_step_s=PRUNE_S)))
    for b in (1, 8, 32):
        dense = pricer.decode_spec(b, DENSE, 32 * b, 3 * b, 4096.0)
        pruned = pricer.decode_spec(b, PRUNED, 32 * b, 3 * b, 4096.0)
        assert pruned.total_s - dense.total_s == pytest.approx(PRUNE_S, abs=1e-12)
        assert pruned.overhead_s - dense.overhead_s == pytest.approx(PRUNE_S, abs=1e-12)
        tree = np.array([20.0, 32.0]) * b
        acc = np.array([2.0, 3.0]) * b
        ctx = np.array([1000.0, 4096.0])
        d_parts = pricer.decode_spec_many(b, DENSE, tree, acc, ctx)
        p_parts = pricer.decode_spec_many(b, PRUNED, tree, acc, ctx)
        assert np.allclose(sum(p_parts) - sum(d_parts), PRUNE_S, rtol=0, atol=1e-12)
    dec, dctx = np.full(4, 32), np.full(4, 2048)
    chunk, cctx = np.array([512]), np.array([0])
    dense_mix = pricer.mixed(DENSE, dec, dctx, 8, chunk, cctx)
    pruned_mix = pricer.mixed(PRUNED, dec, dctx, 8, chunk, cctx)
    assert pruned_mix.total_s - dense_mix.total_s == pytest.approx(PRUNE_S, abs=1e-12)
    none_decoding = pricer.mixed(PRUNED, dec[:0], dctx[:0], 0, chunk, cctx)
    assert none_decoding.total_s == pricer.mixed(DENSE, dec[:0], dctx[:0], 0, chunk, cctx).total_s


def test_what_if_shows_pruning_as_its_own_phase() -> None:
    scn = data.DEFAULT_SCENARIO
    w = data.what_if(scn, BOTH, 8, 4096)
    cm = data.objective_for(scn).cost_model
    assert w.phases_s["pruning"] == pytest.approx(_scalar(cm.prune_time(8)))
    assert "retrieval" in w.phases_s
    assert sum(w.phases_s.values()) == pytest.approx(w.step_s, rel=1e-9)
    assert "pruning" not in data.what_if(scn, GRAFTED, 8, 4096).phases_s


# ---- spectune check and the calibration fit ---------------------------------------------------


def _run(cm: CostModel, b: int, policy: TreePolicy, n: float, c: int, acc: float) -> dict:
    """One measured run whose step is the cost model's own, the policy's options included."""
    d, k = policy.depth, policy.topk
    step = _scalar(cm.spec_step_time(b, d, k, n, c, d + 1)) + _scalar(cm.option_time(b, policy))
    ar = _scalar(cm.ar_step_time(b, c))
    tree = _scalar(cm.step_overhead_time(b, n)) + _scalar(cm.option_time(b, policy))
    ph = dict.fromkeys(PHASE_KEYS, 0.0)
    ph.update(
        draft=_scalar(cm.draft_time(b, d, k, c)) * 1e3,
        tree=tree * 1e3,
        verify=_scalar(cm.verify_time(b, n, c)) * 1e3,
        extend=_scalar(cm.draft_extend_time(b, d + 1, c)) * 1e3,
        step=step * 1e3,
    )
    tps = b * (acc + 1) / step
    return {
        "batch": b,
        "label": "pruned" if policy.prune_threshold > 0 else "dense",
        "nodes": policy.budget,
        "verified_mean": n,
        "phases_ms": ph,
        "accepted_mean": acc,
        "tokens_per_step": acc + 1,
        "tokens_per_s": tps,
        "ar_step_ms": ar * 1e3,
        "ar_phases_ms": {
            "verify": _scalar(cm.verify_time(b, 1, c)) * 1e3,
            "overhead": _scalar(cm.step_overhead_time(b, 1)) * 1e3,
        },
        "ar_tokens_per_s": b / ar,
        "speedup": tps * ar / b,
        "policy": dataclasses.asdict(policy),
    }


def _doc(cm: CostModel, c: int = 4096) -> dict[str, Any]:
    runs = []
    for b in (1, 8, 32, 64):
        runs.append(_run(cm, b, DENSE, 32.0, c, 3.5))
        runs.append(_run(cm, b, PRUNED, 30.5, c, 3.4))
        runs.append(_run(cm, b, dataclasses.replace(DENSE, prune_threshold=0.05), 16.2, c, 3.0))
    return measurement_doc(
        gpu="NVIDIA H100 80GB HBM3",
        hardware=HW,
        target=TARGET,
        drafter=DRAFTER,
        workload="mt-bench",
        context=c,
        steps=30,
        attention="test",
        runs=runs,
    )


def test_check_adds_the_prune_cost_to_pruned_runs(tmp_path: Path) -> None:
    cal = Calibration(hardware=HW, prune_step_s=PRUNE_S)
    doc = _doc(_cm(cal))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "run.json").write_text(json.dumps(doc))
    cal.save(folder / f"calibration-{HW}.json")
    res = check_folder(folder)
    assert len(res.speedup) == 12
    assert res.worst_speedup_error < 1e-9  # its own predictions, pruning priced
    Calibration(hardware=HW, prune_step_s=0.0).save(folder / f"calibration-{HW}.json")
    free = {r.what: r.error for r in check_folder(folder).speedup}
    for run, row in zip(doc["runs"], res.speedup, strict=True):
        if run["policy"]["prune_threshold"] > 0:
            assert free[row.what] > 1e-3  # unpriced: predicted too fast
        else:
            assert free[row.what] == pytest.approx(0.0, abs=1e-9)


def test_overheads_recover_a_planted_prune_step() -> None:
    from spectune.validate.fit import _overheads

    truth = Calibration(
        step_overhead_s=12 * US,
        per_request_overhead_s=0.5 * US,
        tree_build_s=90 * US,
        tree_build_per_node_s=0.04 * US,
        prune_step_s=PRUNE_S,
    )
    doc = _doc(_cm(truth))
    over = _overheads([doc])
    assert over["prune_step_s"] == pytest.approx(PRUNE_S, rel=1e-6)
    assert over["tree_build_s"] == pytest.approx(90 * US, rel=1e-6)
    assert over["tree_build_per_node_s"] == pytest.approx(0.04 * US, rel=1e-6)
    assert "static_tree_build_s" not in over
    dense_only = {**doc, "runs": [r for r in doc["runs"] if r["label"] == "dense"]}
    assert "prune_step_s" not in _overheads([dense_only])  # nothing measured: default stays


def test_fit_calibration_carries_the_fitted_prune_step() -> None:
    """The whole fit keeps the prune cost of the non-forward phases and prices pruned steps
    with it (a few iterations suffice: the efficiencies start at the truth)."""
    from spectune.validate.fit import PARAMS, _calibration, _rows, fit_calibration, predict_row

    truth = _calibration([p[3] for p in PARAMS], HW, Calibration())
    truth = dataclasses.replace(truth, tree_build_s=150 * US, prune_step_s=PRUNE_S)
    cm = _cm(truth)
    doc = _doc(cm)
    run = {"hardware": HW, "target": TARGET, "drafter": DRAFTER, "verify": []}
    steps = [(a, s) for k, a, s in _rows(run, [doc]) if k == "step"]
    assert all(predict_row(cm, "step", a) == pytest.approx(s, rel=1e-9) for a, s in steps)
    cal, report = fit_calibration(run, [doc], max_nfev=3)
    assert cal.prune_step_s == pytest.approx(PRUNE_S, rel=1e-6)
    assert report["mape_step_after"] < 0.01
