"""Tree builders: one contract suite per builder, Sequoia's DP against brute force, and the
properties of pruning, grafting, the batch super-tree and the vectorised batch sampler."""

from __future__ import annotations

import functools
import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spectune.cli import main
from spectune.planner.acceptance import AcceptanceModel, PositionalAcceptance, acceptance_model
from spectune.planner.trees import (
    build_batch_trees,
    build_tree,
    expected_tokens_for_policy,
    flat,
    graft_tree,
    outcome,
    prune_tree,
    sample_accepted_lengths,
    sample_step,
    sequoia_dp,
)
from spectune.specs import DraftTree, TreePolicy
from tests.strategies import draft_trees

SEQUOIA = PositionalAcceptance([[0.6, 0.2, 0.1], [0.5, 0.2, 0.1], [0.4, 0.2]])


class BuilderContract:
    """Every builder configuration must pass these."""

    policy: TreePolicy
    workload = "mt-bench"

    def model(self) -> AcceptanceModel:
        return acceptance_model(self.workload)

    def test_tree_respects_the_policy(self) -> None:
        m = self.model()
        rng = np.random.default_rng(0)
        for _ in range(20):
            tree = build_tree(self.policy, m, rng)
            assert tree.num_nodes <= self.policy.budget
            model_nodes = tree.source == 1
            assert (tree.depth[model_nodes] <= self.policy.depth).all()
            assert (tree.num_children[tree.source != 2] <= self.policy.topk).all() or (
                self.policy.graft_budget > 0
            )
            assert (tree.source == 2).sum() <= self.policy.graft_budget
            e = m.expected_tokens(tree)
            assert 1.0 <= e <= tree.max_depth + 1

    def test_same_seed_same_tree_in_another_process(self) -> None:
        here = build_tree(self.policy, self.model(), np.random.default_rng(7)).to_dict()
        there = _trees_in_another_process()[_config_key(self.policy, self.workload)]
        assert there == json.loads(json.dumps(here))

    def test_batched_sampler_matches_per_tree_path(self) -> None:
        """Same rules, two implementations: the distribution of tokens per step agrees."""
        m = self.model()
        rng = np.random.default_rng(1)
        n = 1000
        per_tree = np.array(
            [len(m.sample_accepted(build_tree(self.policy, m, rng), rng)) for _ in range(n)]
        )
        batched = np.concatenate(
            [sample_accepted_lengths(self.policy, m, rng, 64) for _ in range(4 * n // 64)]
        )
        top = int(max(per_tree.max(), batched.max())) + 1
        h1 = np.bincount(per_tree, minlength=top) / per_tree.size
        h2 = np.bincount(batched, minlength=top) / batched.size
        assert 0.5 * np.abs(h1 - h2).sum() < 0.08  # total variation distance
        assert batched.mean() == pytest.approx(per_tree.mean(), rel=0.04)

    def test_expected_tokens_for_policy_is_cached_and_exact(self) -> None:
        m = self.model()
        a = expected_tokens_for_policy(self.policy, m, samples=256, seed=3)
        assert expected_tokens_for_policy(self.policy, m, samples=256, seed=3) == a
        rng = np.random.default_rng(4)
        trees = np.mean([m.expected_tokens(build_tree(self.policy, m, rng)) for _ in range(400)])
        assert a == pytest.approx(trees, rel=0.03)

    def test_sample_step_reports_tree_sizes(self) -> None:
        tokens, nodes, expected = sample_step(
            self.policy, self.model(), np.random.default_rng(0), 16
        )
        assert tokens.shape == nodes.shape == expected.shape == (16,)
        assert (nodes <= self.policy.budget).all() and (tokens >= 1).all()
        assert (expected >= 1).all()


def _config_key(policy: TreePolicy, workload: str) -> str:
    return f"{workload}|{policy}"


@functools.cache
def _trees_in_another_process() -> dict[str, object]:
    """Every contract configuration built with seed 7 in one fresh interpreter."""
    configs = [(c.policy, c.workload) for c in BuilderContract.__subclasses__()]
    code = (
        "import json, sys, numpy as np\n"
        "from spectune.planner.acceptance import acceptance_model\n"
        "from spectune.planner.trees import build_tree\n"
        "from spectune.specs import TreePolicy\n"
        "out = {}\n"
        "for key, fields, wl in json.loads(sys.stdin.read()):\n"
        "    t = build_tree(TreePolicy(*fields), acceptance_model(wl), np.random.default_rng(7))\n"
        "    out[key] = t.to_dict()\n"
        "print(json.dumps(out))\n"
    )
    payload = json.dumps(
        [
            [
                _config_key(p, wl),
                [p.builder, p.depth, p.topk, p.budget, p.prune_threshold, p.graft_budget],
                wl,
            ]
            for p, wl in configs
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], input=payload, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, object] = json.loads(proc.stdout)
    return result


class TestDynamic(BuilderContract):
    policy = TreePolicy("dynamic-topk", depth=7, topk=10, budget=61)


class TestStatic(BuilderContract):
    policy = TreePolicy("static", depth=6, topk=4, budget=32)


class TestStaticPositional(BuilderContract):
    policy = TreePolicy("static", depth=5, topk=5, budget=24)
    workload = "medusa-vicuna-7b"


class TestPruneGraft(BuilderContract):
    policy = TreePolicy(
        "dynamic-topk", depth=6, topk=6, budget=40, prune_threshold=0.05, graft_budget=10
    )
    workload = "summarization"


class TestChainPreset(BuilderContract):
    policy = TreePolicy("dynamic-topk", depth=5, topk=3, budget=12)
    workload = "vllm-eagle3-minicpm3"


# ---- Sequoia's dynamic program ------------------------------------------------------------------
def _brute_force(model: AcceptanceModel, budget: int, depth: int, width: int) -> float:
    best = 1.0
    for n in range(2, budget + 1):
        for parents in itertools.product(*[range(i) for i in range(1, n)]):
            tree = DraftTree.from_parents([-1, *parents])
            if tree.max_depth > depth or tree.num_children.max() > width:
                continue
            best = max(best, model.expected_tokens(tree))
    return best


@pytest.mark.parametrize(("budget", "depth", "width"), [(5, 3, 3), (6, 2, 2), (7, 4, 3)])
def test_sequoia_dp_matches_brute_force(budget: int, depth: int, width: int) -> None:
    shape = sequoia_dp(SEQUOIA.positional_table(depth, width), budget, depth, width)
    tree = DraftTree.from_parents(shape.parents)
    assert SEQUOIA.expected_tokens(tree) == pytest.approx(shape.expected_tokens)
    assert shape.expected_tokens == pytest.approx(_brute_force(SEQUOIA, budget, depth, width))


@settings(max_examples=20)
@given(
    row=st.lists(st.floats(0.0, 0.5), min_size=1, max_size=4),
    depth=st.integers(1, 6),
    budget=st.integers(2, 40),
)
def test_static_optimum_non_decreasing_in_budget(row: list[float], depth: int, budget: int) -> None:
    total = sum(row)
    model = PositionalAcceptance([[v / max(total, 1.0) for v in row]])
    shape = sequoia_dp(model.positional_table(depth, len(row)), budget, depth, len(row))
    assert (np.diff(shape.best_by_budget[1:]) >= -1e-12).all()
    bigger = sequoia_dp(model.positional_table(depth, len(row)), budget + 3, depth, len(row))
    assert bigger.expected_tokens >= shape.expected_tokens - 1e-12
    assert 1.0 <= shape.expected_tokens <= depth + 1


# ---- pruning and grafting -----------------------------------------------------------------------
@settings(max_examples=40)
@given(tree=draft_trees(max_nodes=60), threshold=st.floats(0.0, 0.9))
def test_pruning_never_grows_a_tree(tree: DraftTree, threshold: float) -> None:
    pruned = prune_tree(tree, threshold)
    assert pruned.num_nodes <= tree.num_nodes
    assert (np.exp(pruned.path_logprob[1:]) >= threshold).all()


@settings(max_examples=40)
@given(
    tree=draft_trees(max_nodes=40, max_depth=8),
    extra=st.integers(0, 20),
    graft=st.integers(0, 12),
    seed=st.integers(0, 2**31),
)
def test_grafting_keeps_budget_and_never_lowers_tokens(
    tree: DraftTree, extra: int, graft: int, seed: int
) -> None:
    model = acceptance_model("summarization")
    budget = tree.num_nodes + extra
    grafted = graft_tree(tree, model, np.random.default_rng(seed), graft, budget)
    assert grafted.num_nodes <= max(budget, tree.num_nodes)
    assert grafted.num_nodes - tree.num_nodes <= graft
    assert model.expected_tokens(grafted) >= model.expected_tokens(tree) - 1e-12
    assert (grafted.parents[: tree.num_nodes] == tree.parents).all()


@settings(max_examples=15)
@given(prune=st.floats(0.0, 0.3), graft=st.integers(0, 12), seed=st.integers(0, 2**31))
def test_policy_level_prune_and_graft(prune: float, graft: int, seed: int) -> None:
    model = acceptance_model("summarization")
    dense = TreePolicy("dynamic-topk", 6, 6, 40)
    pruned = TreePolicy("dynamic-topk", 6, 6, 40, prune, 0)
    grafted = TreePolicy("dynamic-topk", 6, 6, 40, prune, graft)
    t_dense = build_tree(dense, model, np.random.default_rng(seed))
    t_pruned = build_tree(pruned, model, np.random.default_rng(seed))
    t_graft = build_tree(grafted, model, np.random.default_rng(seed))
    assert t_pruned.num_nodes <= t_dense.num_nodes
    assert t_graft.num_nodes <= 40
    assert t_graft.num_nodes - t_pruned.num_nodes <= graft
    assert model.expected_tokens(t_graft) >= model.expected_tokens(t_pruned) - 1e-12


# ---- batch super-tree ---------------------------------------------------------------------------
@settings(max_examples=25)
@given(
    batch=st.integers(2, 12),
    budget=st.integers(3, 40),
    seed=st.integers(0, 2**31),
    workload=st.sampled_from(["mt-bench", "medusa-vicuna-7b", "summarization"]),
)
def test_super_tree_at_least_equal_split(batch: int, budget: int, seed: int, workload: str) -> None:
    model = acceptance_model(workload)
    pool = flat.dynamic_pool(model, 5, 4, np.random.default_rng(seed), batch)
    p = pool.accept_prob()
    score = np.log(np.maximum(p, 1e-300))
    shared = outcome.keep_top(score, None, batch * (budget - 1))
    equal = outcome.keep_top(score, budget - 1, None)
    assert shared.sum() <= batch * budget and equal.sum() <= batch * budget
    e_shared = outcome.expected_tokens(shared, p, None).sum()
    e_equal = outcome.expected_tokens(equal, p, None).sum()
    assert e_shared >= e_equal - 1e-9
    for keep in (shared, equal):  # every kept node's parent is kept
        rows, cols = np.nonzero(keep[:, 1:])
        assert keep[rows, pool.parent[rows, cols + 1]].all()


def test_build_batch_trees_shares_one_budget() -> None:
    model = acceptance_model("mt-bench")
    policy = TreePolicy("dynamic-topk", 6, 6, 20)
    trees = build_batch_trees(policy, model, np.random.default_rng(0), 8)
    assert len(trees) == 8
    assert sum(t.num_nodes - 1 for t in trees) <= 8 * 19
    equal = build_batch_trees(policy, model, np.random.default_rng(0), 8, shared_budget=False)
    assert all(t.num_nodes <= 20 for t in equal)
    e_shared = sum(model.expected_tokens(t) for t in trees)
    assert e_shared >= 0.97 * sum(model.expected_tokens(t) for t in equal)


# ---- CLI ----------------------------------------------------------------------------------------
def test_cli_tree_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(
        [
            "tree",
            "--builder",
            "sequoia",
            "--accept",
            "0.6,0.2,0.1",
            "--budget",
            "8",
            "--depth",
            "4",
            "--json",
        ]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"expected_tokens", "parents", "depth", "source"}
    assert out["expected_tokens"] == pytest.approx(2.7456)
    assert len(out["parents"]) == 8


def test_cli_tree_defaults_and_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["tree"]) == 0
    assert "expected tokens per step" in capsys.readouterr().out
    assert main(["tree", "--workload", "nope"]) == 2
    assert "unknown workload" in capsys.readouterr().err
    assert main(["tree", "--accept", "0.9,0.5"]) == 2


def test_health_check_import() -> None:
    assert HealthCheck.differing_executors  # contract classes share @given tests


# ---- trees from a recorded pool -----------------------------------------------------------------
def test_replay_pool_graft_dedups_and_keeps_budget() -> None:
    from spectune.planner.acceptance import TraceReplay
    from spectune.specs.trace import make_step

    # root -> model children 10 (p .7), 11 (p .2); retrieval children 10 (dup) and 12, 12 -> 13
    pool = DraftTree(
        np.array([-1, 0, 0, 0, 0, 4]),
        np.array([5, 10, 11, 10, 12, 13]),
        np.log([1.0, 0.7, 0.2, 1.0, 1.0, 1.0]),
        np.array([0, 1, 1, 2, 2, 2], dtype=np.int8),
    )
    step = make_step("r", 0, 9, pool, target=[12, 0, 0, 0, 13, 1], match_len=[0, 0, 0, 2, 2, 2])
    trace = TraceReplay([step])
    replay = trace.draw_step(np.random.default_rng(0))
    policy = TreePolicy("dynamic-topk", 3, 2, 5, prune_threshold=0.5, graft_budget=3)
    tree = build_tree(policy, replay, np.random.default_rng(0))
    assert tree.num_nodes <= 5
    kids = tree.tokens[tree.parents == 0].tolist()
    assert sorted(kids) == sorted(set(kids))  # the duplicate retrieval 10 was not grafted
    assert 12 in kids and 13 in tree.tokens.tolist()
    # exact replay: the target takes 12 then 13 (both grafted), then stops
    assert replay.expected_tokens(tree) == 3.0


def test_depth_one_and_topk_one() -> None:
    m = acceptance_model("mt-bench")
    for policy in (TreePolicy("dynamic-topk", 1, 4, 8), TreePolicy("dynamic-topk", 5, 1, 8)):
        tree = build_tree(policy, m, np.random.default_rng(0))
        assert tree.max_depth <= policy.depth and tree.num_nodes <= policy.budget
        lengths = sample_accepted_lengths(policy, m, np.random.default_rng(0), 32)
        assert (lengths >= 1).all() and (lengths <= policy.depth + 1).all()


def test_huge_pools_are_drawn_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    from spectune.planner.trees import build

    m = acceptance_model("mt-bench")
    policy = TreePolicy("dynamic-topk", 5, 6, 30)
    whole = expected_tokens_for_policy(policy, m, samples=600, seed=5)
    monkeypatch.setattr(build, "MAX_POOL_CELLS", 2000)  # ~13 requests per draw
    monkeypatch.setattr(build, "_EXPECTED", build.OrderedDict())
    chunked = expected_tokens_for_policy(policy, m, samples=600, seed=5)
    assert chunked == pytest.approx(whole, rel=0.03)
    tokens, nodes, expected = sample_step(policy, m, np.random.default_rng(0), 40)
    assert tokens.shape == nodes.shape == expected.shape == (40,)
    assert sample_accepted_lengths(policy, m, np.random.default_rng(0), 40).shape == (40,)
