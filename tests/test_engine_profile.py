"""specs.engine.EngineProfile: presets, loading (user files override presets, errors name field
and file), and planner.space's restriction of the policy space to what an engine runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.planner.space import (
    PolicySpace,
    check_engine_drafter,
    check_engine_policy,
    check_engine_schedule,
    engine_policy,
    engine_space,
)
from spectune.specs.engine import ENGINE_PRESETS, NO_OVERHEADS, EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.model import MODEL_PRESETS
from spectune.specs.policy import TreePolicy

TREE = TreePolicy("dynamic-topk", 5, 4, 16)
CHAIN = TreePolicy("dynamic-topk", 3, 1, 4)


def test_presets_cover_the_engines_and_cite_their_numbers() -> None:
    assert {"sglang", "vllm", "vllm-0.11", "trtllm", "trtllm-1.4", "spectune"} <= set(
        ENGINE_PRESETS
    )
    for p in ENGINE_PRESETS.values():
        assert p.source and p.versions and p.read_at
        if p.engine == "spectune":
            assert p.overheads == NO_OVERHEADS
            continue
        assert "first estimate" in p.source or "fitted" in p.cite.get("overheads", "")
        for name in (
            "default_steps",
            "spec_max_running",
            "default_max_running",
            "cuda_graph_max_batch",
            "schedule",
        ):
            value = getattr(p, name)
            if value and value != "none":
                # a preset made from another inherits the base's cite table
                assert name in p.cite, (p.name, name)


def test_engine_facts_read_from_the_sources() -> None:
    sg = load_engine("sglang")
    assert sg.spec_max_running == 48 and sg.schedule_topk1_only
    assert (sg.default_steps, sg.default_topk, sg.default_draft_tokens) == (5, 4, 8)
    assert sg.cuda_graph_batch(9) == 10 and sg.cuda_graph_batch(1000) == 1000
    vl = load_engine("vllm")
    assert not vl.trees and vl.schedule == "ranges" and vl.schedule_min_steps == 0
    assert load_engine("vllm-0.11").static_tree_choices
    tr = load_engine("trtllm")
    assert tr.schedule == "upper-bound" and tr.schedule_beyond == "off"
    assert tr.static_tree_choices and not load_engine("trtllm-1.4").static_tree_choices
    assert load_engine("trtllm-stage1").schedule == "lower-bound"
    assert tr.max_draft_tokens(4, 3) == 12 and sg.max_draft_tokens(4, 3) == 30
    assert tr.max_draft_tokens(4, 1) == 4


def test_user_file_overrides_a_preset(tmp_path: Path) -> None:
    f = tmp_path / "mine.json"
    f.write_text(
        json.dumps({"base": "sglang", "name": "sglang-fit", "overheads": {"overlap": 0.9}})
    )
    p = load_engine(str(f))
    assert p.name == "sglang-fit" and p.overheads.overlap == 0.9
    assert p.overheads.iteration_s == load_engine("sglang").overheads.iteration_s
    assert p.spec_max_running == 48 and "overridden by" in p.source
    toml = tmp_path / "floor.toml"
    toml.write_text('base = "trtllm"\nname = "trtllm-floor"\nschedule_min_steps = 1\n')
    assert load_engine(str(toml)).schedule_min_steps == 1


@pytest.mark.parametrize(
    ("data", "match"),
    [
        ({"base": "sglang", "schedul": "none"}, "unknown field 'schedul'"),
        ({"base": "sglang", "schedule": "weekly"}, "'schedule' must be one of"),
        ({"base": "sglang", "drafters": ["medusa"]}, "unknown drafter"),
        ({"base": "sglang", "overheads": {"overlap": 2}}, "overlap"),
        ({"base": "nope"}, "unknown engine"),
        ({"base": "vllm", "max_topk": 4}, "chain-only"),
        ({"name": "x"}, "missing required field 'engine'"),
    ],
)
def test_bad_profiles_name_field_and_file(
    tmp_path: Path, data: dict[str, object], match: str
) -> None:
    f = tmp_path / "bad.json"
    f.write_text(json.dumps(data))
    with pytest.raises(SpecError, match=match) as e:
        load_engine(str(f))
    if "unknown engine" not in match:
        assert "bad.json" in str(e.value)


def test_unknown_preset_lists_the_closest() -> None:
    with pytest.raises(SpecError, match="sglang"):
        load_engine("sglng")


def test_presets_command_lists_engines(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["presets", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert "trtllm-1.4" in listing["engines"]


def test_model_presets_name_their_checkpoints() -> None:
    assert MODEL_PRESETS["eagle3-llama-3.1-8b"].hf_repo == "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    assert MODEL_PRESETS["llama-3.1-8b"].hf_repo == "meta-llama/Llama-3.1-8B-Instruct"
    assert all(m.hf_repo.count("/") == 1 for m in MODEL_PRESETS.values())


# ---- planner.space restricted to an engine ----------------------------------------------------


def test_engine_spaces() -> None:
    full = PolicySpace()
    assert engine_space(load_engine("spectune")) == full
    vl = engine_space(load_engine("vllm"))
    assert vl.topk == (1, 1) and not vl.allow_prune and vl.graft == (0, 0)
    assert not vl.allow_shared and vl.allow_off
    sg = engine_space(load_engine("sglang"))
    assert sg.builders == ("dynamic-topk",) and sg.topk == full.topk
    assert "static" in engine_space(load_engine("trtllm")).builders
    assert "static" not in engine_space(load_engine("trtllm-1.4")).builders


def test_engine_policy_and_checks() -> None:
    sg = load_engine("sglang")
    pruned = TreePolicy("dynamic-topk", 5, 4, 16, 0.01, 2, True)
    assert engine_policy(pruned, sg) == TREE  # pruning, grafting, shared budget dropped
    assert engine_policy(TreePolicy("dynamic-topk", 3, 1, 9), sg) == CHAIN
    assert engine_policy(TreePolicy("dynamic-topk", 2, 3, 200), load_engine("trtllm")).budget == 7
    assert engine_policy(pruned, load_engine("spectune")) == pruned
    with pytest.raises(SpecError, match="chains only"):
        check_engine_policy(TREE, load_engine("vllm"))
    check_engine_policy(CHAIN, load_engine("vllm"))
    with pytest.raises(SpecError, match="runs eagle3"):
        check_engine_drafter("medusa", load_engine("vllm-0.11"))
    # schedules
    check_engine_schedule([CHAIN, TreePolicy("dynamic-topk", 1, 1, 2), None], sg)
    with pytest.raises(SpecError, match="only with top-k 1"):
        check_engine_schedule([TREE, TreePolicy("dynamic-topk", 2, 4, 16), None], sg)
    check_engine_schedule([TREE, TREE], sg)  # one static tree everywhere
    with pytest.raises(SpecError, match="one top-k"):
        check_engine_schedule([TREE, CHAIN], load_engine("trtllm"))
    with pytest.raises(SpecError, match="no per-batch-size schedule"):
        check_engine_schedule([TREE, None], load_engine("vllm-0.11"))
    floor = EngineProfile(**{**_fields(load_engine("trtllm")), "schedule_min_steps": 1})
    with pytest.raises(SpecError, match="floor"):
        check_engine_schedule([CHAIN, None], floor)


def _fields(p: EngineProfile) -> dict[str, object]:
    from dataclasses import fields

    return {f.name: getattr(p, f.name) for f in fields(p)}
