"""ECHO's shared verify budget as a policy option (TreePolicy.shared_budget): the policy form and
file, the closed-form price per (policy, batch), the search, the simulator, the exporters and
the executor's rejection."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import optuna
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.planner.acceptance import acceptance_model
from spectune.planner.buckets import BucketSpec
from spectune.planner.costmodel import CostModel
from spectune.planner.export import export_policy
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.search import SearchSettings, search
from spectune.planner.space import (
    PolicySpace,
    canonical_policy,
    max_tree_nodes,
    neighbours,
    policy_from_params,
    policy_params,
    suggest_policy,
)
from spectune.planner.trees import sample_step
from spectune.simulator.speculation import Speculator, tree_sampler
from spectune.specs import (
    Bucket,
    PolicyTable,
    Scenario,
    SpecError,
    TreePolicy,
    load_calibration,
    load_hardware,
    load_model,
    write_json_atomic,
)
from spectune.specs.policy import BUILDERS, ChainChoice, Prediction
from spectune.specs.workload import WORKLOAD_PRESETS

ECHO = TreePolicy("dynamic-topk", 5, 4, 8, shared_budget=True)
ROOT = Path(__file__).resolve().parents[1]

# ---- the policy form and the policy file ----------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> TreePolicy:
    """A random valid TreePolicy; prune thresholds with 3 significant digits (what `label`
    writes), so that parse(label) gives the policy back exactly."""
    budget = draw(st.integers(2, 1024))
    prune = draw(st.sampled_from([0.0, 0.001, 0.0125, 0.05, 0.333]))
    return TreePolicy(
        draw(st.sampled_from([b for b in BUILDERS if b != "delayed"])),  # delayed: no prune/graft
        draw(st.integers(1, 64)),
        draw(st.integers(1, 64)),
        budget,
        prune,
        draw(st.integers(0, budget - 1)),
        draw(st.booleans()),
    )


@given(policies())
@settings(max_examples=200, deadline=None)
def test_label_and_parse_round_trip(policy: TreePolicy) -> None:
    assert TreePolicy.parse(policy.label) == policy
    assert policy.label.endswith(",echo") == policy.shared_budget


def test_existing_forms_parse_as_before() -> None:
    assert TreePolicy.parse("static:5,4,8") == TreePolicy("static", 5, 4, 8)
    assert TreePolicy.parse("dynamic-topk:6,8,32,0.01") == TreePolicy(
        "dynamic-topk", 6, 8, 32, 0.01
    )
    assert TreePolicy.parse("dynamic-topk:6,8,32,0.01,4") == TreePolicy(
        "dynamic-topk", 6, 8, 32, 0.01, 4
    )
    assert TreePolicy("dynamic-topk", 5, 4, 8).label == "dynamic-topk:5,4,8"
    assert ECHO.label == "dynamic-topk:5,4,8,echo"
    assert TreePolicy.parse("dynamic-topk:5,4,8,echo") == ECHO
    assert TreePolicy.parse("static:6,8,32,0.02,3,echo") == TreePolicy(
        "static", 6, 8, 32, 0.02, 3, True
    )
    for bad in ("dynamic-topk:5,4,echo", "dynamic-topk:echo", "dynamic-topk:5,4,8,echo,echo"):
        with pytest.raises(SpecError, match="cannot parse policy"):
            TreePolicy.parse(bad)


def test_shared_budget_must_be_a_bool() -> None:
    with pytest.raises(SpecError, match="shared_budget"):
        TreePolicy("dynamic-topk", 5, 4, 8, shared_budget=1)  # type: ignore[arg-type]


def _table(*policies: TreePolicy | None) -> PolicyTable:
    edges = [(1, 1), (2, 8), (9, 64), (65, 256)]
    buckets = tuple(
        Bucket(
            b,
            (0, 4095),
            p,
            Prediction(1000.0 * b[1], 2.0, 3.0),
            ChainChoice(3 if p else 0, 800.0 * b[1], 1.6),
        )
        for b, p in zip(edges, policies, strict=True)
    )
    return PolicyTable(
        "llama-3.1-8b", "eagle3-llama-3.1-8b", "h100-sxm", buckets, workload="mt-bench"
    )


def test_policy_files_round_trip_and_old_files_load(tmp_path: Path) -> None:
    pol = TreePolicy("dynamic-topk", 7, 8, 48)
    t = _table(pol, ECHO, TreePolicy("static", 3, 2, 6, shared_budget=True), None)
    path = tmp_path / "policy.json"
    t.save(path)
    back = PolicyTable.load(path)
    assert back == t
    assert back.buckets[1].policy is not None and back.buckets[1].policy.shared_budget
    # a file written before the field existed: no 'shared_budget' key
    old = t.to_dict()
    for b in old["buckets"]:
        if b["policy"] is not None:
            b["policy"].pop("shared_budget")
    loaded = PolicyTable.from_dict(old)
    assert all(b.policy is None or not b.policy.shared_budget for b in loaded.buckets)
    assert loaded.buckets[0].policy == pol
    old["buckets"][0]["policy"]["shared_budget"] = "yes"
    with pytest.raises(SpecError, match="shared_budget"):
        PolicyTable.from_dict(old)


# ---- the closed-form price ------------------------------------------------------------------

COST = CostModel(
    load_hardware("h100-sxm"), load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
)
# confident and unconfident requests far apart (Beta concentration 0.5): a shared budget moves
# draft slots from the hopeless requests to the confident ones
# (means pinned to an EAGLE-2-like head, top-1 0.79 decaying 0.93 per level, so that the search
# outcomes below do not move with the dataset presets' acceptance)
SPREAD = replace(
    WORKLOAD_PRESETS["mt-bench"],
    name="mt-bench-spread",
    confidence_concentration=0.5,
    confidence_mean=tuple(min(0.97, 0.7935 * 0.93**d) for d in range(8)),
    depth_decay=0.93,
)


def _objective(workload=SPREAD, samples: int = 512) -> ClosedFormObjective:
    return ClosedFormObjective(COST, acceptance_model(workload), samples=samples)


def test_objective_prices_a_shared_policy_from_sample_step_at_its_batch() -> None:
    obj = _objective()
    model = obj.acceptance
    for policy, batch in ((ECHO, 32), (TreePolicy("static", 4, 4, 12, shared_budget=True), 8)):
        rng = np.random.default_rng(123)
        draws = [sample_step(policy, model, rng, batch, shared_budget=True) for _ in range(300)]
        tokens = np.concatenate([d[0] for d in draws])
        nodes = np.concatenate([d[1] for d in draws])
        expected = np.concatenate([d[2] for d in draws])
        assert obj.expected_tokens(policy, batch) == pytest.approx(expected.mean(), rel=0.02)
        assert obj.expected_tokens(policy, batch) == pytest.approx(tokens.mean(), rel=0.03)
        assert obj.tree_tokens(policy, batch) == pytest.approx(nodes.mean(), rel=0.02)
        # the shared budget pays off here, and it is not the per-request value
        alone = replace(policy, shared_budget=False)
        assert obj.expected_tokens(policy, batch) > obj.expected_tokens(alone) * 1.01


def test_shared_policy_at_batch_1_is_its_per_request_twin() -> None:
    obj = _objective()
    alone = replace(ECHO, shared_budget=False)
    assert obj.expected_tokens(ECHO) == obj.expected_tokens(alone)
    assert obj.expected_tokens(ECHO, 1) == obj.expected_tokens(alone)
    assert obj.tree_tokens(ECHO, 1) == obj.tree_tokens(alone)
    assert obj(ECHO, 1, 2048) == obj(alone, 1, 2048)


def test_many_prices_several_batch_sizes_of_a_shared_policy() -> None:
    obj = _objective()
    batches = [1, 4, 32, 64]
    together = obj.many(ECHO, batches, 2048)
    one_by_one = [_objective()(ECHO, b, 2048) for b in batches]
    assert together == pytest.approx(one_by_one, rel=1e-12)
    e, n = obj.per_step(ECHO, np.array(batches, dtype=np.float64))
    assert e.tolist() == [obj.expected_tokens(ECHO, b) for b in batches]
    assert n.tolist() == [obj.tree_tokens(ECHO, b) for b in batches]
    # per-request policies: one value at every batch size, as before
    alone = replace(ECHO, shared_budget=False)
    e, _ = obj.per_step(alone, np.array(batches, dtype=np.float64))
    assert set(e.tolist()) == {obj.expected_tokens(alone)}


# ---- the search -----------------------------------------------------------------------------


def test_space_draws_the_shared_switch_only_above_batch_1() -> None:
    space = PolicySpace()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    seen = {1: set(), 8: set()}
    for _ in range(150):
        for max_batch in (1, 8):
            trial = study.ask()
            p = suggest_policy(trial, space, max_batch)
            study.tell(trial, 0.0)
            if p is None:
                continue
            seen[max_batch].add(p.shared_budget)
            assert ("shared_budget" in trial.params) == (max_batch > 1)
            assert policy_from_params(trial.params) == p
            assert 2 <= p.budget <= max_tree_nodes(p.builder, p.depth, p.topk)
    assert seen == {1: {False}, 8: {False, True}}
    off = PolicySpace(allow_shared=False)
    assert "shared_budget" not in policy_params(ECHO, off, 8)
    assert policy_params(ECHO, space, 8)["shared_budget"] is True
    assert "shared_budget" not in policy_params(ECHO, space, 1)
    assert canonical_policy("dynamic-topk", 5, 4, 8, shared_budget=True, max_batch=1) == replace(
        ECHO, shared_budget=False
    )
    assert replace(ECHO, shared_budget=False) in neighbours(ECHO, space, 8)
    assert all(not q.shared_budget for q in neighbours(ECHO, space, 1))


def test_search_picks_a_shared_budget_where_it_helps() -> None:
    obj = _objective(samples=256)
    # the default space and margin: ECHO is predicted >= min_gain (5%) over its twin here
    # (batch 33-64; a shared budget pays the ragged verify's packing, Calibration.prune_step_s,
    # which at 65-128 leaves it +3.6% on this workload)
    (r,) = search(obj, [BucketSpec((33, 64), (2048, 2048))], SearchSettings(chains=False))
    assert r.policy is not None and r.policy.shared_budget, (r.policy, r.note)
    alone = replace(r.policy, shared_budget=False)
    gain = r.tokens_per_s / np.sqrt(obj(alone, 33, 2048) * obj(alone, 64, 2048)) - 1
    assert gain >= 0.05
    # and never at batch 1, where the shared budget is the per-request one
    (one,) = search(obj, [BucketSpec((1, 1), (2048, 2048))], SearchSettings(trials=12))
    assert one.policy is None or not one.policy.shared_budget


def test_search_keeps_the_per_request_twin_unless_echo_gains_min_gain() -> None:
    obj = _objective(samples=256)
    space = PolicySpace(
        builders=("dynamic-topk",),
        depth=(2, 6),
        topk=(1, 4),
        budget=(2, 16),
        allow_prune=False,
        graft=(0, 0),
    )
    s = SearchSettings(trials=40, seed=0, space=space, min_gain=0.0, chains=False)
    bucket = BucketSpec((32, 32), (2048, 2048))
    (r,) = search(obj, [bucket], s)
    assert r.policy is not None and r.policy.shared_budget, r.policy
    alone = replace(r.policy, shared_budget=False)
    gain = obj(r.policy, 32, 2048) / obj(alone, 32, 2048) - 1
    assert 0.01 < gain < 0.5
    (kept,) = search(obj, [bucket], replace(s, min_gain=gain + 0.01))
    assert kept.policy is not None and not kept.policy.shared_budget
    assert "kept the per-request budget" in kept.note


def test_no_shared_budget_for_a_space_that_forbids_it() -> None:
    obj = _objective(samples=128)
    space = PolicySpace(
        builders=("dynamic-topk",),
        depth=(2, 4),
        topk=(1, 2),
        budget=(2, 8),
        allow_prune=False,
        graft=(0, 0),
        allow_shared=False,
    )
    s = SearchSettings(trials=10, seed=0, space=space, chains=False)
    (r,) = search(obj, [BucketSpec((32, 32), (2048, 2048))], s)
    assert r.policy is None or not r.policy.shared_budget


# ---- simulator --------------------------------------------------------------------------------


def test_speculator_shares_per_policy_and_the_override_forces_it() -> None:
    sampler = tree_sampler(acceptance_model("mt-bench"))
    alone = replace(ECHO, shared_budget=False)
    spec = Speculator(ECHO, sampler, pool_size=64)
    assert spec.shared and spec.pool(ECHO, 8).group == 8 and spec.pool(ECHO, 1).group == 1
    plain = Speculator(alone, sampler, pool_size=64)
    assert not plain.shared and plain.pool(alone, 8).group == 1
    forced = Speculator(alone, sampler, pool_size=64, shared_budget=True)
    assert forced.shared and forced.pool(alone, 8).group == 8
    table = _table(None, alone, ECHO, None)
    assert Speculator(table, sampler).shared
    assert not Speculator(_table(None, alone, alone, None), sampler).shared


def test_simulate_runs_a_shared_policy() -> None:
    from spectune.simulator import ClosedLoop, LengthDist, SimConfig, simulate

    cfg = SimConfig(
        load_hardware("h100-sxm"),
        load_model("llama-3.1-8b"),
        load_model("eagle3-llama-3.1-8b"),
        ClosedLoop(8),
        policy=ECHO,
        workload=WORKLOAD_PRESETS["mt-bench"],
        requests=40,
        prompt=LengthDist(200.0, 0.5),
        output=LengthDist(64.0, 0.5),
        cost_model=COST,
        tree_pool=256,
        pool_cache={},
    )
    res = simulate(cfg)
    assert res.spec.metrics.throughput_tok_s > res.off.metrics.throughput_tok_s
    assert cfg.pool_cache is not None
    assert any(k[0] == ECHO and k[1] > 1 for k in cfg.pool_cache)  # whole-batch pools


# ---- exports and the executor -----------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_exports_say_echo_and_export_the_per_request_policy(engine: str) -> None:
    alone = replace(ECHO, shared_budget=False)
    shared = _table(TreePolicy("dynamic-topk", 7, 8, 48), ECHO, ECHO, None)
    plain = _table(TreePolicy("dynamic-topk", 7, 8, 48), alone, alone, None)
    a, b = export_policy(shared, engine), export_policy(plain, engine)
    notes = [n for n in a.approximations if "ECHO" in n]
    assert len(notes) == 1 and "2-8" in notes[0] and "9-64" in notes[0]
    assert not any("ECHO" in n for n in b.approximations)
    assert a.config == b.config
    assert any("ECHO" in text for text in a.files.values())


def test_executor_plans_with_shared_budget_and_grafting(tmp_path: Path) -> None:
    """plan_table searches the whole space the executor runs, ECHO and grafting included (what
    it picks depends on the calibration's ragged-verify cost: on the H200 fit, per-request
    trees)."""
    from spectune.validate.planned import plan_table

    cal_file = ROOT / "measurements/h200/calibration-h200.json"
    spread = tmp_path / "spread.json"
    write_json_atomic(spread, asdict(SPREAD))  # where the search picks ECHO at batch 32
    scenario = Scenario(
        gpu=load_calibration(cal_file).hardware, workload=str(spread), calibration=str(cal_file)
    )
    table = plan_table(scenario, batches=[32, 64], context=2048, trials=16, min_gain=0.0)
    assert table.scenario == scenario
    assert "graft (0, 16), shared budget allowed" in table.provenance["space"]
