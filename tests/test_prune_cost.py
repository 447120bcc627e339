"""The step price's contract: CostModel.iteration -> StepBreakdown.

A term is present when and only when the policy has it, the total is the sum of the phases, and
every consumer (the closed-form objective, the simulator's step tables, the What-if page,
`spectune check`, the calibration fit's predict_row) prices a step as the breakdown's total
for the same inputs, so a non-zero EngineOverheads reaches every one of them. Also the
per-iteration cost of pruned trees (Calibration.prune_step_s): validated and loaded like the
other calibrated times, and fitted back from measured pruned runs. CPU only."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from spectune.dashboards import data
from spectune.planner.acceptance import acceptance_model
from spectune.planner.costmodel import CostModel
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.step import PHASES, StepBreakdown
from spectune.simulator.steptime import StepPricer
from spectune.specs import SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.specs.engine import EngineOverheads
from spectune.validate.check import CheckResult, _check_measurement, check_folder
from spectune.validate.fit import predict_row
from spectune.validate.measure import PHASE_KEYS, measurement_doc

HW, TARGET, DRAFTER = "h100-sxm", "llama-3.1-8b", "eagle3-llama-3.1-8b"
US = 1e-6
PRUNE_S = 170 * US  # a planted cost, unlike the 150 us default
RETRIEVAL_S = 20 * US
DENSE = TreePolicy("dynamic-topk", 6, 10, 32)
PRUNED = dataclasses.replace(DENSE, prune_threshold=1e-3)
GRAFTED = dataclasses.replace(DENSE, graft_budget=4)
BOTH = dataclasses.replace(DENSE, prune_threshold=1e-3, graft_budget=4)
STATIC = TreePolicy("static", 5, 4, 16, 0.01, 3)
CHAIN = TreePolicy("dynamic-topk", 4, 1, 5)
POLICIES = (None, DENSE, PRUNED, GRAFTED, BOTH, STATIC, CHAIN)
ENGINE = EngineOverheads(
    iteration_s=300 * US,
    per_request_s=4 * US,
    spec_iteration_s=200 * US,
    per_draft_step_s=30 * US,
    tree_s=50 * US,
    overlap=0.25,
    tp_growth=0.1,
)
CAL = Calibration(prune_step_s=PRUNE_S, retrieval_per_request_s=RETRIEVAL_S)


def _cm(cal: Calibration | None = CAL, engine: EngineOverheads | None = None) -> CostModel:
    return CostModel(
        load_hardware(HW), load_model(TARGET), load_model(DRAFTER), calibration=cal, engine=engine
    )


def _scalar(x: object) -> float:
    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])


def _label(p: TreePolicy | None) -> str:
    return "off" if p is None else p.label


# ---- the breakdown -----------------------------------------------------------------------------


@pytest.mark.parametrize("policy", POLICIES, ids=_label)
def test_terms_are_present_exactly_when_the_policy_has_them(policy: TreePolicy | None) -> None:
    cm = _cm()
    b = np.array([1, 8, 64])[:, None]
    c = np.array([0, 4096])[None, :]
    step = cm.iteration(policy, b, c)
    values = [getattr(step, name) for _, name in PHASES]
    assert all(v.shape == (3, 2) and v.dtype == np.float64 for v in values)
    assert all(np.all(np.isfinite(v)) and np.all(v >= 0) for v in values)
    assert np.all(step.engine_s == 0.0)  # no EngineOverheads: spectune's own executor
    if policy is None:
        assert np.all(step.draft_s == 0) and np.all(step.extend_s == 0)
        np.testing.assert_array_equal(
            step.verify_s, np.broadcast_to(cm.verify_time(b, 1, c), (3, 2))
        )
        np.testing.assert_array_equal(step.overhead_s[:, 0], cm.step_overhead_time(b[:, 0], 1))
        want = ["verify", "overhead"]
        with pytest.raises(SpecError, match="policy is None"):
            cm.iteration(None, 8, 4096, tokens=4)
    else:
        # the defaults: a full tree verified, a draft extend over depth + 1 tokens
        d, k, n = policy.depth, policy.topk, policy.budget
        np.testing.assert_array_equal(
            step.draft_s, np.broadcast_to(cm.draft_time(b, d, k, c, builder=policy.builder), (3, 2))
        )
        np.testing.assert_array_equal(step.verify_s, cm.verify_time(b, n, c))
        np.testing.assert_array_equal(step.extend_s, cm.draft_extend_time(b, d + 1, c))
        overhead = cm.step_overhead_time(b, n, builder=policy.builder)
        np.testing.assert_array_equal(step.overhead_s, np.broadcast_to(overhead, (3, 2)))
        assert np.all(step.draft_s > 0) and np.all(step.extend_s > 0)
        pruned, grafted = policy.prune_threshold > 0, policy.graft_budget > 0
        assert np.all(step.prune_s == (PRUNE_S if pruned else 0.0))
        assert np.all(step.retrieval_s == (RETRIEVAL_S * b if grafted else 0.0))
        want = ["draft", "verify", "draft extend", "overhead"]
        want += ["retrieval"] * grafted + ["pruning"] * pruned
    assert list(step.phases()) == want
    # the total is the sum of every phase, in PHASES order, and of the listed ones
    total = values[0]
    for v in values[1:]:
        total = total + v
    np.testing.assert_array_equal(step.total_s, total)
    np.testing.assert_allclose(sum(step.phases().values()), step.total_s, rtol=1e-15)


def test_tokens_and_accepted_replace_the_defaults() -> None:
    cm = _cm()
    b, c = np.array([1, 8, 64]), 2048
    tokens, accepted = np.array([20.5, 32.0, 7.0]), np.array([3.5, 2.0, 1.2])
    step = cm.iteration(PRUNED, b, c, tokens=tokens, accepted=accepted)
    # the packed verify runs at the next multiple of ragged_token_bucket (16) tokens: batch 1's
    # 20.5 tokens as 32; 8 x 32 and 64 x 7 are multiples already
    bucketed = np.array([32.0, 32.0, 7.0])
    np.testing.assert_allclose(step.verify_s, cm.verify_time(b, bucketed, c), rtol=1e-12)
    np.testing.assert_array_equal(step.extend_s, cm.draft_extend_time(b, accepted, c))
    np.testing.assert_array_equal(step.overhead_s, cm.step_overhead_time(b, tokens))
    with pytest.raises(SpecError, match="tokens"):
        cm.iteration(DENSE, 8, c, tokens=-1)


@pytest.mark.parametrize("tp", [1, 4])
def test_engine_overheads_are_one_term_of_every_iteration(tp: int) -> None:
    target, drafter = load_model(TARGET), load_model(DRAFTER)
    hw = load_hardware(HW)
    bare = CostModel(hw, target, drafter, tp=tp, calibration=CAL)
    cm = CostModel(hw, target, drafter, tp=tp, calibration=CAL, engine=ENGINE)
    assert bare.engine == EngineOverheads()
    b, c = np.array([1, 8, 64]), 4096
    for policy in POLICIES:
        step, base = cm.iteration(policy, b, c), bare.iteration(policy, b, c)
        depth = 0 if policy is None else policy.depth
        tree = policy is not None and policy.topk > 1
        want = ENGINE.iteration_s_for(b, depth, tree, tp)
        np.testing.assert_array_equal(step.engine_s, want)
        assert np.all(step.engine_s > 0)
        assert list(step.phases())[-1] == "engine"
        np.testing.assert_allclose(step.total_s - base.total_s, want, rtol=1e-12)
        for _, name in PHASES[:-1]:
            np.testing.assert_array_equal(getattr(step, name), getattr(base, name))
    # speculating costs the engine more than a plain decode step, a tree more than a chain
    off, chain, tree = (cm.iteration(p, 8, c).engine_s for p in (None, CHAIN, DENSE))
    assert off < chain < tree


def test_breakdown_fields_name_every_phase() -> None:
    names = [f.name for f in dataclasses.fields(StepBreakdown)]
    assert sorted(names) == sorted(name for _, name in PHASES)


# ---- every consumer prices the breakdown's total ----------------------------------------------

ENGINES = [None, ENGINE]


def _engine_id(e: EngineOverheads | None) -> str:
    return "no-engine" if e is None else "engine"


@pytest.mark.parametrize("engine", ENGINES, ids=_engine_id)
def test_objective_step_is_the_breakdowns_total(engine: EngineOverheads | None) -> None:
    cm = _cm(engine=engine)
    obj = ClosedFormObjective(cm, acceptance_model("mt-bench"), samples=64)
    batches = np.array([1, 8, 32, 64])
    for policy in POLICIES:
        for context in (512, 4096):
            step = cm.iteration(None, batches, context)
            if policy is not None:
                tokens, accepted = obj.tree_tokens(policy), obj.expected_tokens(policy)
                # a pruned tree's spread over the batch's requests (0 at batch 1 and for
                # dense trees) spreads its packed verify over the steps
                cv = np.array([obj.tree_spread(policy, int(b)) for b in batches])
                assert cv[0] == 0 and (policy.prune_threshold > 0 or not np.any(cv))
                # a static policy drafts its shape's nodes per level (None: top-k frontier)
                widths = obj.draft_widths(policy)
                assert (widths is not None) == (policy.builder == "static")
                step = cm.iteration(
                    policy, batches, context, tokens=tokens, accepted=accepted, tokens_cv=cv,
                    draft_widths=widths,
                )  # fmt: skip
            np.testing.assert_array_equal(obj.step_times(policy, batches, context), step.total_s)
            np.testing.assert_array_equal(
                obj.iteration(policy, batches, context).total_s, step.total_s
            )
    if engine is not None:  # the engine's host time lengthens every step the objective prices
        plain = ClosedFormObjective(_cm(), acceptance_model("mt-bench"), samples=64)
        for policy in POLICIES:
            assert obj(policy, 8, 4096) < plain(policy, 8, 4096)


def test_objective_charges_a_pruned_policy_exactly_prune_step_more() -> None:
    """At equal tree size (expected_tokens given: tree_tokens is the budget) and equal
    acceptance, the pruned policy's step costs prune_step_s more and nothing else."""
    obj = ClosedFormObjective(_cm(), None, expected_tokens=lambda p: 3.5)
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


@pytest.mark.parametrize("engine", ENGINES, ids=_engine_id)
def test_simulator_step_tables_are_the_breakdowns_total(engine: EngineOverheads | None) -> None:
    cm = _cm(engine=engine)
    pricer = StepPricer(cm)  # context quantum 16: the contexts below sit on table bins
    ctx = np.array([1024.0, 4096.0])
    for b in (1, 8, 32):
        off = cm.iteration(None, b, ctx).total_s
        assert pricer.decode_off(b, 4096.0).total_s == pytest.approx(off[1], rel=1e-12)
        np.testing.assert_allclose(pricer.decode_off_many(b, ctx), off, rtol=1e-12)
        for policy in POLICIES[1:]:
            d, n = policy.depth, policy.budget
            step = cm.iteration(policy, b, ctx)  # depth + 1 extended: d accepted + the bonus
            one = pricer.decode_spec(b, policy, n * b, d * b, 4096.0)
            assert one.total_s == pytest.approx(step.total_s[1], rel=1e-12)
            assert one.draft_s == step.draft_s[1] and one.forward_s == step.verify_s[1]
            assert one.extend_s == step.extend_s[1]
            many = pricer.decode_spec_many(b, policy, np.full(2, n * b), np.full(2, d * b), ctx)
            np.testing.assert_allclose(sum(many), step.total_s, rtol=1e-12)


def test_simulator_mixed_steps_charge_the_options_and_the_engine() -> None:
    """Iterations with prefill chunks: the pruned policy's pass once for its decoders, the
    engine's host time once for the whole batch (decoders and prefilling requests)."""
    pricer = StepPricer(_cm())
    engined = StepPricer(_cm(engine=ENGINE))
    dec, dctx = np.full(4, 32), np.full(4, 2048)
    chunk, cctx = np.array([512]), np.array([0])
    dense_mix = pricer.mixed(DENSE, dec, dctx, 8, chunk, cctx)
    pruned_mix = pricer.mixed(PRUNED, dec, dctx, 8, chunk, cctx)
    assert pruned_mix.total_s - dense_mix.total_s == pytest.approx(PRUNE_S, abs=1e-12)
    none_decoding = pricer.mixed(PRUNED, dec[:0], dctx[:0], 0, chunk, cctx)
    assert none_decoding.total_s == pricer.mixed(DENSE, dec[:0], dctx[:0], 0, chunk, cctx).total_s
    for policy, d in ((DENSE, DENSE.depth), (None, 0)):
        tokens = dec if policy is not None else np.ones(4, dtype=np.int64)
        extra = engined.mixed(policy, tokens, dctx, 8, chunk, cctx).total_s
        extra -= pricer.mixed(policy, tokens, dctx, 8, chunk, cctx).total_s
        assert extra == pytest.approx(ENGINE.iteration_s_for(5, d, d > 0, 1), rel=1e-9)
    prefill_only = engined.mixed(DENSE, dec[:0], dctx[:0], 0, chunk, cctx).total_s
    prefill_only -= pricer.mixed(DENSE, dec[:0], dctx[:0], 0, chunk, cctx).total_s
    assert prefill_only == pytest.approx(ENGINE.iteration_s_for(1, 0, False, 1), rel=1e-9)


@pytest.mark.parametrize("engine", ENGINES, ids=_engine_id)
def test_what_if_phases_are_the_breakdowns(
    engine: EngineOverheads | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    scn = data.DEFAULT_SCENARIO
    res = data.resolve(scn)
    cm = CostModel(res.hardware, res.target, res.drafter, tp=res.tp, calibration=CAL, engine=engine)
    obj = ClosedFormObjective(cm, data.acceptance_for(scn), samples=64)
    monkeypatch.setattr(data, "objective_for", lambda *a, **k: obj)
    for policy in POLICIES:
        w = data.what_if(scn, policy, 8, 4096)
        step = obj.iteration(policy, 8, 4096)
        assert w.phases_s == {k: _scalar(v) for k, v in step.phases().items()}
        assert w.step_s == _scalar(step.total_s)
        assert sum(w.phases_s.values()) == pytest.approx(w.step_s, rel=1e-12)
        assert ("engine" in w.phases_s) == (engine is not None)
        assert ("pruning" in w.phases_s) == (policy is not None and policy.prune_threshold > 0)
        assert ("retrieval" in w.phases_s) == (policy is not None and policy.graft_budget > 0)
    assert data.what_if(scn, BOTH, 8, 4096).phases_s["pruning"] == pytest.approx(PRUNE_S)


# ---- spectune check and the calibration fit ---------------------------------------------------


def _run(cm: CostModel, b: int, policy: TreePolicy, n: float, c: int, acc: float) -> dict:
    """One measured run whose phases are the cost model's own breakdown (the tree phase holds
    the overhead and the policy's options, as the executor times them)."""
    step = cm.iteration(policy, b, c, tokens=n)
    off = cm.iteration(None, b, c)
    ph = dict.fromkeys(PHASE_KEYS, 0.0)
    ph.update(
        draft=_scalar(step.draft_s) * 1e3,
        tree=_scalar(step.overhead_s + step.retrieval_s + step.prune_s) * 1e3,
        verify=_scalar(step.verify_s) * 1e3,
        extend=_scalar(step.extend_s) * 1e3,
        step=_scalar(step.total_s) * 1e3,
    )
    total, ar = _scalar(step.total_s), _scalar(off.total_s)
    tps = b * (acc + 1) / total
    return {
        "batch": b,
        "label": "pruned" if policy.prune_threshold > 0 else "dense",
        "nodes": policy.budget,
        "verified_mean": n,
        "verified_cv": 0.0,  # equal trees: every step at the mean (check reads the measured cv)
        "phases_ms": ph,
        "accepted_mean": acc,
        "tokens_per_step": acc + 1,
        "tokens_per_s": tps,
        "ar_step_ms": ar * 1e3,
        "ar_phases_ms": {
            "verify": _scalar(off.verify_s) * 1e3,
            "overhead": _scalar(off.overhead_s) * 1e3,
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


def test_check_predicts_with_the_breakdowns_totals() -> None:
    """`spectune check`'s speedup is tokens per step x off total / spec total of the same
    breakdowns, so an engine's host time moves the prediction by exactly its share."""
    doc = _doc(_cm())
    for engine in ENGINES:
        cm = _cm(engine=engine)
        res = CheckResult()
        _check_measurement(cm, doc, "run.json", res)
        for run, row in zip(doc["runs"], res.speedup, strict=True):
            b, c, policy = run["batch"], doc["context"], TreePolicy(**run["policy"])
            spec = _scalar(cm.iteration(policy, b, c, tokens=run["verified_mean"]).total_s)
            off = _scalar(cm.iteration(None, b, c).total_s)
            assert row.predicted == pytest.approx(run["tokens_per_step"] * off / spec, rel=1e-12)
            if engine is None:
                assert row.error == pytest.approx(0.0, abs=1e-9)
            else:  # the engine adds more to the longer speculative step in absolute terms,
                assert row.error != pytest.approx(0.0, abs=1e-6)  # so the speedup moves


@pytest.mark.parametrize("engine", ENGINES, ids=_engine_id)
def test_fit_predicts_the_breakdowns_fields(engine: EngineOverheads | None) -> None:
    from spectune.validate.fit import _rows

    cm = _cm(engine=engine)
    doc = _doc(_cm())
    run = {"hardware": HW, "target": TARGET, "drafter": DRAFTER, "verify": []}
    kinds = set()
    for kind, a, _ in _rows(run, [doc]):
        kinds.add(kind)
        got = predict_row(cm, kind, a)
        if kind == "ar":
            assert got == _scalar(cm.iteration(None, a["batch"], a["context"]).total_s)
        elif kind in ("step", "draft", "extend"):
            step = cm.iteration(a["policy"], a["batch"], a["context"], tokens=a.get("tokens"))
            field = {"step": "total_s", "draft": "draft_s", "extend": "extend_s"}[kind]
            assert got == _scalar(getattr(step, field))
            if kind == "step" and engine is not None:
                assert got > predict_row(_cm(), kind, a)
    assert {"ar", "step", "draft", "extend", "verify"} <= kinds


def test_fit_takes_no_forward_rows_from_pruned_runs() -> None:
    """A pruned run gives the efficiency fit its drafting and draft extend, not its packed
    verify or its step (GEMMs at token counts the fit's grids never measure); a dense run
    gives all four, and its overheads still reach _overheads (prune_step_s)."""
    from spectune.validate.fit import _rows

    doc = _doc(_cm())
    run = {"hardware": HW, "target": TARGET, "drafter": DRAFTER, "verify": []}
    by_policy: dict[bool, set[str]] = {True: set(), False: set()}
    for kind, a, _ in _rows(run, [doc]):
        if "policy" in a:
            by_policy[a["policy"].prune_threshold > 0].add(kind)
    assert by_policy[False] == {"verify", "step", "draft", "extend"}
    assert by_policy[True] == {"draft", "extend"}


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
    from spectune.validate.fit import PARAMS, _calibration, _rows, fit_calibration

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
    with pytest.raises(SpecError, match="batch"):
        _cm().prune_time(-1)


@pytest.mark.parametrize("policy", [p for p in POLICIES if p is not None], ids=str)
def test_what_if_draft_parts_sum_to_the_draft_phase(policy: TreePolicy) -> None:
    """The page's drafting breakdown is CostModel.draft_parts, which sums to the draft phase."""
    w = data.what_if(data.DEFAULT_SCENARIO, policy, 8, 4096)
    assert sum(w.draft_steps_s.values()) == pytest.approx(w.phases_s["draft"], rel=1e-12)


def test_objective_prices_a_static_shared_budget_over_the_shape_it_drafts() -> None:
    """Above batch 1 a static policy under a shared budget drafts the larger shape
    (trees.static_size): the objective's draft phase follows its widths per batch size."""
    cm = _cm()
    model = acceptance_model("mt-bench")
    obj = ClosedFormObjective(cm, model, samples=64)
    policy = TreePolicy("static", 5, 4, 16, shared_budget=True)
    one, wide = obj.draft_widths(policy, 1), obj.draft_widths(policy, 8)
    assert one is not None and wide is not None and sum(wide) > sum(one)
    step = obj.iteration(policy, np.array([1, 8]), 4096)
    for i, (b, widths) in enumerate(((1, one), (8, wide))):
        want = cm.draft_time(b, 5, 4, 4096, builder="static", widths=widths)
        assert float(step.draft_s[i]) == pytest.approx(float(want))
    assert obj.draft_widths(TreePolicy("dynamic-topk", 5, 4, 16), 8) is None
