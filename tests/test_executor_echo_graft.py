"""Every policy the planner emits runs in the executor: ECHO's shared verify budget, grafting of
retrieved chains, and the common random acceptance draws that make policies comparable.

CPU: torch, Triton under the interpreter (conftest), the tiny model of test_executor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from test_executor import TARGET, _runner  # noqa: E402

from spectune.executor.accept import greedy_accept  # noqa: E402
from spectune.executor.draws import ROOT_ID, CommonDraws, child_id  # noqa: E402
from spectune.executor.retrieval import RetrievalDrafter  # noqa: E402
from spectune.executor.select import (  # noqa: E402
    accept_logp,
    attach_chains,
    best_leaves,
    place_grafts,
    shared_keep,
)
from spectune.executor.sources import Grafted, Shared, tree_slots  # noqa: E402
from spectune.executor.synthetic import draw_target_tokens  # noqa: E402
from spectune.executor.tree_build import PRUNED, TreeBatch, ancestor_mask  # noqa: E402
from spectune.executor.verifiers import RaggedVerifier  # noqa: E402
from spectune.planner.acceptance import RetrievalProfile, acceptance_model  # noqa: E402
from spectune.planner.space import PolicySpace, policy_from_params  # noqa: E402
from spectune.planner.trees import expected_tokens_for_policy  # noqa: E402
from spectune.planner.trees.outcome import keep_top  # noqa: E402
from spectune.specs import TreePolicy  # noqa: E402

MODEL = acceptance_model("mt-bench")
PROFILE = RetrievalProfile(
    np.array([[0.3, 0.6, 0.7], [0.5, 0.8, 0.8], [0.7, 0.9, 0.9]]), np.array([0.3, 0.2, 0.1])
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def _steps(r, n: int) -> None:  # type: ignore[no-untyped-def]
    for _ in range(n):
        for f in (r.draft, r.build, r.verify, r.accept, r.compact, r.extend):
            f()


def _accepted(r, steps: int) -> float:  # type: ignore[no-untyped-def]
    """Mean accepted draft tokens per sequence over `steps` drafted trees (torch walk)."""
    total = 0.0
    for _ in range(steps):
        r.draws.advance()
        r.source.draft()
        r.source.build()
        t = r.tree
        u = r.draws.uniform(t.ids, 2)
        target = draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, TARGET.vocab - 1, u)
        num, _, _ = greedy_accept(t.parents, t.tokens, t.depth, t.mask, target, r.max_depth)
        total += float(num.double().mean())
    return total / steps


# ---- common random draws ---------------------------------------------------------------------
def test_draws_are_uniform_and_independent() -> None:
    d = CommonDraws(64, "cpu", seed=3)
    ids = child_id(torch.full((64, 1), ROOT_ID), torch.arange(200))  # [64, 200]
    u = d.uniform(ids, 2)
    assert u.shape == (64, 200) and float(u.min()) >= 0.0 and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    hist = torch.histc(u, bins=10, min=0.0, max=1.0) / u.numel()
    assert float((hist - 0.1).abs().max()) < 0.01
    v = d.uniform(ids, 1)  # another stream of the same nodes
    assert abs(float(torch.corrcoef(torch.stack((u.flatten(), v.flatten())))[0, 1])) < 0.02
    d.advance()
    w = d.uniform(ids, 2)  # the next step
    assert abs(float(torch.corrcoef(torch.stack((u.flatten(), w.flatten())))[0, 1])) < 0.02
    d.reset(3)
    assert torch.equal(d.uniform(ids, 2), u)  # same seed, step and node: same draw
    d.reset(4)
    assert not torch.equal(d.uniform(ids, 2), u)


def test_node_ids_are_rank_paths() -> None:
    """A node's id depends only on its rank path: distinct paths, distinct ids."""
    root = torch.tensor(ROOT_ID)
    seen = set()
    frontier = [root]
    for _ in range(3):
        nxt = []
        for p in frontier:
            for r in range(6):
                c = child_id(p, r)
                seen.add(int(c))
                nxt.append(c)
        frontier = nxt
    assert len(seen) == 6 + 36 + 216
    assert int(child_id(child_id(root, 1), 0)) == int(child_id(child_id(root, 1), 0))


def test_policies_at_one_batch_see_the_same_acceptance() -> None:
    """The same tree under two policies (dynamic vs pruned at a threshold that keeps it all)
    gets the same acceptance every step; the same policy with another seed does not."""
    a = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6), batch=4, use_kernels=False)
    b = _runner(policy=TreePolicy("static", 3, 2, 6), batch=4, use_kernels=False)
    c = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6), batch=4, use_kernels=False, seed=9)
    ra, rc = a.run(6, 1), c.run(6, 1)
    again = a.run(6, 2)
    assert ra.accepted == again.accepted  # common draws: warm-up length does not matter
    assert ra.accepted != rc.accepted
    # root children draw identical banks in both builders: same first-level acceptance
    for r in (a, b):
        r.draws.reset(5)
        r.draft()
        r.build()
    da, sb = a.source, b.source
    np.testing.assert_array_equal(da.pool_accept[:, :2].numpy(), sb.tree.accept[:, 1:3].numpy())


# ---- ECHO --------------------------------------------------------------------------------------
@settings(max_examples=40, deadline=None)
@given(st.integers(1, 6), st.integers(2, 12), st.integers(1, 40), st.integers(2, 30), st.data())
def test_shared_keep_is_the_planners_keep_top(b: int, c: int, total: int, cap: int, data) -> None:  # type: ignore[no-untyped-def]
    """Over distinct scores, the device choice equals planner.trees.outcome.keep_top(lp, None,
    total) whenever no row passes its cap, and never keeps more than the cap per row."""
    seed = data.draw(st.integers(0, 10_000))
    rng = np.random.default_rng(seed)
    lp = np.sort(-rng.exponential(2.0, (b, c)), axis=1)[:, ::-1].copy()
    lp[:, 0] = 0.0
    if c > 3:
        lp[:, -1] = -1.0e30  # a probability-0 candidate is never kept
    keep = shared_keep(torch.tensor(lp), total, cap).numpy()
    assert keep[:, 0].all() and (keep.sum(axis=1) <= max(cap, 1)).all()
    ref = keep_top(np.where(lp > -1e29, lp, -2e4), None, total)
    if (ref.sum(axis=1) <= cap).all():
        np.testing.assert_array_equal(keep, ref)


@pytest.mark.parametrize(
    "policy",
    [TreePolicy("dynamic-topk", 4, 3, 8, shared_budget=True),
     TreePolicy("static", 4, 3, 8, shared_budget=True),
     TreePolicy("dynamic-topk", 4, 3, 8, 0.05, shared_budget=True)],
)  # fmt: skip
def test_echo_trees_share_one_budget_and_accept_as_planned(policy: TreePolicy) -> None:
    """A shared budget keeps at most B x (budget - 1) draft nodes over the batch, rows differ in
    size, each row is a tree closed under parents, verified ragged; the mean accepted length
    matches the planner's expected tokens of the same shared-budget policy at this batch."""
    batch = 16
    r = _runner(policy=policy, batch=batch, use_kernels=False)
    assert isinstance(r.source, Shared) and r.ragged
    r.draft()
    r.build()
    counts = r.counts.numpy()
    assert counts.sum() - batch <= batch * (policy.budget - 1)
    assert counts.max() > counts.min()
    par = r.tree.parents.numpy()
    for i in range(batch):
        n = counts[i]
        assert par[i, 0] == -1 and (par[i, 1:n] < np.arange(1, n)).all()
        assert (r.tree.tokens[i, n:] == PRUNED).all()
    got = _accepted(r, 40) + 1
    want = expected_tokens_for_policy(policy, MODEL, samples=batch, shared_budget=True)
    want = np.mean(
        [expected_tokens_for_policy(policy, MODEL, samples=batch, seed=s, shared_budget=True)
         for s in range(6)]
    )  # fmt: skip
    assert abs(got - want) < 0.12, (got, want)


def test_echo_row_slots_and_batch_one() -> None:
    """tree_slots sizes the caches for the rows the runner lays out; at batch 1 a shared policy
    is the per-request tree."""
    pol = TreePolicy("dynamic-topk", 3, 3, 6, shared_budget=True)
    r = _runner(policy=pol, batch=4, use_kernels=False)
    assert r.nodes == tree_slots(pol, MODEL, 4) == min(1 + 3 + 2 * 9, 4 * 6, 1 + 4 * 5)
    one = _runner(policy=pol, batch=1, use_kernels=False)
    assert not isinstance(one.source, Shared) and tree_slots(pol, MODEL, 1) == 6


# ---- grafting ----------------------------------------------------------------------------------
def _drafter(batch: int, history: int, width: int) -> RetrievalDrafter:
    return RetrievalDrafter(
        PROFILE, batch, history, width, TARGET.vocab - 1, CommonDraws(batch, "cpu"), "cpu"
    )


def test_lookup_finds_the_latest_bigram_and_records_emitted_tokens() -> None:
    d = _drafter(2, 12, 3)
    d.history[:, :12] = torch.tensor(
        [[5, 6, 7, 8, 5, 6, 9, 10, 11, 1, 2, 3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]]
    )
    d.ptr.zero_()
    got = d.lookup(torch.tensor([[5], [40]]), torch.tensor([[6], [3]]))
    assert got[0, 0].tolist() == [9, 10, 11]  # the later "5 6"
    assert got[1, 0].tolist() == [4, 5, 6]  # no bigram: the unigram "3"
    d.record(torch.tensor([[21, 22, 23], [31, 32, 33]]), torch.tensor([2, 3]))
    assert d.history[0, :2].tolist() == [21, 22] and d.history[0, 2] == 7
    assert d.history[1, :3].tolist() == [31, 32, 33]
    assert d.ptr.tolist() == [2, 3]
    got = d.lookup(torch.tensor([[21], [0]]), torch.tensor([[22], [33]]))
    assert got[0, 0].tolist() == [7, 8, 5] and got[1, 0].tolist() == [4, 5, 6]
    assert d.max_chain == 3


def test_grafts_go_to_the_best_leaves_within_the_free_slots() -> None:
    """Chains hang from leaves, take slots in order of P(leaf) x prod(rho), never past the free
    slots or the graft budget, and the result is a tree (chains below their leaves)."""
    # root -> 1 (P .8) -> 3 (P .4); root -> 2 (P .1); slot 4, 5 free (placeholders)
    parents = torch.tensor([[-1, 0, 0, 1, 0, 0]])
    accept = torch.tensor([[1.0, 0.8, 0.1, 0.5, 0.0, 0.0]])
    tree = TreeBatch(
        parents, torch.tensor([[7, 8, 9, 10, PRUNED, PRUNED]]), torch.tensor([[0, 1, 1, 2, 1, 1]]),
        accept, torch.zeros((1, 6)), ancestor_mask(parents, 4), None, torch.arange(6)[None] + 5,
    )  # fmt: skip
    counts = torch.tensor([4])
    lp = accept_logp(parents, accept, 4)
    leaf, leaf_lp = best_leaves(tree, counts, lp, 2)
    assert leaf.tolist() == [[3, 2]]
    rho = torch.tensor([[0.9, 0.5]])
    length, added = place_grafts(leaf_lp, rho, torch.tensor([2]), 2)
    assert length.tolist() == [[2, 0]] and added.tolist() == [2]  # .4*.9, .4*.45 > .1*.9
    length1, _ = place_grafts(leaf_lp, rho, torch.tensor([5]), 1)
    assert length1.tolist() == [[1, 0]]  # the graft budget caps
    chains = torch.tensor([[[50, 51], [60, 61]]])
    out, n = attach_chains(tree, counts, leaf, length, chains, rho, 4)
    assert n.tolist() == [6]
    assert out.parents[0].tolist() == [-1, 0, 0, 1, 3, 4]
    assert out.tokens[0, 4:].tolist() == [50, 51] and out.depth[0, 4:].tolist() == [3, 4]
    assert out.accept[0, 4:].tolist() == pytest.approx([0.9, 0.5])
    assert bool(out.mask[0, 5, 1]) and not bool(out.mask[0, 5, 2])


@pytest.mark.parametrize(
    "policy",
    [TreePolicy("dynamic-topk", 4, 3, 12, 0.1, 4),
     TreePolicy("static", 4, 3, 12, 0.1, 3),
     TreePolicy("dynamic-topk", 4, 3, 12, 0.1, 4, shared_budget=True)],
)  # fmt: skip
def test_grafted_accepted_lengths_match_the_planner(policy: TreePolicy) -> None:
    """Prune + graft in the executor accepts as many tokens per step as the planner's builder
    predicts for the same policy and retrieval profile (grafts add to pruning's length)."""
    model = MODEL  # mt-bench carries a retrieval profile (prompt lookup's acceptance)
    assert model.retrieval.enabled
    batch = 32
    r = _runner(policy=policy, batch=batch, use_kernels=False)
    assert isinstance(r.source, Grafted)
    got = _accepted(r, 30) + 1
    shared = policy.shared_budget
    want = np.mean(
        [expected_tokens_for_policy(policy, model, samples=batch, seed=s, shared_budget=shared)
         for s in range(8)]
    )  # fmt: skip
    pruned = TreePolicy(policy.builder, policy.depth, policy.topk, policy.budget, 0.1, 0, shared)
    base = np.mean(
        [expected_tokens_for_policy(pruned, model, samples=batch, seed=s, shared_budget=shared)
         for s in range(8)]
    )  # fmt: skip
    assert want > base + 0.05  # grafting matters for this profile
    assert abs(got - want) < 0.15, (got, want, base)


# ---- every policy of the planner's space runs --------------------------------------------------
SPACE = PolicySpace(depth=(1, 3), topk=(1, 3), budget=(2, 10), graft=(0, 4))


@settings(max_examples=10, deadline=None)
@given(
    mode=st.sampled_from(SPACE.builders),
    depth=st.integers(*SPACE.depth),
    topk=st.integers(*SPACE.topk),
    budget=st.integers(*SPACE.budget),
    prune_on=st.booleans(),
    prune=st.floats(*SPACE.prune),
    graft=st.integers(*SPACE.graft),
    shared=st.booleans(),
    batch=st.integers(1, 3),
)
def test_every_policy_of_the_planners_space_runs(
    mode: str, depth: int, topk: int, budget: int, prune_on: bool, prune: float, graft: int,
    shared: bool, batch: int,
) -> None:  # fmt: skip
    """A policy drawn from the planner's space (planner.space.policy_from_params: the trial
    parameters a search draws, canonicalised as the search does) runs through the executor's
    whole step with the interpreter kernels: trees within their slots, a ragged verify exactly
    where trees differ per request, accepted lengths within the tree depth."""
    params = {"mode": mode, "depth": depth, "topk": topk, "budget": budget,
              "prune_on": prune_on, "prune_threshold": prune, "graft_budget": graft,
              "shared_budget": shared}  # fmt: skip
    policy = policy_from_params(params)
    assert policy is not None
    r = _runner(policy=policy, batch=batch)
    assert r.nodes == tree_slots(policy, MODEL, batch)
    assert isinstance(r.verifier, RaggedVerifier) == (prune_on or (shared and batch > 1))
    for _ in range(2):  # the phases run() times, without its ragged warm-up of 6 steps
        _steps(r, 1)
        num = r.acceptor.num_acc
        assert ((num >= 0) & (num <= r.max_depth)).all()
        if r.counts is not None:
            assert (r.counts >= 1).all() and (r.counts <= r.nodes).all()
        # the accepted path is a root path of the verified tree
        path = r.acceptor.path
        for b in range(batch):
            for j in range(1, int(num[b]) + 1):
                assert int(r.tree.parents[b, path[b, j]]) == int(path[b, j - 1])


# ---- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_echo_and_graft_sessions_graphs() -> None:
    """ECHO, prune+graft and both through the graph-captured session with repeats: every phase
    replays (the ragged verify's bucket graphs included), repeats report their spread, and the
    paired comparison holds the same number of repeats."""
    from test_executor import HEAD

    from spectune.executor.session import Session, SessionConfig, measure_runs
    from spectune.validate.measure import comparisons

    s = Session(TARGET, HEAD, SessionConfig(8, 256, 64, autotune_gemm=False), "cuda")
    runs = [
        (6, TreePolicy("dynamic-topk", 3, 3, 10), "dense"),
        (6, TreePolicy("dynamic-topk", 3, 3, 10, shared_budget=True), "echo"),
        (6, TreePolicy("dynamic-topk", 3, 3, 10, 0.1, 4), "graft"),
        (6, TreePolicy("static", 3, 3, 10, 0.1, 4, True), "both"),
    ]
    recs = measure_runs(s, runs, 256, MODEL, 6, 2, repeats=2)
    assert [r["label"] for r in recs] == ["dense", "echo", "graft", "both"]
    assert all(len(r["repeats"]["tokens_per_s"]) == 2 for r in recs)
    assert all(r["tokens_per_step"] >= 1.0 for r in recs)
    assert recs[2]["extend_tokens"] > 4  # grafted chains lengthen the padded extend
    rows = comparisons(recs)
    assert [c["label"] for c in rows] == ["echo", "graft", "both"]
    assert all(len(c["paired_ratios"]) == 2 for c in rows)


def test_session_repeats_and_calibration_spec_runs_on_cpu() -> None:
    """The session's measured runs on CPU (no graphs; interpreter kernels for the ragged
    verify): repeats give per-repeat figures and a spread, the comparisons pair them, and the
    calibration run's spec runs of every builder validate as a measurement of its models."""
    from test_executor import HEAD

    from spectune.executor.calibrate import SPEC_POLICIES, spec_runs
    from spectune.executor.session import Session, SessionConfig, measure_runs
    from spectune.validate.measure import comparisons, validate_measurement

    cfg = SessionConfig(4, 32, 64, use_graphs=False, use_kernels=False, autotune_gemm=False)
    s = Session(TARGET, HEAD, cfg, "cpu")
    runs = [
        (3, TreePolicy("dynamic-topk", 2, 2, 5), "dense"),
        (3, TreePolicy("dynamic-topk", 2, 2, 5, 0.1, 2, True), "echo-graft"),
    ]
    recs = measure_runs(s, runs, 32, MODEL, 2, 0, repeats=3)
    assert all(len(r["repeats"]["tokens_per_step"]) == 3 for r in recs)
    assert recs[1]["repeats"]["tokens_per_step"][0] != recs[1]["repeats"]["tokens_per_step"][1]
    assert recs[1]["spread"]["tokens_per_step_rel"] >= 0.0
    (row,) = comparisons(recs)
    assert row["versus"] == "dense" and len(row["paired_ratios"]) == 3
    small = [TreePolicy(p.builder, 2, 2, 5, p.prune_threshold, min(p.graft_budget, 2),
                        p.shared_budget) for p in SPEC_POLICIES]  # fmt: skip
    doc = spec_runs(s, MODEL, "mt-bench", (1, 2), 32, 1, small)
    assert len(doc["runs"]) == 2 * len(small) - 1  # no shared budget at batch 1
    validate_measurement(
        {"schema": "spectune.measurement/v1", "gpu": "cpu", "hardware": "h100-sxm",
         "target": "t", "drafter": "d", "context": 32, "runs": doc["runs"]}
    )  # fmt: skip


def test_recorded_outcomes_rank_by_draft_probability_not_by_the_answer() -> None:
    """Under trace replay the bank's acceptances are the recorded 0/1 outcomes: a shared budget
    and graft leaves then rank by the path draft probability (else ECHO would keep exactly the
    accepted path); model-driven acceptance ranks by P(accepted)."""
    from pathlib import Path

    from test_executor import HEAD, _target

    from spectune.executor.drafter import Eagle3Head
    from spectune.executor.loop import SpecRunner
    from spectune.executor.sources.shared import Shared as SharedSource
    from spectune.planner.acceptance import TraceReplay
    from spectune.specs.trace import read_trace

    _, steps = read_trace(
        Path(__file__).resolve().parents[1] / "data/traces/smollm2-humaneval.jsonl.gz"
    )
    replay = TraceReplay(steps[:200])
    m = _target()
    dr = Eagle3Head(HEAD, m)
    pol = TreePolicy("dynamic-topk", 3, 3, 6, 0.0, 2, True)
    r = SpecRunner(m, dr, replay, pol, 8, 24, m.new_cache(8, 128), dr.new_cache(8, 128),
                   use_kernels=False)  # fmt: skip
    shared = r.source.base
    assert isinstance(shared, SharedSource) and shared.by_confidence
    assert isinstance(r.source, Grafted) and r.source.by_confidence
    r.draft()
    r.build()
    # every candidate with a finite draft probability competes: the batch's budget is used
    assert int((shared.counts - 1).sum()) == 8 * (pol.budget - 1)
    assert not _runner(policy=pol, batch=8, use_kernels=False).source.base.by_confidence


@pytest.mark.parametrize(
    "policy",
    [TreePolicy("dynamic-topk", 5, 4, 8), TreePolicy("dynamic-topk", 3, 1, 4)],
    ids=["5/4/8", "3/1/4"],
)
def test_a_session_sized_by_cache_slots_runs_a_small_budget_wide_tree(policy: TreePolicy) -> None:
    """`spectune execute` sizes the caches by cache_slots; a dynamic tree whose drafting
    writes more slots (1 + (depth - 1) x top-k = 17 for SGLang's 5/4/8) than it verifies
    (budget 8) must still fit (the drafter's span mask once outgrew its cache)."""
    from test_executor import HEAD

    from spectune.executor.session import Session, SessionConfig
    from spectune.executor.sources import cache_slots

    slots = cache_slots(policy, MODEL, 1)
    assert slots >= 1 + (policy.depth - 1) * policy.topk
    cfg = SessionConfig(1, 32, slots, use_graphs=False, use_kernels=False, autotune_gemm=False)
    (res,) = Session(TARGET, HEAD, cfg, "cpu").run_spec(1, 32, policy, MODEL, steps=2, warmup=0)
    assert res.accepted
