"""Acceptance models: one contract suite, subclassed per model; presets and workload files."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectune.planner.acceptance import (
    AcceptanceModel,
    ConfidenceAcceptance,
    PositionalAcceptance,
    RetrievalAcceptance,
    RetrievalProfile,
    TraceReplay,
    acceptance_model,
)
from spectune.planner.trees import build_tree
from spectune.planner.workload_scale import policy_tokens, retrieval_chain_tokens
from spectune.specs import DraftTree, SpecError, TreePolicy
from spectune.specs.trace import TraceHeader, make_step
from spectune.specs.workload import WORKLOAD_PRESETS, _load_data_dir, load_workload
from spectune.traces.fit import LoadedTraces, fit_workload
from tests.strategies import draft_trees

POLICY = TreePolicy("dynamic-topk", depth=5, topk=4, budget=24)


def synthetic_trace(model: AcceptanceModel, steps: int, seed: int = 0) -> list:
    """Recorded steps whose target follows `model`: pools from the dynamic builder, target
    tokens drawn so that each child is the target's choice with its conditional probability."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(steps):
        pool = build_tree(TreePolicy("dynamic-topk", 4, 3, 40), model, rng)
        c = model.conditional(pool)
        target = np.full(pool.num_nodes, -7, dtype=np.int64)
        for node in range(pool.num_nodes):
            kids = np.flatnonzero(pool.parents == node)
            if kids.size:
                probs = np.r_[c[kids], max(0.0, 1 - c[kids].sum())]
                pick = rng.choice(probs.size, p=probs / probs.sum())
                if pick < kids.size:
                    target[node] = pool.tokens[kids[pick]]
        out.append(make_step(f"r{s // 4}", s % 4, 100 + s, pool, target))
    return out


class AcceptanceContract:
    """Every AcceptanceModel must pass these."""

    def make(self) -> AcceptanceModel:
        raise NotImplementedError

    def tree(self, model: AcceptanceModel, seed: int = 0) -> DraftTree:
        return build_tree(POLICY, model, np.random.default_rng(seed))

    def test_probabilities_are_a_path_measure(self) -> None:
        model = self.make()
        tree = self.tree(model)
        p = model.node_accept_prob(tree)
        c = model.conditional(tree)
        assert p[0] == 1.0
        assert ((p >= 0) & (p <= 1 + 1e-12)).all()
        assert (p[1:] <= p[tree.parents[1:]] + 1e-12).all()
        sums = np.bincount(tree.parents[1:], weights=c[1:], minlength=tree.num_nodes)
        assert (sums <= 1 + 1e-9).all()  # at most one child of a node is accepted
        assert model.expected_tokens(tree) == pytest.approx(p[1:].sum() + 1)

    def test_expected_tokens_match_monte_carlo(self) -> None:
        model = self.make()
        tree = self.tree(model, seed=3)
        exact = model.expected_tokens(tree)
        mc = model.sample_tokens(tree, np.random.default_rng(1), 100_000).mean()
        assert mc == pytest.approx(exact, rel=0.01)

    def test_sample_accepted_is_a_root_path(self) -> None:
        model = self.make()
        tree = self.tree(model, seed=5)
        rng = np.random.default_rng(0)
        for _ in range(50):
            path = model.sample_accepted(tree, rng)
            assert path[0] == 0
            assert (tree.parents[path[1:]] == path[:-1]).all()
            assert (model.node_accept_prob(tree)[path] > 0).all()

    # one subclass per model runs this; each is meant to run it (hence the health check)
    @settings(max_examples=25, suppress_health_check=[HealthCheck.differing_executors])
    @given(tree=draft_trees(max_nodes=40, max_depth=6))
    def test_expected_tokens_bounds(self, tree: DraftTree) -> None:
        e = self.make().expected_tokens(tree)
        assert 1.0 - 1e-12 <= e <= tree.max_depth + 1 + 1e-9

    def test_same_seed_same_tree(self) -> None:
        model = self.make()
        a, b = self.tree(model, seed=11), self.tree(model, seed=11)
        assert a.to_dict() == b.to_dict()


class TestPositional(AcceptanceContract):
    def make(self) -> AcceptanceModel:
        return acceptance_model("medusa-vicuna-7b")

    def test_table_lookup_and_decay(self) -> None:
        m = PositionalAcceptance([[0.5, 0.2]], depth_decay=0.5)
        chain = DraftTree.chain(3)
        assert m.node_accept_prob(chain).tolist() == pytest.approx([1, 0.5, 0.125, 0.015625])
        wide = DraftTree.from_parents([-1, 0, 0, 0])
        assert m.node_accept_prob(wide).tolist() == pytest.approx([1, 0.5, 0.2, 0.0])

    def test_rows_over_one_rejected(self) -> None:
        with pytest.raises(SpecError, match="sum to <= 1"):
            PositionalAcceptance([[0.8, 0.3]])


class TestConfidence(AcceptanceContract):
    def make(self) -> AcceptanceModel:
        return acceptance_model("mt-bench")

    def test_bank_rows_are_sorted_and_exclusive(self) -> None:
        bank = self.make().candidate_bank(3, 10)
        assert (np.diff(bank.conf, axis=1) <= 1e-12).all()
        assert (bank.accept.sum(axis=1) <= 1 + 1e-9).all()
        assert (bank.accept <= bank.conf + 1e-12).all()

    def test_bank_is_the_same_in_another_process(self) -> None:
        code = (
            "from spectune.planner.acceptance import acceptance_model;"
            "print(float(acceptance_model('mt-bench').candidate_bank(2, 4).conf.sum()))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        here = float(self.make().candidate_bank(2, 4).conf.sum())
        assert float(out.stdout) == here


class TestRetrieval(AcceptanceContract):
    def make(self) -> AcceptanceModel:
        return RetrievalAcceptance.from_workload(WORKLOAD_PRESETS["summarization"])

    def test_chain_matches_mixture(self) -> None:
        m = self.make()
        assert isinstance(m, RetrievalAcceptance)
        tree = DraftTree.chain(10)
        assert m.expected_tokens(tree) == pytest.approx(retrieval_chain_tokens(m.profile, 10))


class TestTraceReplay(AcceptanceContract):
    _model: AcceptanceModel | None = None

    def make(self) -> AcceptanceModel:
        if TestTraceReplay._model is None:
            TestTraceReplay._model = TraceReplay(
                synthetic_trace(acceptance_model("vllm-eagle3-minicpm3"), 30)
            )
        return TestTraceReplay._model

    def test_replay_step_is_exact(self) -> None:
        trace = self.make()
        assert isinstance(trace, TraceReplay)
        rng = np.random.default_rng(0)
        for _ in range(10):
            step = trace.draw_step(rng)
            tree = build_tree(TreePolicy("dynamic-topk", 4, 3, 12), step, rng)
            p = step.node_accept_prob(tree)
            assert set(np.unique(p)) <= {0.0, 1.0}
            path = step.sample_accepted(tree, rng)
            assert p[path].tolist() == [1.0] * path.size
            assert p.sum() == path.size  # exactly the replayed walk is accepted


def test_retrieval_nodes_take_the_residual_mass() -> None:
    profile = RetrievalProfile(np.array([[0.5, 0.5]]), np.array([1.0]))
    m = PositionalAcceptance([[0.6]], retrieval=profile)
    tree = DraftTree(
        np.array([-1, 0, 0, 2]),
        np.arange(4),
        np.log([1.0, 1.0, 0.5, 0.5]),
        np.array([0, 1, 2, 2], dtype=np.int8),
    )
    # model child 0.6; retrieval sibling gets 0.5 of the 0.4 left; its child 0.5 of all
    assert m.node_accept_prob(tree).tolist() == pytest.approx([1, 0.6, 0.2, 0.1])


# ---- presets and workload files -----------------------------------------------------------------
def test_every_preset_cites_its_source() -> None:
    for wl in WORKLOAD_PRESETS.values():
        assert wl.source and wl.fitted, wl.name
    temps = {wl.temperature for wl in WORKLOAD_PRESETS.values()}
    assert 0.0 in temps and 1.0 in temps  # greedy and sampling both represented


@pytest.mark.parametrize(
    ("name", "reach"),
    [
        ("vllm-eagle3-minicpm3", [0.58, 0.34, 0.22, 0.15, 0.11]),
        ("vllm-eagle3-gptoss-t1", [0.58, 0.31, 0.16, 0.08, 0.04, 0.02, 0.01]),
        ("ngram-code-edit", [0.81, 0.74, 0.70, 0.68, 0.66]),
    ],
)
def test_chain_presets_reproduce_published_reach(name: str, reach: list[float]) -> None:
    p = acceptance_model(name).node_accept_prob(DraftTree.chain(len(reach)))
    assert p[1:].tolist() == pytest.approx(reach, abs=1e-5)


def test_medusa_preset_reproduces_top1_and_top5() -> None:
    wl = WORKLOAD_PRESETS["medusa-vicuna-7b"]
    top1 = [row[0] for row in wl.accept_by_rank]
    top5 = [sum(row) for row in wl.accept_by_rank]
    assert top1 == pytest.approx([0.560, 0.316, 0.201, 0.147, 0.118])
    assert top5 == pytest.approx([0.780, 0.563, 0.417, 0.340, 0.300], abs=1e-5)


@pytest.mark.parametrize(
    ("name", "tau", "pld"),
    [  # EAGLE-3 paper Table 1, L31 8B EAGLE-3 (T=0) and V 13B PLD: MT-bench, CNN/DM
        ("mt-bench", 6.13, 1.63),
        ("summarization", 5.34, 2.50),
    ],
)
def test_presets_reproduce_sources(name: str, tau: float, pld: float) -> None:
    """Dataset presets carry the default pair's acceptance (EAGLE-3 head on Llama-3.1-8B) and
    the n-gram preset's retrieval profile; both reproduce the figures they were fitted to."""
    wl = WORKLOAD_PRESETS[name]
    eagle3_tree = TreePolicy("dynamic-topk", depth=8, topk=10, budget=60)
    assert policy_tokens(wl, eagle3_tree, samples=4000) == pytest.approx(tau, rel=0.02)
    prof = acceptance_model(wl).retrieval
    assert retrieval_chain_tokens(prof, 10) == pytest.approx(pld, rel=0.01)


def _wl_json(tmp: Path, **patch: object) -> Path:
    base = {"name": "mine", "acceptance": "positional", "accept_by_rank": [[0.6, 0.2]]}
    base.update(patch)
    path = tmp / "mine.json"
    path.write_text(json.dumps(base))
    return path


def test_workload_file_loads(tmp_path: Path) -> None:
    wl = load_workload(_wl_json(tmp_path))
    assert wl.accept_by_rank == ((0.6, 0.2),)
    toml = tmp_path / "w.toml"
    toml.write_text('name = "t"\nacceptance = "positional"\naccept_by_rank = [[0.5]]\n')
    assert load_workload(toml).name == "t"


@pytest.mark.parametrize(
    ("patch", "match"),
    [
        ({"acceptanse": "x"}, "unknown field 'acceptanse'"),
        ({"acceptance": "magic"}, "field 'acceptance' must be one of"),
        ({"accept_by_rank": [[0.8, 0.5]]}, r"accept_by_rank'\[0\] sums to 1.300"),
        ({"accept_by_rank": "high"}, "field 'accept_by_rank': expected a list"),
        ({"temperature": "hot"}, "field 'temperature': expected a number"),
        ({"calibration_y": [0.0, 1.0], "calibration_x": [0.0, 0.5]}, "calibration_x"),
        ({"accept_by_rank": []}, "needs field 'accept_by_rank'"),
    ],
)
def test_bad_workload_files_name_file_and_field(
    tmp_path: Path, patch: dict[str, object], match: str
) -> None:
    path = _wl_json(tmp_path, **patch)
    with pytest.raises(SpecError, match=match) as e:
        load_workload(path)
    assert "mine.json" in str(e.value)


def test_unknown_preset_lists_closest() -> None:
    with pytest.raises(SpecError, match=r"Did you mean .*'mt-bench'"):
        load_workload("mtbench")


def test_workload_data_folder(tmp_path: Path) -> None:
    _wl_json(tmp_path, name="Fitted-From-Trace")
    assert "fitted-from-trace" in _load_data_dir(tmp_path)
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(SpecError, match=r"bad\.json: not valid JSON"):
        _load_data_dir(tmp_path)


def test_fit_workload_recovers_the_profile() -> None:
    truth = PositionalAcceptance([[0.6, 0.2, 0.1]])
    steps = synthetic_trace(truth, 150, seed=2)
    header = TraceHeader("m", "d", "p", max_depth=4, max_topk=3)
    wl = fit_workload(
        LoadedTraces([header], steps),
        "fitted",
        acceptance="positional",
        width=3,
        calibrate_to_replay=False,
    )
    assert wl.accept_by_rank[0] == pytest.approx((0.6, 0.2, 0.1), abs=0.06)
    fitted = acceptance_model(wl)
    tree = build_tree(POLICY, truth, np.random.default_rng(0))
    assert fitted.expected_tokens(tree) == pytest.approx(truth.expected_tokens(tree), rel=0.06)


@settings(max_examples=20)
@given(m1=st.floats(0.3, 0.95))
def test_acceptance_grows_with_confidence(m1: float) -> None:
    base = WORKLOAD_PRESETS["mt-bench"]
    lo = ConfidenceAcceptance(dataclasses.replace(base, confidence_mean=(m1 * 0.8,)), bank_rows=512)
    hi = ConfidenceAcceptance(dataclasses.replace(base, confidence_mean=(m1,)), bank_rows=512)
    assert lo.positional_table(4, 1).prod() <= hi.positional_table(4, 1).prod() + 0.02
