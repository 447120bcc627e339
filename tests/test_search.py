"""planner.search, planner.space, planner.buckets: the Optuna policy search.

A small analytic objective stands in for the cost model and acceptance model here, so these
tests pin the search's own behaviour (references first, never losing, turning speculation off,
seeded reproducibility, Pareto fronts, storages) independent of the other parts' numbers.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from spectune.planner.buckets import DEFAULT_BUCKETS, BucketSpec, buckets_from_edges
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.search import Scorer, SearchSettings, geomean, optimize_study, search
from spectune.planner.space import (
    EAGLE_DEFAULT,
    REFERENCES,
    SGLANG_DEFAULT,
    PolicySpace,
    canonical_policy,
    grid,
    max_tree_nodes,
    policy_from_params,
    policy_params,
    suggest_policy,
)
from spectune.planner.step import StepBreakdown
from spectune.planner.studies import (
    make_storage,
    open_study,
    prepare_study,
    settings_from_dict,
    settings_to_dict,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import TreePolicy

optuna.logging.set_verbosity(optuna.logging.WARNING)


class FakeCost:
    """Verify cost linear in batch x tree tokens (so big trees lose at big batches), draft cost
    linear in depth x top-k; a StepBreakdown like CostModel.iteration's."""

    def iteration(
        self,
        policy: TreePolicy | None,
        batch: Any,
        context: Any,
        *,
        tokens: Any = None,
        accepted: Any = None,
        tokens_cv: Any = None,
    ) -> StepBreakdown:
        b = np.asarray(batch, dtype=np.float64)
        if policy is None:
            verify = 0.010 + 2e-5 * b + 1e-9 * b * context
            parts = [0.0, verify, 0.0, 0.0, 0.0, 0.0, 0.0]
        else:
            n = policy.budget if tokens is None else tokens
            a = policy.depth + 1 if accepted is None else accepted
            parts = [
                policy.depth * (0.0004 + 2e-6 * b * policy.topk),
                0.010 + 2e-5 * b * n + 1e-9 * b * context,
                1e-6 * b * a,
                0.0003,
                1e-5 * b if policy.graft_budget > 0 else 0.0,
                0.0,
                0.0,
            ]
        return StepBreakdown(*np.broadcast_arrays(*(np.asarray(x, np.float64) for x in parts)))


def fake_expected(policy: TreePolicy, alpha: float = 0.7) -> float:
    """Accepted length + bonus of a crude tree: `width` siblings per level."""
    width = max(1.0, min(policy.topk, (policy.budget - 1) / policy.depth))
    q = 1 - (1 - alpha) ** width
    d = min(policy.depth, policy.budget - 1)
    return 1 + sum(q**i for i in range(1, d + 1))


def fake_objective(alpha: float = 0.7) -> ClosedFormObjective:
    return ClosedFormObjective(FakeCost(), None, expected_tokens=lambda p: fake_expected(p, alpha))


SMALL = (BucketSpec((1, 1), (0, 4095)), BucketSpec((65, 128), (0, 4095)))


# ---- space --------------------------------------------------------------------------------


def test_space_draws_valid_canonical_policies() -> None:
    space = PolicySpace()
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen_off = False
    for _ in range(200):
        trial = study.ask()
        p = suggest_policy(trial, space)
        study.tell(trial, 0.0)
        if p is None:
            seen_off = True
            continue
        assert 2 <= p.budget <= max_tree_nodes(p.builder, p.depth, p.topk)
        assert p.graft_budget <= p.budget - 1
        assert p == canonical_policy(
            p.builder, p.depth, p.topk, p.budget, p.prune_threshold, p.graft_budget, p.shared_budget
        )
        assert policy_from_params(trial.params) == p
    assert seen_off


@pytest.mark.parametrize(
    "policy", [None, SGLANG_DEFAULT, EAGLE_DEFAULT, TreePolicy("static", 3, 2, 7, 0.01, 3)]
)
def test_policy_params_round_trip(policy: TreePolicy | None) -> None:
    space = PolicySpace()
    params = policy_params(policy, space)
    assert policy_from_params(params) == policy
    assert suggest_policy(optuna.trial.FixedTrial(params), space) == policy


def test_max_tree_nodes_by_hand() -> None:
    assert max_tree_nodes("dynamic-topk", 5, 4) == 1 + 4 + 4 * 16
    assert max_tree_nodes("static", 3, 2) == 1 + 2 + 4 + 8
    assert max_tree_nodes("static", 4, 1) == 5
    assert canonical_policy("dynamic-topk", 3, 1, 60).budget == 4


def test_grid_is_distinct_and_includes_off() -> None:
    pts = list(grid(PolicySpace(builders=("static",)), [1, 2], [1, 2], [2, 4, 8]))
    assert pts[0] is None
    assert len(pts) == len(set(pts))


def test_bad_space_is_an_error() -> None:
    with pytest.raises(SpecError, match="budget"):
        PolicySpace(budget=(1, 8))
    with pytest.raises(SpecError, match="builders"):
        PolicySpace(builders=("beam",))


# ---- buckets ------------------------------------------------------------------------------


def test_default_buckets_cover_batch_and_context() -> None:
    batches = {b.batch for b in DEFAULT_BUCKETS}
    assert min(lo for lo, _ in batches) == 1 and max(hi for _, hi in batches) == 256
    covered = sorted(batches)
    for (_, hi), (lo, _) in itertools.pairwise(covered):
        assert lo == hi + 1
    assert max(b.context[1] for b in DEFAULT_BUCKETS) == 32768
    assert min(b.context[0] for b in DEFAULT_BUCKETS) == 0
    assert buckets_from_edges([1, 4], [100])[1].points() == ((2, 50), (4, 50))


# ---- search -------------------------------------------------------------------------------


def test_references_are_the_first_trials() -> None:
    s = SearchSettings(trials=6, seed=1)
    study = open_study(make_storage(None), "refs", SMALL[0], s)
    prepare_study(study, SMALL[0], s, {})
    optimize_study(study, SMALL[0], Scorer(fake_objective()), s)
    first = [policy_from_params(t.params) for t in study.trials[:3]]
    assert first == list(REFERENCES.values())
    assert len(study.trials) == 6


def test_search_never_loses_and_turns_off() -> None:
    # At batch 256 with weak acceptance, every tree loses to plain decoding.
    buckets = (BucketSpec((1, 1), (0, 4095)), BucketSpec((129, 256), (0, 4095)))
    res = search(fake_objective(alpha=0.25), buckets, SearchSettings(trials=24, seed=0))
    for r in res:
        for i in range(len(r.points)):
            assert r.points[i] >= max(v[i] for v in r.references.values()) * (1 - 1e-9)
    assert res[0].policy is not None and res[0].speedup > 1.0
    assert res[1].policy is None, res[1]
    assert res[1].speedup == pytest.approx(1.0)
    assert res[1].chain is not None and res[1].chain.draft_tokens == 0


def test_search_beats_defaults_on_the_fake() -> None:
    res = search(fake_objective(), SMALL, SearchSettings(trials=30, seed=0))
    for r in res:
        assert r.tokens_per_s >= r.best_default[1]
        assert r.trials >= 30 and r.failed == 0
        assert r.chain is not None and r.chain.draft_tokens >= 1


def _table_json(seed: int) -> str:
    res = search(fake_objective(), SMALL, SearchSettings(trials=16, seed=seed))
    return json.dumps([[repr(r.policy), round(r.tokens_per_s, 6)] for r in res])


def test_same_seed_same_result_in_another_process(tmp_path: Path) -> None:
    here = _table_json(7)
    assert _table_json(7) == here
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import test_search
        print(test_search._table_json(7))
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == here


def test_multi_objective_returns_a_pareto_front() -> None:
    obj = fake_objective()
    s = SearchSettings(trials=24, seed=0, multi_objective=True)
    res = search(obj, SMALL[:1], s, latency=obj.step_latency)
    front = res[0].pareto
    assert len(front) >= 2
    for a in front:  # nobody on the front is dominated by another front point
        assert not any(
            b.tokens_per_s >= a.tokens_per_s
            and b.latency_s <= a.latency_s
            and (b.tokens_per_s, b.latency_s) != (a.tokens_per_s, a.latency_s)
            for b in front
        )
    limit = sorted(q.latency_s for q in front)[len(front) // 2]
    capped = search(
        obj,
        SMALL[:1],
        SearchSettings(trials=24, seed=0, multi_objective=True, max_latency_s=limit),
        latency=obj.step_latency,
    )
    assert obj.step_latency(capped[0].policy, 1, SMALL[0].context_point) <= limit
    with pytest.raises(SpecError, match="latency"):
        search(obj, SMALL[:1], s)


def test_sqlite_storage_resumes_a_finished_study(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    s = SearchSettings(trials=8, seed=0)
    first = search(fake_objective(), SMALL[:1], s, storage=url)
    again = search(fake_objective(), SMALL[:1], s, storage=url)
    assert first[0].policy == again[0].policy
    study = optuna.load_study(study_name=f"spectune.{SMALL[0].name}", storage=url)
    assert len([t for t in study.trials if t.state == TrialState.COMPLETE]) == 8


def test_settings_round_trip_through_study_attrs() -> None:
    s = SearchSettings(trials=5, seed=3, space=PolicySpace(depth=(1, 4)), max_latency_s=0.02)
    assert settings_from_dict(json.loads(json.dumps(settings_to_dict(s)))) == s


def test_bad_storage_url_is_an_error() -> None:
    with pytest.raises(SpecError, match="storage"):
        make_storage("redis://nowhere")


def test_geomean() -> None:
    assert geomean([2.0, 8.0]) == pytest.approx(4.0)


def test_min_gain_keeps_a_reference_unless_the_search_clearly_wins() -> None:
    strict = search(fake_objective(), SMALL[:1], SearchSettings(trials=16, min_gain=10.0))
    assert strict[0].policy in REFERENCES.values()
    assert "kept" in strict[0].note
    free = search(fake_objective(), SMALL[:1], SearchSettings(trials=16, min_gain=0.0))
    assert free[0].tokens_per_s >= strict[0].tokens_per_s
    assert free[0].searched_best == pytest.approx(free[0].tokens_per_s)
    with pytest.raises(SpecError, match="min-gain"):
        SearchSettings(min_gain=-1)


# ---- hierarchical drafting in the space ---------------------------------------------------


def test_hierarchical_space_draws_chains_and_round_trips() -> None:
    from spectune.planner.space import neighbours

    space = PolicySpace(chain=(2, 8))
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=5))
    chains = set()
    for _ in range(200):
        trial = study.ask()
        p = suggest_policy(trial, space, max_batch=8)
        study.tell(trial, 0.0)
        if p is None:
            continue
        assert not (p.chain and p.shared_budget)
        assert p.chain == 0 or 2 <= p.chain <= 8
        chains.add(p.chain)
        assert policy_from_params(trial.params) == p
    assert 0 in chains and len(chains) > 3
    hier = TreePolicy("dynamic-topk", 3, 10, 30, chain=6)
    params = policy_params(hier, space)
    assert policy_from_params(params) == hier
    assert suggest_policy(optuna.trial.FixedTrial(params), space) == hier
    near = neighbours(hier, space)
    assert {q.chain for q in near} >= {0, 5, 6, 7}
    assert any(q.chain == 2 for q in neighbours(TreePolicy("dynamic-topk", 3, 10, 30), space))
    assert neighbours(hier, PolicySpace()) == []  # a tree space holds no chain 6 neighbour
    assert all(p is None or p.chain == 0 for p in grid(PolicySpace(), [2], [2], [4], [0, 4]))
    hier_grid = [p for p in grid(space, [2], [2], [4], [0, 4, 12]) if p is not None]
    assert {p.chain for p in hier_grid} == {0, 4}  # 12 is outside the space


@pytest.mark.parametrize("chain", [(0, 4), (3, 2), (1, 65), (-1, 4)])
def test_bad_hierarchical_space_is_an_error(chain: tuple[int, int]) -> None:
    with pytest.raises(SpecError, match="chain"):
        PolicySpace(chain=chain)


def test_engines_and_the_executor_refuse_hierarchical_policies() -> None:
    from spectune.planner.space import check_engine_policy, check_runnable, engine_space
    from spectune.specs.engine import load_engine

    hier = TreePolicy("dynamic-topk", 3, 10, 30, chain=6)
    for engine in ("sglang", "vllm", "trtllm", "spectune"):
        prof = load_engine(engine)
        assert engine_space(prof, PolicySpace(chain=(2, 8))).chain == (0, 0) or engine == "spectune"
        with pytest.raises(SpecError, match="intermediate"):
            check_engine_policy(hier, prof)
    with pytest.raises(SpecError, match="executor cannot run the hierarchical"):
        check_runnable(hier, "spectune's executor")
    check_runnable(TreePolicy("dynamic-topk", 3, 10, 30))  # trees run


def test_hierarchical_settings_round_trip_through_study_attrs() -> None:
    s = SearchSettings(space=PolicySpace(chain=(2, 12)))
    assert settings_from_dict(json.loads(json.dumps(settings_to_dict(s)))) == s
