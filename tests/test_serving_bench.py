"""validate.serving_bench: the request lengths of SGLang bench_serving's random data set and the
decode batch a mean-over-requests TPOT reflects. The lengths must reproduce the published totals
of the SGLang Cookbook runs exactly; the batch must equal a step-by-step replay worked by hand and
on random runs, and never leave [1, min(cap, requests)]."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spectune.specs import SpecError
from spectune.specs.engine import load_engine
from spectune.validate.engine_measure import load_engine_measurement
from spectune.validate.engine_points import points_from_document
from spectune.validate.serving_bench import (
    ServingBenchmark,
    mean_tpot_batch,
    random_lengths,
    serving_benchmark,
)

ENGINES = Path(__file__).parent.parent / "measurements" / "engines"
REPLAYED = sorted(
    p for p in ENGINES.glob("*.json") if "serving_benchmark" in json.loads(p.read_text())
)


def _stepwise(outputs: list[int], cap: int) -> float:
    """The same replay one decode step at a time (the definition, not the jump)."""
    live: dict[int, int] = {}
    seen: dict[int, list[int]] = {}
    nxt = 0
    while nxt < len(outputs) or live:
        while nxt < len(outputs) and len(live) < cap:
            if outputs[nxt] > 1:
                live[nxt] = outputs[nxt] - 1
                seen[nxt] = []
            nxt += 1
        n = len(live)
        for i in list(live):
            seen[i].append(n)
            live[i] -= 1
            if live[i] == 0:
                del live[i]
    return float(np.mean([np.mean(v) for v in seen.values()]))


def test_committed_runs_are_replayed() -> None:
    assert len(REPLAYED) >= 2


@pytest.mark.parametrize("path", REPLAYED, ids=lambda p: p.name)
def test_lengths_reproduce_the_published_totals(path: Path) -> None:
    """Every quoted 'Total input tokens' / 'Total generated tokens' is what the seeded draw gives
    for that block's --num-prompts: the run's own lengths, not a guess at their distribution."""
    doc = load_engine_measurement(path)
    bench = serving_benchmark(doc, path.name)
    assert bench is not None
    for p in doc["points"]:
        total_in = int(re.search(r"Total input tokens: (\d+)", p["quote"]).group(1))
        total_out = int(re.search(r"Total generated tokens: (\d+)", p["quote"]).group(1))
        inputs, outputs = random_lengths(bench, p["num_prompts"])
        assert (int(inputs.sum()), int(outputs.sum())) == (total_in, total_out)


def test_the_reasoning_run_decodes_at_62_not_at_its_concurrency_line() -> None:
    """Cap 64, 320 prompts of up to 8000 output tokens: the published Concurrency (time-averaged,
    with the drain) is 57.03, the batch the mean TPOT reflects 62; the points take the latter."""
    name = "sglang-deepseek-r1-0528-b200-tp8-nospec-1k8k.json"
    doc = load_engine_measurement(ENGINES / name)
    pts, skipped = points_from_document(doc, name, load_engine("sglang"))
    assert not skipped
    assert [p.batch for p in pts] == [1, 15, 62]
    assert [p.tokens_per_s for p in pts] == pytest.approx([108.58, 64.85 * 15, 38.55 * 62])
    # a stated batch wins; without the run, the cap is the batch
    stated = copy.deepcopy(doc)
    stated["points"][2]["batch"] = 57
    assert points_from_document(stated, name, load_engine("sglang"))[0][2].batch == 57
    del stated["serving_benchmark"]
    assert points_from_document(stated, name, load_engine("sglang"))[0][1].batch == 16


def test_hand_worked_replay() -> None:
    # outputs 3 and 2 under cap 2: step 1 decodes both (batch 2), step 2 only the first
    assert mean_tpot_batch(np.array([3, 2]), 2) == pytest.approx((1.5 + 2.0) / 2)
    assert mean_tpot_batch(np.array([3, 2]), 1) == 1.0
    # equal lengths, prompts a multiple of the cap: every step decodes a full cap
    assert mean_tpot_batch(np.full(12, 50), 4) == 4.0
    # one-token outputs decode no step: left out, and their slot frees at once
    assert mean_tpot_batch(np.array([1, 5, 0, 5]), 2) == 2.0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(0, 40), min_size=1, max_size=30).filter(lambda o: max(o) > 1),
    st.integers(1, 12),
)
def test_replay_matches_a_stepwise_replay(outputs: list[int], cap: int) -> None:
    b = mean_tpot_batch(np.array(outputs), cap)
    assert b == pytest.approx(_stepwise(outputs, cap))
    assert 1.0 <= b <= min(cap, sum(o > 1 for o in outputs)) + 1e-9


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("tool", "vllm bench serve", r"serving_benchmark\.tool"),
        ("random_input_len", 0, r"serving_benchmark\.random_input_len"),
        ("random_output_len", 1.5, r"serving_benchmark\.random_output_len"),
        ("random_range_ratio", 1.2, r"serving_benchmark\.random_range_ratio"),
        ("random_range_ratio", float("nan"), r"serving_benchmark\.random_range_ratio"),
        ("seed", -1, r"serving_benchmark\.seed"),
    ],
)
def test_bad_run_fields_are_named(field: str, value: object, match: str) -> None:
    good = {
        "tool": "sglang.bench_serving",
        "random_input_len": 1000,
        "random_output_len": 1000,
        "random_range_ratio": 0.0,
        "seed": 1,
    }
    assert serving_benchmark({"serving_benchmark": good}, "d.json") == ServingBenchmark(
        "sglang.bench_serving", 1000, 1000, 0.0, 1
    )
    with pytest.raises(SpecError, match=r"d\.json: field '" + match):
        serving_benchmark({"serving_benchmark": {**good, field: value}}, "d.json")


def test_bad_replay_inputs_raise() -> None:
    with pytest.raises(SpecError, match="cap"):
        mean_tpot_batch(np.array([3]), 0)
    with pytest.raises(SpecError, match="output_lens"):
        mean_tpot_batch(np.array([-1, 3]), 2)
    with pytest.raises(SpecError, match="num_prompts"):
        random_lengths(ServingBenchmark("sglang.bench_serving", 10, 10, 0.0, 1), 0)
