"""Hierarchical drafting from a Scenario and the CLI: the intermediate model is checked as
drafter pairs are, its two acceptances come from the presets, the objective prices and KV-caps
hierarchical policies, and `spectune plan --intermediate` searches, records and compares them
(engines refuse them)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.planner.buckets import BucketSpec
from spectune.planner.objective import scenario_objective
from spectune.planner.search import search
from spectune.planner.space import PolicySpace
from spectune.planner.studies import SearchSettings
from spectune.specs import SpecError, TreePolicy, model_preset
from spectune.specs.compat import PairWarning
from spectune.specs.scenario import Scenario
from spectune.specs.workload import intermediate_workload, load_workload

HIER = Scenario(target="llama-3.1-70b", drafter="llama-3.2-1b", tp=4, intermediate="llama-3.1-8b")
PAPER = Scenario(
    target="llama-3.1-70b-gptq",
    drafter="eagle-llama-3-70b",
    intermediate="llama-3.1-8b-gptq",
    intermediate_drafter="eagle-llama-3.1-8b",
)


def test_scenario_resolves_the_intermediate_stage_and_round_trips() -> None:
    r = HIER.resolve()
    assert r.intermediate is not None and r.intermediate.name == "llama-3.1-8b"
    assert r.intermediate_drafter == r.drafter  # default: the drafter grows the trees
    assert r.intermediate_chains is not None and r.intermediate_trees is not None
    # the chain preset (fitted to the 8B -> 70B figure) is not the 1B draft model's
    assert r.intermediate_chains.accept_by_rank == ((pytest.approx(0.8799, abs=1e-3),),)
    assert r.intermediate_trees.source != r.intermediate_chains.source
    assert "intermediate llama-3.1-8b" in r.label
    assert Scenario.from_dict(HIER.to_dict()) == HIER
    old = {k: v for k, v in HIER.to_dict().items() if not k.startswith("intermediate")}
    assert Scenario.from_dict(old).intermediate is None  # policy files from before load


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"intermediate": "eagle-llama-3.1-8b"}, "draft head"),
        ({"intermediate": "qwen3-8b"}, "field 'vocab'"),
        ({"drafter": "none"}, "no drafter"),
        ({"intermediate_drafter": "eagle3-llama-3.1-70b"}, "field 'hidden'"),
    ],
)
def test_incompatible_intermediate_stages_name_the_field(
    changes: dict[str, str], words: str
) -> None:
    with pytest.raises(SpecError, match=words):
        HIER.replace(**changes).resolve()


def test_intermediate_drafter_needs_an_intermediate() -> None:
    with pytest.raises(SpecError, match="needs an intermediate"):
        Scenario(intermediate_drafter="llama-3.2-1b")


def test_intermediate_preset_warns_off_its_size_and_follows_temperature() -> None:
    target, small = model_preset("llama-3.1-70b"), model_preset("llama-3.2-1b")
    with pytest.warns(PairWarning, match="tenth of its size"):
        intermediate_workload(load_workload("mt-bench"), target, small)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eight = model_preset("llama-3.1-8b")
        t0 = intermediate_workload(load_workload("mt-bench"), target, eight)
        t1 = intermediate_workload(load_workload("mt-bench-t1"), target, eight)
    assert t1.accept_by_rank[0][0] < t0.accept_by_rank[0][0]


def test_objective_prices_hierarchical_policies_with_the_intermediate_loaded() -> None:
    flat_only = scenario_objective(HIER.replace(intermediate=None).resolve())
    obj = scenario_objective(HIER.resolve())
    tree = TreePolicy("dynamic-topk", 3, 8, 16)
    hier = TreePolicy("dynamic-topk", 3, 8, 16, chain=6)
    assert obj(tree, 8, 2048) == pytest.approx(flat_only(tree, 8, 2048))  # flat: unchanged
    assert obj.hierarchy is not None and flat_only.hierarchy is None
    assert obj.expected_tokens(hier) > 5.0  # chains of >= 6 at alpha 0.88
    step = obj.iteration(hier, 1, 2048)
    assert float(step.intermediate_s[0]) > 0
    # the intermediate's weights and KV leave less room: fewer requests fit at a long context
    big, ctx = 4096, 60000
    assert obj.fitting_batch(big, ctx, True, True)[0] < obj.fitting_batch(big, ctx, True)[0]
    with pytest.raises(SpecError, match="intermediate"):
        flat_only(hier, 1, 2048)


def test_search_keeps_the_best_flat_policy_unless_hierarchy_gains_min_gain() -> None:
    """A hierarchical policy 2% faster than its flat twin is not worth a second model."""

    def objective(policy: TreePolicy | None, batch: int, context: int) -> float:
        if policy is None:
            return 100.0
        if policy.depth > 4 or policy.topk > 4 or policy.budget > 16:  # the engine defaults
            return 95.0
        base = 100.0 + policy.depth + policy.topk  # flat optimum at the space's corner
        return base * (1.02 if policy.chain else 1.0)

    space = PolicySpace(depth=(1, 4), topk=(1, 4), budget=(2, 16), allow_prune=False,
                        graft=(0, 0), allow_shared=False, chain=(2, 4))  # fmt: skip
    bucket = [BucketSpec((1, 1), (1024, 1024))]
    settings = SearchSettings(trials=60, space=space, min_gain=0.05, chains=False, seed=0)
    [res] = search(objective, bucket, settings)
    assert res.flat is not None and res.policy is not None
    assert not res.policy.chain and "kept the best flat policy" in res.note
    [res] = search(objective, bucket, SearchSettings(**{**settings.__dict__, "min_gain": 0.0}))
    assert res.policy is not None and res.policy.chain and res.hierarchical_gain
    assert res.hierarchical_gain == pytest.approx(1.02, abs=0.02)


def test_plan_with_intermediate_records_it_and_engines_refuse(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    argv = ["plan", "--target", PAPER.target, "--drafter", PAPER.drafter,
            "--intermediate", "llama-3.1-8b-gptq", "--intermediate-drafter",
            "eagle-llama-3.1-8b", "--batch-edges", "1", "--context-edges", "2048",
            "--trials", "60", "--quiet", "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    doc = json.loads(out.read_text())
    assert doc["scenario"]["intermediate"] == "llama-3.1-8b-gptq"
    assert doc["scenario"]["intermediate_drafter"] == "eagle-llama-3.1-8b"
    assert doc["buckets"][0]["policy"]["chain"] >= 2  # the W4A16 70B at batch 1: the paper's case
    [flat] = doc["provenance"]["flat_comparison"]
    assert flat["gain_over_flat"] >= 0.05 and ",hier" not in flat["best_flat"]
    assert "over the best flat" in text and "no serving engine runs" in text
    assert main(["export", "--engine", "sglang", str(out), "--out", str(tmp_path / "e")]) == 2
    assert "hierarchical" in capsys.readouterr().err
    assert main([*argv, "--engine", "sglang"]) == 2
    assert "does not run hierarchical drafting" in capsys.readouterr().err


def test_with_flat_search_compares_with_the_better_flat_optimum() -> None:
    from spectune.planner.search import BucketResult, with_flat_search

    b = BucketSpec((1, 1), (1024, 1024))
    refs = {"off": (100.0,)}
    tree, hier = TreePolicy("dynamic-topk", 3, 4, 12), TreePolicy("static", 2, 4, 9, chain=4)

    def result(policy: TreePolicy | None, tps: float, flat: float | None = None) -> BucketResult:
        starved = None if flat is None else (None, flat, (flat,))
        return BucketResult(b, policy, tps, (tps,), refs, 10, 0, flat=starved)

    # a hierarchical pick 10% over the starved in-study flat but only 3% over the flat search
    out = with_flat_search(result(hier, 206.0, 187.0), result(tree, 200.0), min_gain=0.05)
    assert out.policy == tree and out.tokens_per_s == 200.0 and "kept the best flat" in out.note
    assert out.flat is not None and out.flat[0] == tree
    out = with_flat_search(result(hier, 220.0, 187.0), result(tree, 200.0), min_gain=0.05)
    assert out.policy == hier and out.hierarchical_gain == pytest.approx(1.1)
    out = with_flat_search(result(tree, 190.0, 190.0), result(tree, 200.0), min_gain=0.05)
    assert out.tokens_per_s == 200.0  # a flat pick: the better of the two searches


def test_cost_tree_and_simulate_take_the_intermediate(capsys: pytest.CaptureFixture[str]) -> None:
    models = ["--target", "llama-3.1-70b", "--drafter", "llama-3.2-1b", "--tp", "4"]
    assert main(["cost", *models, "--intermediate", "llama-3.1-8b", "--tokens", "1,64",
                 "--batch", "1", "--json"]) == 0  # fmt: skip
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert 0 < rows[0]["intermediate_verify_s"] <= rows[1]["intermediate_verify_s"]
    assert rows[0]["intermediate_verify_s"] < rows[0]["verify_s"]  # 8B under 70B
    assert main(["cost", *models, "--intermediate", "qwen3-8b"]) == 2
    assert "field 'vocab'" in capsys.readouterr().err

    tree = ["tree", "--target", "llama-3.1-70b", "--drafter", "llama-3.2-1b"]
    assert main([*tree, "--intermediate", "llama-3.1-8b", "--chain", "6", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["chain_tokens"] >= 6 and doc["rounds"] >= 1
    assert doc["target_expected_tokens"] > doc["expected_tokens"]
    assert main([*tree, "--chain", "6"]) == 2
    assert "--chain needs --intermediate" in capsys.readouterr().err

    sim = ["simulate", *models, "--policy", "dynamic-topk:3,8,16,hier6", "--requests", "6",
           "--quiet", "--json"]  # fmt: skip
    assert main(sim) == 2
    assert "--intermediate MODEL" in capsys.readouterr().err
    assert main([*sim, "--intermediate", "llama-3.1-8b"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(out)["runs"][0]["mean_accepted"] > 3  # chains of >= 6 tokens


def test_simulator_loads_the_intermediate_stage_only_for_hierarchical_policies() -> None:
    import dataclasses

    import numpy as np

    from spectune.simulator.engine import intermediate_stage, resolve_capacity
    from spectune.simulator.requests import Requests
    from spectune.simulator.scoring import scenario_sim_config

    cfg = scenario_sim_config(HIER.resolve())
    flat = dataclasses.replace(cfg, policy=TreePolicy("dynamic-topk", 3, 8, 16))
    hier = dataclasses.replace(cfg, policy=TreePolicy("dynamic-topk", 3, 8, 16, chain=6))
    assert intermediate_stage(flat) == ()
    assert [m.name for m in intermediate_stage(hier)] == ["llama-3.1-8b", "llama-3.2-1b"]
    reqs = Requests(np.zeros(4), np.full(4, 30000), np.full(4, 500))
    kv_flat, mb_flat = resolve_capacity(flat, reqs)
    kv_hier, mb_hier = resolve_capacity(hier, reqs)
    assert kv_hier.blocks < kv_flat.blocks and mb_hier <= mb_flat


def test_plan_table_columns_stay_aligned_with_long_labels() -> None:
    """A prune + graft + hierarchical label (> 30 characters) widens the policy column: every
    row's tokens/s ends where the header's 'served tok/s' does."""
    import io

    from spectune.cli.plan import print_table
    from spectune.planner.search import BucketResult
    from spectune.specs.policy import policy_label

    refs = {"off": (100.0,), "sglang": (150.0,)}
    long = TreePolicy("dynamic-topk", 6, 10, 48, prune_threshold=0.0125, graft_budget=16, chain=12)
    short = TreePolicy("dynamic-topk", 3, 4, 12)
    assert len(policy_label(long)) > 30
    rows = [
        BucketResult(BucketSpec((1, 1), (1024, 1024)), long, 220.0, (220.0,), refs, 10, 0),
        BucketResult(BucketSpec((2, 8), (1024, 1024)), short, 200.0, (200.0,), refs, 10, 0),
    ]
    buf = io.StringIO()
    print_table(rows, out=buf)
    head, _, *body = buf.getvalue().splitlines()
    end = head.index("served tok/s") + len("served tok/s")
    for line, tps in zip(body[:2], ("220", "200"), strict=True):
        assert line[end - len(tps) : end] == tps, line
