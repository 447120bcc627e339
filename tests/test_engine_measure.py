"""Engine measurement documents: built from parsed engine output, validated field by field, and
the committed published figures under measurements/engines/."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from spectune.specs import SpecError
from spectune.specs.scenario import Scenario
from spectune.validate.check import check_folder
from spectune.validate.engine_logs import read_observations
from spectune.validate.engine_measure import (
    SCHEMA,
    EngineRun,
    engine_measurement_docs,
    load_engine_measurement,
    validate_engine_measurement,
    write_engine_measurement,
)

DATA = Path(__file__).parent / "data" / "engines"
ROOT = Path(__file__).parent.parent
PUBLISHED = ROOT / "measurements" / "engines"


def test_docs_from_sglang_log(tmp_path: Path) -> None:
    obs = read_observations([DATA / "sglang-0.5.10.log"])
    run = EngineRun(engine="sglang", gpu="h100-sxm", engine_version="0.5.10", workload="mt-bench")
    (doc,) = engine_measurement_docs(obs, run)
    assert doc["schema"] == SCHEMA
    assert (doc["target"], doc["drafter"], doc["tp"]) == (
        "meta-llama/Llama-3.1-8B-Instruct",
        "jamesliu1/sglang-EAGLE3-Llama-3.1-Instruct-8B",
        1,
    )
    assert doc["spec"] == {"method": "EAGLE3", "num_steps": 5, "topk": 8, "num_draft_tokens": 32}
    assert [p["batch"] for p in doc["points"]] == [1, 8, 32]
    assert [p["tokens_per_s"] for p in doc["points"]] == [256.0, 960.0, 1440.0]
    assert [p["accept_length"] for p in doc["points"]] == [3.2, 3.0, 2.25]
    assert doc["points"][0]["where"].endswith("sglang-0.5.10.log:2")
    assert doc["source"]["kind"] == "log"
    out = tmp_path / "m.json"
    write_engine_measurement(doc, out)
    assert load_engine_measurement(out) == json.loads(out.read_text())


def test_run_contradicting_the_file() -> None:
    obs = read_observations([DATA / "vllm-0.11.0.log"])
    with pytest.raises(SpecError, match=r"vllm-0\.11\.0\.log:3: the file states num_steps = 3"):
        engine_measurement_docs(obs, EngineRun(engine="vllm", gpu="h100-sxm", num_steps=5))
    with pytest.raises(SpecError, match="a vllm file for a sglang run"):
        engine_measurement_docs(obs, EngineRun(engine="sglang", gpu="h100-sxm"))


def test_run_fills_what_the_file_does_not_say() -> None:
    obs = read_observations([DATA / "vllm-bench-latency.json"], require_speculative=False)
    with pytest.raises(SpecError, match="does not name the target"):
        engine_measurement_docs(obs, EngineRun(engine="vllm", gpu="h200"))
    scenario = Scenario(target="llama-3.1-8b", gpu="h200", engine="vllm")
    run = EngineRun.from_scenario(scenario, batch=8, output_len=128, input_len=512)
    (doc,) = engine_measurement_docs(obs, run)
    (p,) = doc["points"]
    assert p["tokens_per_s"] == pytest.approx(8 * 128 / ((0.8312 + 0.8298 + 0.8405) / 3))
    assert (p["batch"], p["input_len"], doc["spec"], doc["drafter"]) == (8, 512, None, None)


def test_baseline_and_spec_points_split() -> None:
    obs = read_observations([DATA / "sglang-bench-one-batch-server.jsonl"])
    docs = engine_measurement_docs(
        obs, EngineRun(engine="sglang", gpu="h100-sxm", target="llama-3.1-8b", method="EAGLE3")
    )
    assert [(d["spec"] is None, len(d["points"])) for d in docs] == [(False, 1), (True, 1)]


def _valid() -> dict:
    return {
        "schema": SCHEMA,
        "engine": "sglang",
        "engine_version": None,
        "target": "meta-llama/Llama-3.1-8B-Instruct",
        "drafter": "x",
        "gpu": "h100-sxm",
        "tp": 1,
        "spec": {"method": "EAGLE3", "num_steps": 5, "topk": 8, "num_draft_tokens": 64},
        "workload": "mt-bench",
        "source": {"kind": "published", "url": "https://example.org/a", "title": "t"},
        "points": [{"batch": 1, "tokens_per_s": 373.25, "quote": "373.25 tokens/s"}],
        "notes": "",
    }


@pytest.mark.parametrize(
    ("path", "value", "match"),
    [
        (("engine",), "tgi", "field 'engine' must be one of"),
        (("tp",), 0, "field 'tp' must be an integer"),
        (("target",), "", "field 'target' must be a non-empty string"),
        (("spec", "topk"), 0, r"field 'spec\.topk' must be a positive integer"),
        (("source", "url"), "http://x", "must be an https URL"),
        (("source", "kind"), "rumour", "field 'source.kind'"),
        (("points",), [], "field 'points' must be a non-empty list"),
        (("points", 0, "tokens_per_s"), float("nan"), "must be a finite number"),
        (("points", 0, "tokens_per_s"), -1.0, "must be positive"),
        (("points", 0, "accept_length"), 0.9, "counts the bonus token"),
        (("points", 0, "accept_rate"), 1.5, r"'accept_rate' must be in \[0, 1\]"),
        (("points", 0, "batch"), 1.5, "field 'batch' must be a positive integer"),
        (("points", 0, "quote"), "", "field 'quote' must be a non-empty string"),
        (("points", 0, "per_position_accept"), [0.5, 2.0], "per_position_accept"),
        (("points", 0, "num_prompts"), 0, "field 'num_prompts' must be a positive integer"),
        (("points", 0, "num_prompts"), 10**7, "field 'num_prompts' must be at most"),
        (("points", 0, "miss_cause"), "", "field 'miss_cause' must be a non-empty string"),
        (("points", 0, "baseline_miss_cause"), "x", "'baseline_miss_cause' without a 'baseline"),
        (("serving_benchmark",), [], "field 'serving_benchmark' must be an object"),
        (("serving_benchmark",), {"tool": "vllm bench serve"}, r"'serving_benchmark\.tool'"),
    ],
)
def test_validation_names_the_field(path: tuple, value: object, match: str) -> None:
    doc = _valid()
    validate_engine_measurement(doc, "doc.json")
    bad = copy.deepcopy(doc)
    node = bad
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    with pytest.raises(SpecError, match=r"doc\.json: .*" + match):
        validate_engine_measurement(bad, "doc.json")


def test_point_needs_a_figure() -> None:
    doc = _valid()
    doc["points"] = [{"batch": 1, "quote": "q"}]
    with pytest.raises(SpecError, match="a point needs one of"):
        validate_engine_measurement(doc, "doc.json")


PUBLISHED_FILES = sorted(PUBLISHED.glob("*.json"))


def test_published_figures_are_committed() -> None:
    assert len(PUBLISHED_FILES) >= 5
    points = sum(len(load_engine_measurement(p)["points"]) for p in PUBLISHED_FILES)
    assert points >= 10
    engines = {load_engine_measurement(p)["engine"] for p in PUBLISHED_FILES}
    assert engines == {"sglang", "vllm", "trtllm"}


@pytest.mark.parametrize("path", PUBLISHED_FILES, ids=lambda p: p.name)
def test_published_document(path: Path) -> None:
    doc = load_engine_measurement(path)
    assert doc["source"]["kind"] == "published"
    readme = (PUBLISHED / "README.md").read_text()
    assert path.name in readme  # every document is in the README table
    for p in doc["points"]:
        if p.get("speedup") and p.get("tokens_per_s") and p.get("baseline_tokens_per_s"):
            assert p["speedup"] == pytest.approx(
                p["tokens_per_s"] / p["baseline_tokens_per_s"], rel=0.02
            )


def test_check_predicts_the_committed_engine_measurements() -> None:
    """`spectune check measurements/` predicts measurements/engines/ and passes its gate."""
    res = check_folder(ROOT / "measurements")
    assert res.files > 0
    assert {r.engine for r in res.engine} >= {"sglang", "vllm"}
    assert res.passed(0.1, 0.1)
