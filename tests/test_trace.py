"""The spectune.trace/v1 format: round trip, exact replay, and errors that name line and field."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from spectune.specs import DraftTree, SpecError
from spectune.specs.trace import (
    TraceHeader,
    make_step,
    read_trace,
    replay_path,
    write_trace,
)

HEADER = TraceHeader("llama-3.1-8b", "eagle3", "mt-bench", max_depth=2, max_topk=2)
STEP = {
    "request": "q1",
    "step": 0,
    "context_len": 57,
    "parents": [-1, 0, 0, 1],
    "tokens": [11, 40, 41, 50],
    "logprobs": [0.0, -0.2, -1.9, -0.4],
    "source": ["root", "model", "model", "model"],
    "match_len": [0, 0, 0, 0],
    "target": [40, 50, 7, 9],
}


def _write(path: Path, lines: list[object]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_round_trip(tmp_path: Path, name: str) -> None:
    n = write_trace(tmp_path / name, HEADER, [STEP, {**STEP, "step": 1}])
    assert n == 2
    if name.endswith(".gz"):
        with gzip.open(tmp_path / name, "rt") as fh:
            assert json.loads(fh.readline())["schema"] == "spectune.trace/v1"
    header, steps = read_trace(tmp_path / name)
    assert header == HEADER
    assert [s.step for s in steps] == [0, 1]
    assert steps[0].to_dict() == STEP


def test_replay_is_the_documented_walk(tmp_path: Path) -> None:
    _, steps = read_trace(_write(tmp_path / "t.jsonl", [HEADER.to_dict(), STEP]))
    assert steps[0].accepted_path().tolist() == [0, 1, 3]
    # a sub-tree of the pool replays with the kept nodes' targets
    sub = steps[0].pool.subtree(np.array([True, True, True, False]))
    assert replay_path(sub, steps[0].target[[0, 1, 2]]).tolist() == [0, 1]


def test_make_step_checks_shapes() -> None:
    pool = DraftTree.chain(3)
    with pytest.raises(SpecError, match="shape"):
        make_step("r", 0, 0, pool, [1, 2])


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"parents": [-1, 0, 5, 1]}, "node 2 has parent 5"),
        ({"tokens": [1, 2, 3]}, "field 'tokens': expected 4 entries"),
        ({"logprobs": [0.0, 0.5, -1.0, -1.0]}, r"field 'logprobs'\[1\]"),
        ({"source": ["root", "model", "draft", "model"]}, r"field 'source'\[2\]"),
        ({"match_len": [0, 2, 0, 0]}, r"field 'match_len'\[1\] must be 0"),
        ({"target": [1, "x", 2, 3]}, r"field 'target'\[1\]: expected an integer"),
        ({"tokens": [11, 40, 40, 50]}, "same token"),
        ({"step": -1}, "must be >= 0"),
        ({"extra": 1}, "unknown field 'extra'"),
    ],
)
def test_bad_step_names_line_and_field(
    tmp_path: Path, patch: dict[str, object], match: str
) -> None:
    path = _write(tmp_path / "t.jsonl", [HEADER.to_dict(), STEP, {**STEP, **patch}])
    with pytest.raises(SpecError, match=match) as e:
        read_trace(path)
    assert "t.jsonl:3" in str(e.value)


def test_missing_field_and_bad_json(tmp_path: Path) -> None:
    step = dict(STEP)
    del step["target"]
    with pytest.raises(SpecError, match=r"t.jsonl:2: missing field 'target'"):
        read_trace(_write(tmp_path / "t.jsonl", [HEADER.to_dict(), step]))
    (tmp_path / "b.jsonl").write_text(json.dumps(HEADER.to_dict()) + "\n{oops\n")
    with pytest.raises(SpecError, match=r"b.jsonl:2: not valid JSON"):
        read_trace(tmp_path / "b.jsonl")


def test_bad_header(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match=r":1: field 'schema'"):
        read_trace(_write(tmp_path / "t.jsonl", [STEP]))
    bad = {**HEADER.to_dict(), "max_depth": "2"}
    with pytest.raises(SpecError, match="max_depth"):
        read_trace(_write(tmp_path / "h.jsonl", [bad]))
    with pytest.raises(SpecError, match="no such trace file"):
        read_trace(tmp_path / "missing.jsonl")


def test_writer_rejects_bad_step(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="step 0"):
        write_trace(tmp_path / "t.jsonl", HEADER, [{**STEP, "source": ["model"] * 4}])
