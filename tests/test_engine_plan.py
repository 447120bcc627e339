"""planner.engine_plan: one configuration the engine runs, chosen over every bucket of a plan.

Scores here are made up per (policy, batch range) so that the best configuration of each kind
is known by hand; the property test checks on random scores that the choice is always one the
engine runs (runnable_reason is empty for the plan it writes) and never loses to a candidate."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.planner.buckets import BucketSpec, buckets_from_edges
from spectune.planner.engine_plan import (
    choose_engine_config,
    engine_plan,
    fit_table,
    runnable_reason,
)
from spectune.planner.search import Scorer, SearchSettings, search
from spectune.planner.space import engine_default, engine_space
from spectune.specs.engine import load_engine
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy

BUCKETS = buckets_from_edges((1, 8, 64, 256), (4096, 32768))  # 4 batch ranges x 2 contexts


def chain(d: int) -> TreePolicy:
    return TreePolicy("dynamic-topk", d, 1, d + 1)


def tree(d: int, k: int, n: int) -> TreePolicy:
    return TreePolicy("dynamic-topk", d, k, n)


def by_range(best_depth: dict[tuple[int, int], int], tree_bonus: float = 0.0):  # type: ignore[no-untyped-def]
    """A score whose best chain at each batch range is best_depth[range] (0: off best), and
    where a tree scores `tree_bonus` above a chain of its depth."""

    def score(p: TreePolicy | None, b: BucketSpec) -> float:
        want = best_depth[b.batch]
        d = 0 if p is None else p.depth
        s = 100.0 - 3.0 * (d - want) ** 2
        if p is not None and p.topk > 1:
            s += tree_bonus
        return max(s, 1.0)

    return score


DEPTHS = {(1, 1): 6, (2, 8): 5, (9, 64): 3, (65, 256): 0}


CHAINS = [6, 6, 5, 5, 3, 3, 0, 0]  # each bucket's best chain (BUCKETS order)


def _winners() -> list[TreePolicy | None]:
    """Each bucket's own winner (BUCKETS order)."""
    w = {(1, 1): tree(6, 4, 16), (2, 8): tree(5, 4, 16), (9, 64): chain(3), (65, 256): None}
    return [w[b.batch] for b in BUCKETS]


def test_vllm_gets_a_chain_length_per_range_with_off() -> None:
    prof = load_engine("vllm")
    cfg, cands = choose_engine_config(BUCKETS, _winners(), CHAINS, prof, by_range(DEPTHS, 5.0))
    assert cfg.kind == "schedule"
    assert [0 if p is None else p.depth for p in cfg.policies] == [6, 5, 3, 0]
    assert all(p is None or p.topk == 1 for c in cands for p in c.policies)  # chains only
    assert cfg.tokens_per_s == pytest.approx(100.0)


def test_sglang_schedules_chains_only_and_trees_stay_static() -> None:
    prof = load_engine("sglang")
    # trees help a lot: one static tree beats adaptive chains
    cfg, cands = choose_engine_config(BUCKETS, _winners(), [None] * 8, prof, by_range(DEPTHS, 30))
    assert cfg.kind == "static" and cfg.policies[0] is not None and cfg.policies[0].topk > 1
    sched = [c for c in cands if c.kind == "schedule"]
    assert sched and all(p is None or p.topk == 1 for c in sched for p in c.policies)
    # trees help little: adaptive chains, a draft length per range, off at the top
    cfg, _ = choose_engine_config(BUCKETS, _winners(), [None] * 8, prof, by_range(DEPTHS, 1.0))
    assert cfg.kind == "schedule"
    assert [0 if p is None else p.depth for p in cfg.policies] == [6, 5, 3, 0]


def test_trtllm_first_range_is_the_longest() -> None:
    prof = load_engine("trtllm")
    depths = {(1, 1): 3, (2, 8): 6, (9, 64): 6, (65, 256): 0}
    cfg, _ = choose_engine_config(BUCKETS, _winners(), [None] * 8, prof, by_range(depths))
    first = cfg.policies[0]
    assert first is not None
    assert all(p is None or p.depth <= first.depth for p in cfg.policies)
    assert cfg.policies[-1] is None  # off above 64


def test_min_gain_keeps_the_engine_default() -> None:
    prof = load_engine("sglang")
    default = engine_default(prof)

    def score(p: TreePolicy | None, b: BucketSpec) -> float:
        return 103.0 if p == tree(6, 4, 16) else 100.0 if p == default else 50.0

    cfg, _ = choose_engine_config(BUCKETS, _winners(), [None] * 8, prof, score)
    assert cfg.policies[0] == tree(6, 4, 16)
    cfg, _ = choose_engine_config(BUCKETS, _winners(), [None] * 8, prof, score, min_gain=0.05)
    assert cfg.reference == "default" and set(cfg.policies) == {default}


def _table(policies: list[TreePolicy | None]) -> PolicyTable:
    return PolicyTable(
        "llama-3.1-8b",
        "eagle3-llama-3.1-8b",
        "h100-sxm",
        tuple(Bucket(b.batch, b.context, p) for b, p in zip(BUCKETS, policies, strict=True)),
        workload="mt-bench",
    )


@settings(max_examples=40, deadline=None)
@given(
    engine=st.sampled_from(["sglang", "vllm", "trtllm", "trtllm-1.4", "trtllm-stage1"]),
    weights=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
    bonus=st.floats(-10.0, 40.0),
)
def test_the_choice_is_runnable_and_best(engine: str, weights: list[float], bonus: float) -> None:
    prof = load_engine(engine)
    best = {
        r: round(8 * w) for r, w in zip(sorted({b.batch for b in BUCKETS}), weights, strict=True)
    }
    score = by_range(best, bonus)
    winners = [
        None if prof.trees is False and p is not None and p.topk > 1 else p for p in _winners()
    ]
    cfg, cands = choose_engine_config(BUCKETS, winners, [None] * 8, prof, score)
    assert cfg.tokens_per_s == max(c.tokens_per_s for c in cands)
    plan = _table([cfg.policy_for(b.batch) for b in BUCKETS])
    assert runnable_reason(plan, prof) == "", cfg.label
    expect = math.exp(
        sum(math.log(score(cfg.policy_for(b.batch), b)) for b in BUCKETS) / len(BUCKETS)
    )
    assert cfg.tokens_per_s == pytest.approx(expect)


def test_runnable_reason_names_what_the_engine_cannot_run() -> None:
    mixed = _table(_winners())
    assert "one top-k" in runnable_reason(mixed, load_engine("sglang"))
    trees = _table([tree(6, 4, 16)] * 6 + [None] * 2)
    assert "top-k 1" in runnable_reason(trees, load_engine("sglang"))
    assert "chains only" in runnable_reason(mixed, load_engine("vllm"))
    per_ctx = _table([chain(3), chain(4)] + [chain(3)] * 6)
    assert "other contexts" in runnable_reason(per_ctx, load_engine("vllm"))
    assert runnable_reason(mixed, load_engine("spectune")) == ""
    pruned = _table([replace(tree(6, 4, 16), prune_threshold=0.01)] * 8)
    assert "otherwise" in runnable_reason(pruned, load_engine("sglang"))


def test_engine_plan_of_a_search() -> None:
    """On a real (fake-objective) search: every bucket holds the chosen configuration, scored
    as such; a changed bucket says its own optimum; the cost is the per-bucket optima's
    geometric mean over the configuration's."""
    from test_search import fake_objective

    obj = fake_objective()
    prof = load_engine("vllm")
    buckets = buckets_from_edges((1, 64), (4096, 32768))
    s = SearchSettings(trials=10, space=engine_space(prof), engine="vllm", min_gain=0.0)
    scorer = Scorer(obj)
    results = search(obj, buckets, s)
    plan = engine_plan(results, prof, scorer)
    for r in plan.results:
        assert r.policy == plan.config.policy_for(r.bucket.batch)
        assert r.tokens_per_s == pytest.approx(
            math.exp(sum(math.log(v) for v in r.points) / len(r.points))
        )
    for old, new in zip(results, plan.results, strict=True):
        assert (old.policy == new.policy) == (new.note == old.note)
    own = math.exp(sum(math.log(r.tokens_per_s) for r in results) / len(results))
    assert plan.per_bucket_tokens_per_s == pytest.approx(own)
    assert plan.cost == pytest.approx(1 - plan.config.tokens_per_s / own)
    assert "engine-runnable plan" in plan.summary and plan.provenance()["config"]


def test_fit_table_keeps_a_runnable_table() -> None:
    """A table the engine runs as written is its own best fit under an objective that prefers
    it, and fit_table says nothing was lost."""
    prof = load_engine("vllm")
    plan = _table([chain(5)] * 2 + [chain(4)] * 2 + [chain(2)] * 2 + [None] * 2)
    depths = {(1, 1): 5, (2, 8): 4, (9, 64): 2, (65, 256): 0}
    score = by_range(depths)

    def evaluate(p: TreePolicy | None, batch: int, ctx: int) -> float:
        r = next(b for b in BUCKETS if b.batch[0] <= batch <= b.batch[1])
        return score(p, r)

    fitted, cfg, loss = fit_table(plan, prof, evaluate)
    assert fitted == plan and loss == pytest.approx(0.0) and cfg.kind == "schedule"


def test_a_latency_limit_keeps_infeasible_policies_out() -> None:
    """Multi-objective plans: a configuration that runs a policy over the step-latency limit
    anywhere is chosen only when nothing else is feasible."""
    prof = load_engine("sglang")

    def feasible(p: TreePolicy | None, b: BucketSpec) -> bool:
        return p is None or (p.topk == 1 and p.depth <= 4)

    cfg, _ = choose_engine_config(
        BUCKETS, _winners(), [None] * 8, prof, by_range(DEPTHS, 30), feasible=feasible
    )
    assert all(p is None or (p.topk == 1 and p.depth <= 4) for p in cfg.policies)
    assert cfg.policies[-1] is None  # the top range still turns off


def test_a_range_turned_off_inside_a_speculating_config_keeps_the_drafter() -> None:
    """`resident_off` scores the off ranges of a speculating schedule; plain off everywhere
    keeps the plain score, and a resident off worse than a 1-token chain is not chosen."""
    prof = load_engine("vllm")
    score = by_range(DEPTHS)
    cfg, cands = choose_engine_config(
        BUCKETS, _winners(), CHAINS, prof, score, resident_off=lambda b: 99.0
    )
    off = next(c for c in cands if c.kind == "off")
    plain = [math.log(score(None, b)) for b in BUCKETS]
    assert off.tokens_per_s == pytest.approx(math.exp(sum(plain) / 8))
    assert cfg.kind == "schedule" and cfg.policies[-1] is None
    # two of eight buckets (range 65-256) scored at 99 instead of 100
    assert cfg.tokens_per_s == pytest.approx(math.exp((6 * math.log(100) + 2 * math.log(99)) / 8))
    cfg, _ = choose_engine_config(
        BUCKETS, _winners(), CHAINS, prof, score, resident_off=lambda b: 50.0
    )
    assert cfg.policies[-1] == chain(1)  # 97 beats a resident off at 50
