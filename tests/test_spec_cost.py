"""The cost of turning speculation on at all (planner.capacity): the drafter's weights and KV
and the engine's speculative buffers shrink the KV cache and so the batch, an engine may cap
the running requests once speculation is on (SGLang: 48 unless set), and the plan sees both:
"off" runs with the plain server's capacity, the engine's default config runs under its cap,
and where that capacity costs more than speculation gives, the plan turns speculation off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.planner.buckets import BucketSpec
from spectune.planner.capacity import default_max_running, kv_budget
from spectune.planner.engine_plan import engine_plan
from spectune.planner.objective import scenario_objective
from spectune.planner.search import Scorer, SearchSettings, search
from spectune.planner.space import engine_default, engine_space
from spectune.specs import load_hardware, load_model
from spectune.specs.engine import load_engine
from spectune.specs.policy import TreePolicy
from spectune.specs.scenario import Scenario

H100 = load_hardware("h100-sxm")
LLAMA = load_model("llama-3.1-8b")
HEAD = load_model("eagle3-llama-3.1-8b")


def test_a_plain_server_holds_more_kv() -> None:
    spec = kv_budget(H100, LLAMA, HEAD)
    plain = kv_budget(H100, LLAMA, HEAD, speculating=False)
    assert plain.bytes_per_token == LLAMA.kv_bytes_per_token()
    assert spec.bytes_per_token == LLAMA.kv_bytes_per_token() + HEAD.kv_bytes_per_token()
    assert plain.free_bytes == pytest.approx(spec.free_bytes + HEAD.weight_bytes())
    assert plain.tokens > spec.tokens
    extra = kv_budget(H100, LLAMA, HEAD, spec_extra_bytes=4e9)
    assert extra.free_bytes == pytest.approx(spec.free_bytes - 4e9)
    # the plain server ignores the speculative buffers
    assert kv_budget(H100, LLAMA, HEAD, speculating=False, spec_extra_bytes=4e9) == plain


def test_engine_caps_with_speculation_on() -> None:
    assert default_max_running(load_engine("sglang"), True) == 48
    assert default_max_running(load_engine("sglang"), False) is None
    assert default_max_running(load_engine("vllm"), True) == 1024
    assert default_max_running(load_engine("spectune"), True) is None
    assert default_max_running(None, True) is None
    assert SearchSettings(engine="sglang").reference_caps == {"sglang": 48}
    assert SearchSettings().reference_caps == {}


def test_off_runs_with_the_plain_servers_capacity() -> None:
    obj = scenario_objective(Scenario(engine="sglang").resolve())
    ctx = 8192
    spec_fits = int(obj.fitting_batch(256, ctx)[0])
    plain_fits = int(obj.fitting_batch(256, ctx, speculating=False)[0])
    assert spec_fits < plain_fits < 256
    assert obj(None, 256, ctx) == pytest.approx(obj(None, plain_fits, ctx))
    chain = TreePolicy("dynamic-topk", 3, 1, 4)
    assert obj(chain, 256, ctx) == pytest.approx(obj(chain, spec_fits, ctx))


def test_the_default_config_under_sglangs_cap_loses_at_high_concurrency() -> None:
    """SGLang's default (5, 4, 8) with its cap of 48 running requests against no speculation:
    a gain at batch 8, a loss at 256 concurrent requests with a short context (users report
    20-31%), while the same tree exported with the cap set is scored uncapped."""
    s = SearchSettings(trials=4, space=engine_space(load_engine("sglang")), engine="sglang")
    obj = scenario_objective(Scenario(engine="sglang").resolve())
    scorer = Scorer(obj)
    default = engine_default(load_engine("sglang"))
    small, big = BucketSpec((8, 8), (0, 1023)), BucketSpec((256, 256), (0, 1023))
    (r_small, r_big) = search(obj, [small, big], s)
    assert r_small.references["sglang"][0] > 1.2 * r_small.references["off"][0]
    capped, off = r_big.references["sglang"][0], r_big.references["off"][0]
    assert capped < 0.9 * off
    assert capped == pytest.approx(obj(default, 48, big.context_point))
    assert scorer.point_values(default, big)[0] == pytest.approx(obj(default, 256, 512))
    assert r_big.policy is None or r_big.tokens_per_s >= off  # never below off


def test_the_plan_turns_speculation_off_where_capacity_costs_more(tmp_path: Path) -> None:
    """A profile whose speculative buffers take most of the HBM (a user file over sglang): at
    high concurrency and a short context the speculating server holds too few requests, so a
    plan for such traffic turns speculation off; a plan that also serves batch 1 keeps it on,
    and its large-batch range then pays the lost capacity whatever it runs there (turning a
    range off does not unload the drafter)."""
    heavy = tmp_path / "heavy.json"
    heavy.write_text(json.dumps({"base": "sglang", "name": "heavy", "spec_extra_hbm_bytes": 5e10}))
    prof = load_engine(str(heavy))
    obj = scenario_objective(Scenario(engine=str(heavy)).resolve())
    s = SearchSettings(trials=12, space=engine_space(prof), engine=str(heavy), min_gain=0.0)
    busy = [BucketSpec((128, 128), (0, 2047)), BucketSpec((256, 256), (0, 2047))]
    results = search(obj, busy, s)
    assert [r.policy for r in results] == [None, None]  # the per-bucket search turns it off
    plan = engine_plan(results, prof, Scorer(obj))
    assert plan.config.kind == "off"
    ctx = busy[1].context_point
    assert plan.results[1].tokens_per_s == pytest.approx(obj(None, 256, ctx))

    mixed = [BucketSpec((1, 1), (0, 2047)), busy[1]]
    plan = engine_plan(search(obj, mixed, s), prof, Scorer(obj))
    assert plan.config.kind != "off"  # batch 1 gains too much to give up
    top = plan.results[1]
    resident = obj.many(None, [256], ctx, resident=True)[0]
    assert resident < 0.5 * obj(None, 256, ctx)
    assert top.tokens_per_s < 0.7 * obj(None, 256, ctx)
    if top.policy is None:
        assert top.tokens_per_s == pytest.approx(resident)
