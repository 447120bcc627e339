"""Drafter/target compatibility: one check (specs.compat.check_pair) with errors naming the
fields, called wherever a target meets a drafter."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from spectune.cli import main
from spectune.planner.objective import closed_form_objective
from spectune.specs import MODEL_PRESETS, SpecError, load_model
from spectune.specs.compat import PairWarning, check_pair, compatible, pair_problems
from spectune.specs.scenario import Scenario

QWEN25_32B = Path(__file__).resolve().parent / "data" / "hf_configs" / "qwen2.5-32b-instruct"
M = MODEL_PRESETS


def test_the_issue_pair_is_refused_naming_hidden_vocab_and_family() -> None:
    with pytest.raises(SpecError) as e:
        check_pair(load_model(QWEN25_32B), M["eagle3-llama-3.1-8b"])
    msg = str(e.value)
    assert "field 'hidden'" in msg and "4096" in msg and "5120" in msg
    assert "field 'vocab'" in msg and "128256" in msg and "152064" in msg
    assert "draft_vocab 32000" in msg and "field 'family'" in msg


@pytest.mark.parametrize(
    ("target", "drafter"),
    [
        ("llama-3.1-8b", "eagle3-llama-3.1-8b"),  # reduced draft vocab 32000 of 128256: fine
        ("llama-3.1-8b", "eagle-llama-3.1-8b"),
        ("llama-3.1-8b", "llama-3.2-1b"),
        ("llama-3.1-70b", "llama-3.1-8b"),
        ("qwen3-8b", "qwen3-0.6b"),
        ("qwen3-8b", "eagle3-qwen3-8b"),
        ("deepseek-v3", "deepseek-v3-mtp"),
        ("deepseek-v3", None),  # n-gram / prompt lookup needs no model
    ],
)
def test_compatible_pairs(target: str, drafter: str | None) -> None:
    check_pair(M[target], M[drafter] if drafter else None)


@pytest.mark.parametrize(
    ("target", "drafter", "fields"),
    [
        ("qwen3-8b", "llama-3.2-1b", ["'vocab'", "'family'"]),  # draft model: other tokenizer
        ("llama-3.1-70b", "eagle3-llama-3.1-8b", ["'hidden'"]),  # head of the wrong width
        ("qwen3-8b", "eagle3-llama-3.1-8b", ["'vocab'", "'family'"]),
        ("llama-3.1-8b", "deepseek-v3-mtp", ["'hidden'", "'base_model'"]),
        ("eagle3-llama-3.1-8b", "llama-3.2-1b", ["the target must be a full model"]),
    ],
)
def test_incompatible_pairs_name_the_fields(target: str, drafter: str, fields: list[str]) -> None:
    problems = " ".join(pair_problems(M[target], M[drafter]))
    for f in fields:
        assert f in problems
    assert not compatible(M[target], M[drafter])


def test_draft_model_needs_the_same_vocabulary_even_without_a_family() -> None:
    anon = dataclasses.replace(M["llama-3.2-1b"], family="", vocab=32000)
    assert "a draft model must share the target's tokenizer" in " ".join(
        pair_problems(M["llama-3.1-8b"], anon)
    )


def test_mtp_runs_only_with_its_own_target() -> None:
    twin = dataclasses.replace(M["deepseek-v3"], name="deepseek-v3-finetune")
    with pytest.raises(SpecError, match="runs only with its own target"):
        check_pair(twin, M["deepseek-v3-mtp"])
    unnamed = dataclasses.replace(M["deepseek-v3-mtp"], base_model="")
    with pytest.raises(SpecError, match="must name the target it was trained with"):
        check_pair(M["deepseek-v3"], unnamed)


def test_head_trained_for_another_target_of_the_same_shape_warns() -> None:
    with pytest.warns(PairWarning, match="trained for 'qwen3-8b'"):
        check_pair(M["qwen3-235b-a22b"], M["eagle3-qwen3-8b"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PairWarning)
        check_pair(M["qwen3-8b"], M["eagle3-qwen3-8b"])


def test_every_path_that_pairs_models_checks_them(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scenario = Scenario(target=str(QWEN25_32B), drafter="eagle3-llama-3.1-8b")
    with pytest.raises(SpecError, match="field 'hidden'"):
        scenario.resolve()
    with pytest.raises(SpecError, match="field 'hidden'"):
        closed_form_objective(str(QWEN25_32B), "eagle3-llama-3.1-8b", "h100-sxm", "mt-bench")
    for cmd in (
        ["plan", "--trials", "1", "--quiet", "--out", str(tmp_path / "policy.json")],
        ["cost"],
        ["tree"],
        ["simulate", "--requests", "1", "--quiet"],
    ):
        assert main([*cmd, "--target", str(QWEN25_32B), "--drafter", "eagle3-llama-3.1-8b"]) == 2
        err = capsys.readouterr().err
        assert "cannot run with target 'qwen2.5-32b-instruct'" in err and "field 'hidden'" in err


def test_dashboard_offers_only_compatible_drafters() -> None:
    """The dashboard's drafter picker (dashboards.ui.scenario_sidebar) filters by `compatible`:
    for Qwen2.5-32B no preset model qualifies (the issue: it offered llama-3.1-8b)."""
    qwen = load_model(QWEN25_32B)
    assert not [n for n, m in M.items() if compatible(qwen, m)]
    t = M["llama-3.1-8b"]
    offered = {
        n
        for n, m in M.items()
        if compatible(t, m) and (m.is_head or m.total_params() < t.total_params())
    }
    assert offered == {"eagle3-llama-3.1-8b", "eagle-llama-3.1-8b", "llama-3.2-1b"}
    source = (Path(__file__).resolve().parent.parent / "spectune/dashboards/ui.py").read_text()
    assert "compatible(tm, m)" in source
