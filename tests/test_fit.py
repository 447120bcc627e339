"""planner.fit on hand-made traces (exact counts) and a slice of the committed real traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from spectune.cli import main as cli_main
from spectune.specs.io import from_mapping
from spectune.specs.trace import TraceHeader, TraceStep, iter_trace, make_step, write_trace
from spectune.specs.tree import DraftTree
from spectune.specs.workload import Workload, load_workload
from spectune.traces.fit import (
    LoadedTraces,
    calibration_curve,
    cross_validate,
    fit_confidence,
    fit_positional,
    fit_retrieval,
    fit_workload,
    load_traces,
    predicted_tokens,
    reference_policy,
    replayed_tokens,
    split_requests,
    workload_to_dict,
)

ROOT = Path(__file__).resolve().parents[1]
HEADER = TraceHeader("toy", "toy-drafter", "toy-set", max_depth=2, max_topk=2)


def _steps() -> list[TraceStep]:
    # step A: root -> 10 (rank 0, hit) -> 21 (rank 1, hit); a retrieval child 30 (match 2) misses
    a = DraftTree.from_parents(
        [-1, 0, 0, 1, 1, 0],
        tokens=[5, 10, 11, 20, 21, 30],
        logprobs=[0.0, -0.1, -2.5, -0.2, -1.8, 0.0],
        source=[0, 1, 1, 1, 1, 2],
    )
    # step B: a chain root -> 10 (hit) -> 20 (miss)
    b = DraftTree.from_parents([-1, 0, 1], tokens=[5, 10, 20], logprobs=[0.0, -0.3, -0.4])
    return [
        make_step("r1", 0, 7, a, [10, 21, 0, 0, 99, 0], [0, 0, 0, 0, 0, 2]),
        make_step("r2", 0, 9, b, [10, 7, 8]),
    ]


def test_positional_counts_accepted_path_parents_only() -> None:
    table = fit_positional(_steps(), depth=2, width=2)
    np.testing.assert_allclose(table, [[1.0, 0.0], [0.0, 0.5]])


def test_retrieval_profile_counts() -> None:
    rows, probs = fit_retrieval(_steps(), max_match=2, chain_len=2)
    assert rows[1][0] == 0.0  # one trial (match 2, position 1), a miss
    np.testing.assert_allclose(probs, [0.0, 0.5])  # step A's root had a match of length 2


def test_confidence_and_calibration_shape() -> None:
    fit = fit_confidence(_steps(), depth=2, width=2)
    assert len(fit.mean_top1) == 2 and 0 < fit.mean_top1[0] < 1
    xs, ys = fit.calibration_x, fit.calibration_y
    assert xs[0] == 0.0 and xs[-1] == 1.0
    assert all(b > a for a, b in itertools.pairwise(xs))
    assert all(0 <= y <= x + 1e-12 for x, y in zip(xs, ys, strict=True))
    rng = np.random.default_rng(0)
    conf = rng.uniform(size=5000)
    hit = (rng.uniform(size=5000) < 0.5 * conf).astype(float)
    xs, ys = calibration_curve(conf, hit, 10)
    np.testing.assert_allclose(np.interp(0.5, xs, ys), 0.25, atol=0.05)


def test_replay_of_whole_pool_and_split() -> None:
    steps = _steps()
    assert (
        replayed_tokens(
            reference_policy(2, 2, 8), steps, build=lambda p, s: np.ones(s.pool.num_nodes, bool)
        )
        == 2.5
    )
    train, held = split_requests(steps, 2)
    assert [s.request for s in train] == ["r1"] and [s.request for s in held] == ["r2"]


def test_fit_workload_round_trips_through_json() -> None:
    wl = fit_workload(LoadedTraces([HEADER], _steps()), "toy-fit")
    again = from_mapping(Workload, workload_to_dict(wl), "test")
    assert again == wl
    assert "toy-drafter" in wl.source and wl.fitted.startswith("spectune.traces.fit")


def test_fit_workload_cli(tmp_path: Path) -> None:
    trace = tmp_path / "toy.jsonl.gz"
    write_trace(trace, HEADER, _steps())
    out = tmp_path / "wl.json"
    assert cli_main(["fit-workload", str(trace), "--out", str(out), "--name", "toy"]) == 0
    assert load_workload(str(out)).name == "toy"
    assert cli_main(["fit-workload", str(tmp_path / "missing.jsonl"), "--out", str(out)]) == 2


@pytest.fixture(scope="module")
def real_slice() -> LoadedTraces:
    path = ROOT / "data" / "traces" / "smollm2-mtbench.jsonl.gz"
    header, it = iter_trace(path)
    steps = [s for s in itertools.islice(it, 400) if s.request in {"mt-bench/81", "mt-bench/83"}]
    return LoadedTraces([header], steps, (str(path),))


def test_fit_on_real_slice_predicts_its_replay(real_slice: LoadedTraces) -> None:
    wl = fit_workload(real_slice, "slice")
    for b in (8, 32):
        pol = reference_policy(real_slice.max_depth, real_slice.max_topk, b)
        rep = replayed_tokens(pol, real_slice.steps)
        assert abs(predicted_tokens(pol, wl) / rep - 1) < 0.1


def test_cross_validation_holds_every_request_out_once(real_slice: LoadedTraces) -> None:
    (check,) = cross_validate(real_slice, folds=2, budgets=(16,), acceptance="positional")
    pol = reference_policy(real_slice.max_depth, real_slice.max_topk, 16)
    assert check.replayed == pytest.approx(replayed_tokens(pol, real_slice.steps))
    assert abs(check.error) < 0.25


def test_fitted_presets_load() -> None:
    for name in ("smollm2-mtbench-early-exit", "smollm2-humaneval-early-exit"):
        wl = load_workload(name)
        assert wl.acceptance == "confidence" and "smollm2" in wl.source
        assert load_traces is not None
