"""Verification rules (specs.tree.VERIFY_RULES) and the delayed builder.

Losslessness is checked by frequency: on a small tree over a vocabulary of 3 with target and
draft distributions that depend on the whole prefix, the first L = 3 output tokens (the emitted
tokens, completed by sampling the true target where a step emitted fewer) must follow the
target's joint distribution: a chi-square test over the 27 cells with 1e5 draws per rule, both
for the planner's numpy simulation (planner.acceptance.rules) and for the Triton kernels
(kernels.verify.verify_rule, under the interpreter on CPU, every draw in one launch). The greedy
walk at temperature 1 must fail the same test.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats
from strategies import parents_arrays

from spectune.kernels.verify import verify_rule
from spectune.planner.acceptance import acceptance_model
from spectune.planner.acceptance.rules import (
    NodeDistributions,
    depth_first_events,
    expected_tokens_by_rule,
    simulate_rule,
)
from spectune.planner.space import PolicySpace, canonical_policy
from spectune.planner.trees.build import expected_tokens_for_policy, sample_step
from spectune.planner.trees.delayed import delayed_parents
from spectune.specs.errors import SpecError
from spectune.specs.policy import TreePolicy
from spectune.specs.tree import DraftTree

V, L = 3, 3
DRAWS = 100_000
ALPHA = 1e-3
TREES = {
    "bushy": [-1, 0, 0, 1, 1, 2, 3],
    "delayed": [int(x) for x in delayed_parents(3, 3, 1, 16)],
}


def random_tree(seed: int, nodes: int = 8, max_depth: int = 3) -> DraftTree:
    """A seeded random tree shape (each node's parent uniform among earlier shallow nodes)."""
    rng = np.random.default_rng(seed)
    parents, depth = [-1], [0]
    for i in range(1, nodes):
        choices = [j for j in range(i) if depth[j] < max_depth]
        parents.append(int(rng.choice(choices)))
        depth.append(depth[parents[-1]] + 1)
    return DraftTree.from_parents(parents)


CASES = [
    ("token", True),
    ("token", False),
    ("traversal", True),
    ("traversal", False),
    ("spectr", True),
]


def _tables(seed: int, levels: int = L + 2) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Target and draft rows per prefix: P[d][id] for a prefix of length d (id in base V)."""
    rng = np.random.default_rng(seed)
    return (
        [rng.dirichlet(np.full(V, 0.7), size=V**d) for d in range(levels)],
        [rng.dirichlet(np.full(V, 0.7), size=V**d) for d in range(levels)],
    )


def world(
    tree: DraftTree, s: int, rng: np.random.Generator, iid: bool, seed: int = 7
) -> NodeDistributions:
    """S draws of the tree's tokens (i.i.d. from the draft after the parent's prefix, or its
    top-k in rank order; past V children the ranks repeat) with the target and draft rows of
    every node's prefix."""
    p_tab, q_tab = _tables(seed, max(L + 2, tree.max_depth + 1))
    n = tree.num_nodes
    pid = np.zeros((s, n), dtype=np.int64)
    tok = np.zeros((s, n), dtype=np.int64)
    q = np.zeros((s, n, V))
    p = np.zeros((s, n, V))
    for i in range(n):
        d = int(tree.depth[i])
        if i:
            b = int(tree.parents[i])
            qrow = q_tab[int(tree.depth[b])][pid[:, b]]
            if iid:
                u = rng.random((s, 1))
                tok[:, i] = np.minimum((u > qrow.cumsum(axis=1)).sum(axis=1), V - 1)
                q[:, i] = qrow
            else:
                tok[:, i] = np.argsort(-qrow, axis=1, kind="stable")[:, tree.sibling_rank[i] % V]
                q[np.arange(s), i, tok[:, i]] = 1.0
            pid[:, i] = pid[:, b] * V + tok[:, i]
        p[:, i] = p_tab[d][pid[:, i]]
    return NodeDistributions(tok, p, q)


def chi_square_p(
    tree: DraftTree, d: NodeDistributions, acc: np.ndarray, bonus: np.ndarray, seed: int = 7
) -> float:
    """p-value of the first L output tokens against the target's joint distribution."""
    p_tab, _ = _tables(seed)
    s = acc.size
    rng = np.random.default_rng(11)
    seq = np.zeros((s, L), dtype=np.int64)
    ln = np.zeros(s, dtype=np.int64)
    for a in range(tree.num_nodes):
        m = acc == a
        path = tree.path_to(a)[1:]
        toks = d.tokens[m][:, path][:, :L]
        seq[m, : toks.shape[1]] = toks
        if path.size < L:
            seq[m, path.size] = bonus[m]
        ln[m] = min(path.size + 1, L)
    for j in range(L):
        need = ln <= j
        if need.any():
            ids = np.zeros(int(need.sum()), dtype=np.int64)
            for jj in range(j):
                ids = ids * V + seq[need, jj]
            rows = p_tab[j][ids]
            u = rng.random((ids.size, 1))
            seq[need, j] = np.minimum((u > rows.cumsum(axis=1)).sum(axis=1), V - 1)
            ln[need] = j + 1
    cell = (seq[:, 0] * V + seq[:, 1]) * V + seq[:, 2]
    obs = np.bincount(cell, minlength=V**L)
    want = np.array(
        [
            p_tab[0][0][a] * p_tab[1][a][b] * p_tab[2][a * V + b][c]
            for a in range(V)
            for b in range(V)
            for c in range(V)
        ]
    )
    return float(stats.chisquare(obs, want * s).pvalue)


def _kernel(rule: str, tree: DraftTree, d: NodeDistributions, seed: int) -> tuple[np.ndarray, ...]:
    s, n = d.tokens.shape
    tokens = torch.from_numpy(d.tokens.reshape(-1).copy())
    parents = torch.from_numpy(np.tile(tree.parents, s).astype(np.int32))
    qo = torch.arange(s + 1, dtype=torch.int32) * n
    p = torch.from_numpy(d.p.reshape(s * n, V).astype(np.float32))
    q = torch.from_numpy(d.q.reshape(s * n, V).astype(np.float32))
    acc, bonus = verify_rule(rule, tokens, parents, qo, p, q, seed, block_b=DRAWS)
    return acc.numpy().astype(np.int64), bonus.numpy()


@pytest.mark.parametrize(("rule", "iid"), CASES)
@pytest.mark.parametrize("shape", sorted(TREES))
def test_simulated_rules_keep_the_target_distribution(rule: str, iid: bool, shape: str) -> None:
    tree = DraftTree.from_parents(TREES[shape])
    rng = np.random.default_rng(3)
    d = world(tree, DRAWS, rng, iid)
    acc, bonus = simulate_rule(rule, tree, d, rng)
    assert chi_square_p(tree, d, acc, bonus) > ALPHA


@pytest.mark.parametrize(("case", "rule", "iid"), [(i, *c) for i, c in enumerate(CASES)])
def test_rule_kernels_keep_the_target_distribution(case: int, rule: str, iid: bool) -> None:
    """1e5 draws in one launch on a random tree per case (~5-15 s each on one CPU core)."""
    tree = random_tree(100 + case)
    d = world(tree, DRAWS, np.random.default_rng(5), iid)
    acc, bonus = _kernel(rule, tree, d, seed=17)
    assert chi_square_p(tree, d, acc, bonus) > ALPHA
    # the kernel and the simulation agree on the mean accepted length (same law)
    sim, _ = simulate_rule(rule, tree, d, np.random.default_rng(9))
    assert abs(tree.depth[acc].mean() - tree.depth[sim].mean()) < 0.02


def test_greedy_at_temperature_one_fails_the_same_test() -> None:
    tree = DraftTree.from_parents(TREES["bushy"])
    rng = np.random.default_rng(3)
    d = world(tree, DRAWS, rng, iid=False)
    acc, bonus = simulate_rule("greedy", tree, d, rng)
    assert chi_square_p(tree, d, acc, bonus) < ALPHA
    kacc, kbonus = _kernel("greedy", tree, d, seed=1)
    assert chi_square_p(tree, d, kacc, kbonus) < ALPHA


def test_traversal_with_top_k_drafts_accepts_as_the_walk() -> None:
    """With one-hot draft rows the two rules accept with the same law (the planner's closed
    form serves both): mean accepted length within 3 standard errors on 1e5 draws."""
    tree = random_tree(7, nodes=10)
    rng = np.random.default_rng(8)
    d = world(tree, DRAWS, rng, iid=False)
    tok = tree.depth[simulate_rule("token", tree, d, rng)[0]]
    trav = tree.depth[simulate_rule("traversal", tree, d, rng)[0]]
    se = np.sqrt((tok.var() + trav.var()) / DRAWS)
    assert abs(tok.mean() - trav.mean()) < 3 * se


def test_traversal_accepts_more_than_token_on_iid_trees() -> None:
    tree = DraftTree.from_parents(TREES["delayed"])
    rng = np.random.default_rng(4)
    d = world(tree, DRAWS, rng, iid=True)
    tok, _ = simulate_rule("token", tree, d, rng)
    trav, _ = simulate_rule("traversal", tree, d, rng)
    assert tree.depth[trav].mean() > tree.depth[tok].mean() + 0.01


def test_token_rule_simulation_matches_the_closed_form() -> None:
    model = acceptance_model("mt-bench-t1")
    pol = TreePolicy("dynamic-topk", 5, 4, 16)
    from spectune.planner.trees.build import build_tree

    tree = build_tree(pol, model, np.random.default_rng(0))
    exact = model.expected_tokens(tree)
    sim = expected_tokens_by_rule("token", tree, model, np.random.default_rng(1), 40_000, False)
    assert sim == pytest.approx(exact, rel=0.02)


@given(parents_arrays(min_nodes=1, max_nodes=24, max_depth=6), st.booleans(), st.integers(0, 99))
@settings(max_examples=40, deadline=None)
def test_rules_accept_a_root_path(parents: np.ndarray, iid: bool, seed: int) -> None:
    tree = DraftTree.from_parents(parents)
    rng = np.random.default_rng(seed)
    d = world(tree, 64, rng, iid)
    events = depth_first_events(tree)
    assert len(events) == 2 * tree.num_nodes - 1  # every node entered once and left once
    for rule in ("token", "traversal", "greedy") + (("spectr",) if iid else ()):
        acc, bonus = simulate_rule(rule, tree, d, rng)
        assert ((acc >= 0) & (acc < tree.num_nodes)).all()
        assert ((bonus >= 0) & (bonus < V)).all()
        if rule == "greedy" or not iid:
            continue
        # an accepted draft token was drawn: positive draft probability along the path
        for a in np.unique(acc):
            path = tree.path_to(int(a))[1:]
            rows = np.flatnonzero(acc == a)
            qx = d.q[rows[:, None], path[None, :], d.tokens[rows][:, path]]
            assert (qx > 0).all()


@given(parents_arrays(min_nodes=1, max_nodes=20, max_depth=5), st.integers(0, 99))
@settings(max_examples=6, deadline=None)
def test_rule_kernels_return_nodes_of_the_tree(parents: np.ndarray, seed: int) -> None:
    tree = DraftTree.from_parents(parents)
    d = world(tree, 32, np.random.default_rng(seed), iid=True)
    for rule in ("token", "traversal", "spectr"):
        acc, bonus = _kernel(rule, tree, d, seed)
        assert ((acc >= 0) & (acc < tree.num_nodes)).all()
        assert ((bonus >= 0) & (bonus < V)).all()


# ---- the delayed builder and the policy dimension ------------------------------------------------
@given(st.integers(1, 12), st.integers(1, 8), st.integers(0, 11), st.integers(2, 128))
def test_delayed_shape(depth: int, topk: int, delay: int, budget: int) -> None:
    delay = min(delay, depth - 1)
    tree = DraftTree.from_parents(delayed_parents(depth, topk, delay, budget))
    assert tree.num_nodes <= budget
    assert tree.max_depth <= depth
    chain = min(delay, budget - 1)
    assert (tree.num_children[:chain] == 1).all()  # one path first
    assert tree.num_children[chain] <= topk  # then at most topk branches
    assert (tree.num_children[chain + 1 :] <= 1).all()  # each branch a chain
    if budget >= 1 + delay + topk * (depth - delay):
        assert tree.num_nodes == 1 + delay + topk * (depth - delay)


def test_policy_label_carries_rule_and_delay() -> None:
    p = TreePolicy("delayed", 8, 4, 24, verify="traversal", delay=3)
    assert p.label == "delayed:8,4,24,delay=3,verify=traversal"
    assert TreePolicy.parse(p.label) == p
    assert TreePolicy.parse("dynamic-topk:6,8,32").verify == "token"
    with pytest.raises(SpecError, match="spectr"):
        TreePolicy("dynamic-topk", 6, 8, 32, verify="spectr")
    with pytest.raises(SpecError, match="delay"):
        TreePolicy("dynamic-topk", 6, 8, 32, delay=2)
    with pytest.raises(SpecError, match="verify"):
        TreePolicy.parse("delayed:8,4,24,verify=nope")
    assert canonical_policy("dynamic-topk", 6, 8, 32, verify="spectr").verify == "token"
    assert canonical_policy("static", 6, 8, 32, verify="traversal").verify == "token"
    assert canonical_policy("delayed", 4, 2, 64, delay=9).delay == 3


def test_space_adds_rules_and_delayed_above_temperature_zero() -> None:
    assert PolicySpace().at_temperature(0.0) == PolicySpace()
    hot = PolicySpace().at_temperature(1.0)
    assert "delayed" in hot.builders and "traversal" in hot.verify_rules
    assert "greedy" not in hot.verify_rules


def test_planner_scores_simulated_policies() -> None:
    model = acceptance_model("mt-bench-t1")
    pol = TreePolicy("delayed", 6, 4, 24, delay=2, verify="traversal")
    e = expected_tokens_for_policy(pol, model)
    assert 1.0 < e <= 7.0
    assert expected_tokens_for_policy(pol, model) == e  # cached, deterministic
    tokens, nodes, expected = sample_step(pol, model, np.random.default_rng(0), 8)
    assert tokens.shape == (8,) and (nodes == delayed_parents(6, 4, 2, 24).size).all()
    assert (expected == e).all() and ((tokens >= 1) & (tokens <= 7)).all()


@pytest.mark.parametrize("engine", ["sglang", "vllm", "trtllm"])
def test_exports_run_token_level_and_say_so(engine: str) -> None:
    from spectune.planner.export import export_table
    from spectune.specs.policy import Bucket, PolicyTable

    def table(policy: TreePolicy) -> PolicyTable:
        return PolicyTable(
            target="llama-3.1-8b",
            drafter="eagle3-llama-3.1-8b",
            hardware="h100-sxm",
            workload="mt-bench-t1",
            temperature=1.0,
            buckets=(
                Bucket((1, 1), (0, 8192), policy),
                Bucket((2, 64), (0, 8192), TreePolicy("dynamic-topk", 4, 1, 5)),
            ),
        )

    exp, _ = export_table(table(TreePolicy("dynamic-topk", 4, 1, 5, verify="greedy")), engine)
    assert "verifies token by token" in " ".join(exp.approximations)
    exp, _ = export_table(table(TreePolicy("delayed", 4, 2, 9, delay=1)), engine)
    assert "i.i.d. sampled rollouts" in " ".join(exp.approximations)
    for b in exp.config.get("buckets", []):  # whatever the engine runs is a top-k policy
        assert "delayed" not in str(b)


@given(
    st.integers(1, 64),
    st.integers(1, 64),
    st.integers(2, 1024),
    st.sampled_from(["token", "traversal", "spectr", "greedy"]),
    st.integers(0, 63),
)
def test_delayed_labels_round_trip(
    depth: int, topk: int, budget: int, rule: str, delay: int
) -> None:
    p = TreePolicy("delayed", depth, topk, budget, verify=rule, delay=min(delay, depth - 1))
    assert TreePolicy.parse(p.label) == p


def test_search_draws_rules_and_delays_and_gives_them_back() -> None:
    import optuna

    from spectune.planner.space import neighbours, policy_from_params, policy_params, suggest_policy

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = PolicySpace(depth=(1, 6), topk=(1, 4), budget=(2, 32)).at_temperature(1.0)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=2))
    seen = set()
    for _ in range(200):
        trial = study.ask()
        p = suggest_policy(trial, space, 8)
        study.tell(trial, 0.0)
        if p is None:
            continue
        assert policy_from_params(trial.params) == p
        assert policy_from_params(policy_params(p, space, 8)) == p
        if p.builder == "delayed":
            assert p.delay < p.depth
            if p.depth > 2 and p.budget > 3:  # room for another delay
                assert {q.delay for q in neighbours(p, space, 8)} - {p.delay}  # delay is walked
        seen.add((p.builder, p.verify))
    assert {("delayed", r) for r in ("token", "traversal", "spectr")} <= seen
    assert all(rule == "token" for b, rule in seen if b != "delayed")  # same law there


def test_simulator_steps_average_to_the_planner_value() -> None:
    model = acceptance_model("mt-bench-t1")
    pol = TreePolicy("delayed", 5, 2, 11, delay=1, verify="spectr")
    rng = np.random.default_rng(0)
    tokens = np.concatenate([sample_step(pol, model, rng, 256)[0] for _ in range(20)])
    assert tokens.mean() == pytest.approx(expected_tokens_for_policy(pol, model), rel=0.04)


def test_policy_file_keeps_rule_and_delay_and_old_files_unchanged(tmp_path: object) -> None:
    from pathlib import Path

    from spectune.specs.policy import Bucket, PolicyTable

    pols = (
        TreePolicy("delayed", 6, 4, 24, delay=2, verify="traversal"),
        TreePolicy("dynamic-topk", 5, 4, 8),
    )
    table = PolicyTable(
        target="llama-3.1-8b",
        drafter="eagle3-llama-3.1-8b",
        hardware="h100-sxm",
        workload="mt-bench-t1",
        buckets=(Bucket((1, 1), (0, 8192), pols[0]), Bucket((2, 8), (0, 8192), pols[1])),
    )
    d = table.to_dict()
    assert d["buckets"][0]["policy"]["verify"] == "traversal"
    assert d["buckets"][0]["policy"]["delay"] == 2
    assert "verify" not in d["buckets"][1]["policy"] and "delay" not in d["buckets"][1]["policy"]
    path = Path(str(tmp_path)) / "p.json"
    table.save(path)
    assert tuple(b.policy for b in PolicyTable.load(path).buckets) == pols


def test_verify_rule_refuses_malformed_inputs() -> None:
    tok = torch.zeros(3, dtype=torch.int64)
    par = torch.tensor([-1, 0, 0], dtype=torch.int32)
    qo = torch.tensor([0, 3], dtype=torch.int32)
    p = torch.full((3, 4), 0.25)
    with pytest.raises(ValueError, match="float32"):
        verify_rule("token", tok, par, qo, p.double(), p.double(), 0)
    with pytest.raises(ValueError, match="one shape"):
        verify_rule("token", tok, par, qo, p, p[:, :2].contiguous(), 0)
    with pytest.raises(ValueError, match="one entry per probability row"):
        verify_rule("token", tok[:2], par[:2], qo, p, p, 0)
    with pytest.raises(ValueError, match="unknown verification rule"):
        verify_rule("nope", tok, par, qo, p, p, 0)
    with pytest.raises(SpecError, match="verification rule"):
        simulate_rule(
            "nope",
            DraftTree.chain(2),
            world(DraftTree.chain(2), 4, np.random.default_rng(0), True),
            np.random.default_rng(0),
        )
