"""planner.export: each engine's configuration from a policy table, checked against that
engine's rules, with every approximation said on the terminal and inside the exported files."""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.planner.export import (
    check_choices,
    check_sglang,
    check_trtllm,
    check_vllm,
    export_policy,
    export_sglang,
    export_trtllm,
    export_vllm,
    schedule_for,
    to_yaml,
    tree_choices,
)
from spectune.specs.engine import load_engine
from spectune.specs.errors import SpecError
from spectune.specs.policy import Bucket, ChainChoice, PolicyTable, Prediction, TreePolicy
from spectune.specs.tree import DraftTree

yaml = pytest.importorskip("yaml")  # tests only: the exporter writes YAML by hand


def _bucket(
    lo: int, hi: int, policy: TreePolicy | None, chain: int, ctx: tuple[int, int] = (0, 4095)
) -> Bucket:
    tps = 1000.0 * hi
    return Bucket(
        (lo, hi),
        ctx,
        policy,
        Prediction(tps, 2.0 if policy else 1.0, 3.0 if policy else 1.0),
        ChainChoice(chain, tps * 0.8 if chain else tps, 1.6 if chain else 1.0),
    )


def table(*buckets: Bucket) -> PolicyTable:
    return PolicyTable(
        "llama-3.1-8b", "eagle3-llama-3.1-8b", "h100-sxm", buckets, workload="mt-bench"
    )


MIXED = table(
    _bucket(1, 1, TreePolicy("dynamic-topk", 7, 8, 48), 5),
    _bucket(2, 8, TreePolicy("dynamic-topk", 5, 4, 16, 0.01, 2), 4),
    _bucket(9, 64, TreePolicy("dynamic-topk", 3, 1, 4), 3),
    _bucket(65, 256, None, 0),
)


def fake_shaper(policy: TreePolicy) -> DraftTree:
    """A small static tree: two children of the root, one grandchild under each."""
    return DraftTree.from_parents([-1, 0, 0, 1, 2][: max(2, min(policy.budget, 5))])


# ---- SGLang -------------------------------------------------------------------------------


def test_sglang_adaptive_config_follows_the_table() -> None:
    """SGLang runs its adaptive schedule only with top-k 1: the trees of MIXED's small batches
    become their recorded best chains, so the draft length can follow the batch size."""
    ex = export_sglang(MIXED)
    adaptive = json.loads(ex.files["sglang_adaptive.json"])
    assert "strategy" not in adaptive  # SGLang skips keys that are not batch sizes
    assert adaptive["1"] == {"candidate_steps": [5]}
    assert adaptive["2"] == {"candidate_steps": [4]}
    assert adaptive["9"] == {"candidate_steps": [3]}
    assert adaptive["65"] == {"candidate_steps": [0]}  # off
    args = ex.config["server_args"]
    assert args["speculative_num_steps"] == 5
    assert args["speculative_eagle_topk"] == 1 and args["speculative_num_draft_tokens"] == 6
    assert args["speculative_draft_model_path"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert ex.config["max_running_requests"] == 256 and ex.config["tp_size"] == 1
    text = ex.files["launch_sglang.sh"]
    assert '--speculative-adaptive-config "$HERE/sglang_adaptive.json"' in text
    assert "--max-running-requests 256" in text and "--tp-size 1" in text
    assert "exec python -m sglang.launch_server" in text
    assert "--model-path meta-llama/Llama-3.1-8B-Instruct" in text
    notes = " ".join(ex.approximations)
    assert "pruning" in notes and "graft" in notes and "top-k 1" in notes
    assert all(f"#   - {n}" in text for n in ex.approximations)  # metadata inside the file
    side = json.loads(ex.files["sglang.spectune.json"])
    assert side["approximations"] == list(ex.approximations)


def test_sglang_topk1_forces_steps_plus_one() -> None:
    ex = export_sglang(table(_bucket(1, 256, TreePolicy("static", 4, 1, 5), 4)))
    args = ex.config["server_args"]
    assert args["speculative_eagle_topk"] == 1
    assert args["speculative_num_draft_tokens"] == args["speculative_num_steps"] + 1
    assert "sglang_adaptive.json" not in ex.files  # one setting everywhere: no adaptive mode
    with pytest.raises(SpecError, match="steps \\+ 1"):
        check_sglang({**args, "speculative_num_draft_tokens": 8}, None)


def test_sglang_adaptive_routing_follows_cuda_graph_padding() -> None:
    """SGLang pads a batch to its CUDA-graph size before picking the adaptive slot; the export
    says which batches move to the next range."""
    t = table(
        _bucket(1, 9, TreePolicy("dynamic-topk", 4, 1, 5), 4),
        _bucket(10, 256, TreePolicy("dynamic-topk", 2, 1, 3), 2),
    )
    notes = " ".join(export_sglang(t).approximations)
    assert "batches 9-9 run range 10-256's draft length" in notes


def test_sglang_rules() -> None:
    ok = {
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 2,
        "speculative_num_draft_tokens": 6,
    }
    check_sglang(ok, None)
    chain = {**ok, "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 4}
    check_sglang(chain, {"1": {"candidate_steps": [3]}, "64": {"candidate_steps": [0]}})
    with pytest.raises(SpecError, match="only with --speculative-eagle-topk 1"):
        check_sglang(ok, {"1": {"candidate_steps": [3]}})
    with pytest.raises(SpecError, match="skips it"):
        check_sglang(chain, {"strategy": "ema", "1": {"candidate_steps": [3]}})
    with pytest.raises(SpecError, match="exceed"):
        check_sglang({**ok, "speculative_num_draft_tokens": 20}, None)
    with pytest.raises(SpecError, match="'1'"):
        check_sglang(chain, {"8": {"candidate_steps": [3]}})
    with pytest.raises(SpecError, match=r"0\.\.3"):
        check_sglang(chain, {"1": {"candidate_steps": [5]}})
    with pytest.raises(SpecError, match="one of the adaptive candidate"):
        check_sglang(chain, {"1": {"candidate_steps": [2]}})


def test_sglang_all_off() -> None:
    ex = export_sglang(table(_bucket(1, 256, None, 0)))
    assert "without --speculative-algorithm" in " ".join(ex.approximations)
    assert "--speculative" not in ex.files["launch_sglang.sh"].replace(
        "without --speculative-algorithm", ""
    )


# ---- vLLM ---------------------------------------------------------------------------------


def test_vllm_exports_best_chains_per_batch_range() -> None:
    ex = export_vllm(MIXED)
    cfg = json.loads(ex.files["vllm_speculative_config.json"])
    assert cfg["method"] == "eagle3" and cfg["num_speculative_tokens"] == 5
    ranges = cfg["num_speculative_tokens_per_batch_size"]
    assert ranges[0][0] == 1
    assert ranges == [[1, 1, 5], [2, 8, 4], [9, 64, 3], [65, 256, 0]]  # K = 0: off
    assert cfg["model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert ex.config["max_num_seqs"] == 256  # where vLLM's schedule lookup ends
    notes = " ".join(ex.approximations)
    assert "chains only" in notes and "-20.0%" in notes  # what the tree policy loses
    check_vllm(cfg)
    side = json.loads(ex.files["vllm.spectune.json"])
    assert side["approximations"] == list(ex.approximations)
    assert "approximations" not in cfg  # vLLM rejects unknown keys


def _with_drafter(t: PolicyTable, drafter: str) -> PolicyTable:
    """The table with another drafter name (its scenario names the same one)."""
    return replace(t, drafter=drafter, scenario=t.scenario.replace(drafter=drafter))


def test_vllm_refuses_trees_without_chains() -> None:
    t = table(Bucket((1, 8), (0, 4095), TreePolicy("dynamic-topk", 4, 4, 12)))
    with pytest.raises(SpecError, match="chains only"):
        export_vllm(t)
    with pytest.raises(SpecError, match="pass --draft-model-path"):
        export_vllm(_with_drafter(MIXED, "no-such-drafter"))
    ex = export_vllm(_with_drafter(MIXED, "x"), draft_model_path="/ckpt/eagle")
    assert ex.config["speculative_config"]["model"] == "/ckpt/eagle"


def test_vllm_rules() -> None:
    good = {
        "num_speculative_tokens": 4,
        "num_speculative_tokens_per_batch_size": [[1, 16, 4], [17, 64, 2], [65, 4096, 0]],
    }
    check_vllm(good)
    with pytest.raises(SpecError, match="start at batch 1"):
        check_vllm({**good, "num_speculative_tokens_per_batch_size": [[2, 16, 4]]})
    with pytest.raises(SpecError, match="contiguous"):
        check_vllm({**good, "num_speculative_tokens_per_batch_size": [[1, 16, 4], [18, 64, 2]]})
    with pytest.raises(SpecError, match="num_speculative_tokens"):
        check_vllm({**good, "num_speculative_tokens_per_batch_size": [[1, 16, 5]]})


def test_vllm_tree_for_older_releases() -> None:
    ex = export_vllm(MIXED, tree=True, shaper=fake_shaper)
    cfg = ex.config["speculative_config"]
    assert cfg["speculative_token_tree"] == "[(0,),(1,),(0,0),(1,0)]"
    assert cfg["num_speculative_tokens"] == 2
    assert "num_speculative_tokens_per_batch_size" not in cfg
    assert any("one static tree" in n for n in ex.approximations)
    with pytest.raises(SpecError, match="shaper"):
        export_vllm(MIXED, tree=True)


# ---- TensorRT-LLM -------------------------------------------------------------------------


def test_trtllm_dynamic_tree_and_schedule() -> None:
    ex = export_trtllm(MIXED)
    text = ex.files["trtllm_extra_llm_api_options.yaml"]
    full = yaml.safe_load(text)
    assert full == ex.config  # the YAML says what the config says
    assert full["max_batch_size"] == 256 and full["tensor_parallel_size"] == 1
    doc = full["speculative_config"]
    assert doc["decoding_type"] == "Eagle3"
    assert doc["speculative_model"] == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert doc["use_dynamic_tree"] is True and doc["dynamic_tree_max_topK"] == 8
    assert doc["max_draft_len"] == 7
    assert doc["max_draft_len"] <= doc["max_total_draft_tokens"] <= 8 * 7
    # keys are upper bounds; batches above the largest key (65-256, off) get 0
    assert doc["draft_len_schedule"] == {1: 7, 8: 5, 64: 3}
    assert "engine: trtllm" in text
    check_trtllm(doc)
    for n in ex.approximations:
        assert n in text  # metadata inside the file, as comments


def test_trtllm_rules() -> None:
    base = {
        "max_draft_len": 4,
        "use_dynamic_tree": True,
        "dynamic_tree_max_topK": 2,
        "max_total_draft_tokens": 6,
        "draft_len_schedule": {1: 4, 8: 2},
    }
    check_trtllm(base)
    with pytest.raises(SpecError, match="must equal max_draft_len"):
        check_trtllm({**base, "draft_len_schedule": {1: 3, 8: 2}})
    with pytest.raises(SpecError, match="<= max_draft_len"):
        check_trtllm({**base, "draft_len_schedule": {1: 4, 8: 6}})
    with pytest.raises(SpecError, match="max_total_draft_tokens"):
        check_trtllm({**base, "max_total_draft_tokens": 9})
    with pytest.raises(SpecError, match="mutually exclusive"):
        check_trtllm({**base, "eagle_choices": [[0]]})
    check_trtllm({**base, "draft_len_schedule": {4: 4}})  # upper bounds: 1-4 -> 4
    with pytest.raises(SpecError, match="batch size 1"):
        check_trtllm({**base, "draft_len_schedule": {4: 4}}, "trtllm-stage1")
    with pytest.raises(SpecError, match="no eagle_choices"):
        check_trtllm({"max_draft_len": 2, "eagle_choices": [[0], [0, 0]]}, "trtllm-1.4")


def test_trtllm_schedule_keys_follow_the_version() -> None:
    rows = list(MIXED.buckets)
    assert schedule_for(rows, [5, 4, 3, 0], load_engine("trtllm"), 256) == {1: 5, 8: 4, 64: 3}
    assert schedule_for(rows, [5, 4, 3, 3], load_engine("trtllm"), 256) == {1: 5, 8: 4, 256: 3}
    stage1 = load_engine("trtllm-stage1")
    assert schedule_for(rows, [5, 4, 3, 0], stage1, 256) == {1: 5, 2: 4, 9: 3, 65: 0}


def test_trtllm_deeper_later_buckets_are_cut_and_said() -> None:
    t = table(
        _bucket(1, 1, TreePolicy("dynamic-topk", 3, 2, 6), 3),
        _bucket(2, 256, TreePolicy("dynamic-topk", 6, 2, 10), 5),
    )
    ex = export_trtllm(t)
    spec = ex.config["speculative_config"]
    assert spec["max_draft_len"] == 3 and "draft_len_schedule" not in spec  # 3 everywhere
    assert any("cut" in n for n in ex.approximations)


def test_trtllm_static_tree_uses_eagle_choices() -> None:
    ex = export_trtllm(MIXED, static_tree=True, shaper=fake_shaper)
    doc = yaml.safe_load(ex.files["trtllm_extra_llm_api_options.yaml"])["speculative_config"]
    assert doc["eagle_choices"] == [[0], [1], [0, 0], [1, 0]]
    assert "use_dynamic_tree" not in doc
    assert doc["max_draft_len"] == 2 and doc["draft_len_schedule"] == {64: 2}
    check_trtllm(doc)
    ex14 = export_trtllm(MIXED, static_tree=True, shaper=fake_shaper, profile="trtllm-1.4")
    assert "eagle_choices" not in ex14.config["speculative_config"]  # gone in 1.4
    assert any("no eagle_choices" in n for n in ex14.approximations)


def test_yaml_writer_quotes_strings() -> None:
    doc = yaml.safe_load(to_yaml({"a": {"b": "x: y", "c": [1, 2], "d": True, "e": None}}))
    assert doc == {"a": {"b": "x: y", "c": [1, 2], "d": True, "e": None}}


# ---- shared -------------------------------------------------------------------------------


def test_tree_choices_and_their_rules() -> None:
    tree = DraftTree.from_parents([-1, 0, 0, 1, 1, 3])
    assert tree_choices(tree) == [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    check_choices(tree_choices(tree))
    with pytest.raises(SpecError, match="parent path"):
        check_choices([[0], [1, 0]])
    with pytest.raises(SpecError, match="skips sibling"):
        check_choices([[0], [2]])


def test_other_contexts_are_said() -> None:
    t = table(
        _bucket(1, 256, TreePolicy("dynamic-topk", 5, 4, 8), 4),
        _bucket(1, 256, TreePolicy("dynamic-topk", 7, 4, 16), 5, ctx=(4096, 32768)),
    )
    for engine in ("sglang", "vllm", "trtllm"):
        ex = export_policy(t, engine)
        assert any("batch size only" in n for n in ex.approximations), engine
    assert (
        export_policy(t, "sglang", context=8000).config["server_args"]["speculative_num_steps"] == 7
    )
    with pytest.raises(SpecError, match="engine"):
        export_policy(t, "tgi")


def test_export_command_writes_files_and_says_approximations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.json"
    MIXED.save(policy)
    for engine, name in (
        ("sglang", "sglang.spectune.json"),
        ("vllm", "vllm_speculative_config.json"),
        ("trtllm", "trtllm_extra_llm_api_options.yaml"),
    ):
        out = tmp_path / engine
        assert main(["export", "--engine", engine, str(policy), "--out", str(out)]) == 0
        assert (out / name).is_file()
        launch = out / f"launch_{engine}.sh"
        assert launch.is_file() and os.access(launch, os.X_OK)
        err = capsys.readouterr().err
        assert "approximated" in err
    out = tmp_path / "paths"
    argv = ["export", "--engine", "vllm", str(policy), "--out", str(out)]
    assert main([*argv, "--model-path", "/m", "--draft-model-path", "/d"]) == 0
    text = (out / "launch_vllm.sh").read_text()
    assert "vllm serve /m" in text and '"model":"/d"' in text
    assert main(["export", "--engine", "tgi", str(policy)]) == 2
    assert not list(tmp_path.rglob("*.tmp"))
    assert main(["export", "--engine", "vllm", str(tmp_path / "missing.json")]) == 2


def test_export_fits_a_table_not_planned_for_the_engine() -> None:
    """With an objective, a table the engine cannot run as written is fitted by the planner
    (planner.engine_plan.fit_table) before export, and the note says what that costs; the
    export of the fitted table then holds exactly what was chosen."""
    from test_search import fake_objective

    from spectune.planner.engine_plan import fit_table, runnable_reason

    obj = fake_objective()
    for engine in ("sglang", "vllm", "trtllm"):
        prof = load_engine(engine)
        assert runnable_reason(MIXED, prof)
        fitted, config, loss = fit_table(MIXED, prof, obj)
        assert runnable_reason(fitted, prof) == "", (engine, config.label)
        assert math.isfinite(loss)
        ex = export_policy(MIXED, engine, evaluate=obj, shaper=fake_shaper)
        assert ex.approximations[0].startswith(f"{engine} cannot run the table as written")
        assert config.label in ex.approximations[0]
        again = export_policy(fitted, engine, evaluate=obj, shaper=fake_shaper)
        assert again.approximations == ()  # the fitted table runs as written
    ex = export_trtllm(fit_table(MIXED, load_engine("trtllm"), obj)[0])
    check_trtllm(ex.config["speculative_config"])


# ---- another pair than the plan's ---------------------------------------------------------------


def test_export_for_another_pair_takes_that_pairs_acceptance_and_models() -> None:
    """for_pair re-targets a table: the engine loads the new drafter, and the static shapes
    come from the new pair's acceptance preset (Scenario.resolve_pair), not the workload's
    default pair's."""
    import numpy as np

    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.export import for_pair, model_paths, table_shaper
    from spectune.planner.trees import build_tree
    from spectune.specs.scenario import Scenario

    assert for_pair(MIXED, MIXED.scenario) is MIXED
    small = for_pair(MIXED, MIXED.scenario.replace(drafter="llama-3.2-1b"))
    assert (small.drafter, small.scenario.drafter) == ("llama-3.2-1b", "llama-3.2-1b")
    assert small.buckets == MIXED.buckets
    paths = model_paths(small)
    assert (paths.drafter, paths.drafter_kind) == (
        "meta-llama/Llama-3.2-1B-Instruct",
        "draft-model",
    )
    policy = TreePolicy("static", 5, 4, 24)
    wl = Scenario(drafter="llama-3.2-1b").resolve_pair()[2]
    assert "draft-model/llama-3/mt-bench" in wl.source
    want = build_tree(policy, acceptance_model(wl), np.random.default_rng(0))
    got, planned = table_shaper(small)(policy), table_shaper(MIXED)(policy)
    assert np.array_equal(got.parents, want.parents)
    assert not np.array_equal(got.parents, planned.parents)  # EAGLE-3's acceptance differs
    with pytest.raises(SpecError, match="field 'vocab'"):
        for_pair(MIXED, MIXED.scenario.replace(drafter="eagle3-qwen3-8b"))


def test_export_command_takes_target_and_drafter(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = tmp_path / "policy.json"
    MIXED.save(policy)
    out = tmp_path / "small"
    argv = ["export", "--engine", "sglang", str(policy), "--out", str(out)]
    assert main([*argv, "--drafter", "llama-3.2-1b"]) == 0
    err = capsys.readouterr().err
    assert "--drafter overrides" in err and "eagle3-llama-3.1-8b -> llama-3.2-1b" in err
    assert "llama-3.1-8b + llama-3.2-1b on h100-sxm" in (out / "launch_sglang.sh").read_text()
    assert main([*argv, "--drafter", "eagle3-qwen3-8b"]) == 2
    assert "field 'vocab'" in capsys.readouterr().err
    # a pair without a preset of its own: the nearest, with a warning; --strict refuses it
    nearest = ["--target", "smollm2-135m", "--drafter", "none"]
    assert main([*argv, *nearest, "--draft-model-path", "/d"]) in (0, 2)
    assert "using the nearest, ngram/llama-3/mt-bench/T=0" in capsys.readouterr().err
    assert main([*argv, *nearest, "--strict"]) == 2
    assert "error: workload 'mt-bench' for smollm2-135m" in capsys.readouterr().err
