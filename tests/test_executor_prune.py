"""Pruned trees in the executor (dynamic-depth pruning): the torch pruning step equals the
planner's numpy builder on identical pools, the ragged verify of the kept nodes equals the dense
verify of the same trees (padding corrupts nothing), a pruned run verifies exactly the kept
tokens, and accepted lengths follow the acceptance model. CPU: torch, Triton under the
interpreter (conftest)."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from test_executor import TARGET, _dynamic, _runner, _static  # noqa: E402

from spectune.executor.accept import greedy_accept  # noqa: E402
from spectune.executor.loop import SpecRunner  # noqa: E402
from spectune.executor.synthetic import draw_target_tokens  # noqa: E402
from spectune.executor.tree_build import (  # noqa: E402
    PRUNED,
    pool_levels,
    prune_tree,
    reference_prune,
    select_tree,
)
from spectune.executor.verifiers import RaggedVerifier  # noqa: E402
from spectune.planner.acceptance import acceptance_model  # noqa: E402
from spectune.planner.trees import expected_tokens_for_policy, sample_step  # noqa: E402
from spectune.planner.trees.build import _choose  # noqa: E402
from spectune.planner.trees.flat import FlatPool  # noqa: E402
from spectune.specs import TreePolicy  # noqa: E402

MODEL = acceptance_model("mt-bench")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


# ---- the planner's numpy builder on the executor's pools ------------------------------------------
def _dynamic_flat_pool(
    score: np.ndarray, parent: np.ndarray, level: np.ndarray, topk: int
) -> FlatPool:
    """The executor's dynamic pool (score/parent [B, P], level [P]) as the planner's FlatPool:
    column 0 the root, column c = pool entry c - 1; children of a node are contiguous."""
    b, p = score.shape
    lp = np.concatenate([np.zeros((b, 1)), score.astype(np.float64)], axis=1)
    par = np.concatenate([np.full((b, 1), -1), np.where(parent >= 0, parent + 1, 0)], axis=1)
    start = np.zeros((b, p + 1), dtype=np.int64)
    count = np.zeros((b, p + 1), dtype=np.int64)
    for i in range(b):
        for c in range(p, 0, -1):  # first child column of each parent
            start[i, par[i, c]] = c
            count[i, par[i, c]] += 1
    lv = np.concatenate([[0], level])
    bounds = [0, *np.flatnonzero(np.diff(lv)) + 1, p + 1]
    slices = [slice(int(a), int(z)) for a, z in itertools.pairwise(bounds)]
    return FlatPool(lp, np.ones((b, p + 1)), start, lv, slices, topk, parent=par, count=count)


def _static_flat_pool(parents: np.ndarray, depth: np.ndarray, score: np.ndarray) -> FlatPool:
    """A drafted static shape (parents/depth [N], path log-probs score [B, N]) as the FlatPool
    planner.trees.flat.static_pool builds for it."""
    b, n = score.shape
    nkids = np.bincount(parents[1:], minlength=n)
    first = np.zeros(n, dtype=np.int64)
    kids = np.arange(1, n)
    first[parents[kids][::-1]] = kids[::-1]
    slices = [
        slice(int(np.flatnonzero(depth == d)[0]), int(np.flatnonzero(depth == d)[-1]) + 1)
        for d in range(int(depth.max()) + 1)
    ]
    return FlatPool(
        score.astype(np.float64),
        np.ones((b, n)),
        np.broadcast_to(first, (b, n)),
        level=depth,
        level_slices=slices,
        width=int(nkids.max()),
        parent=np.broadcast_to(parents, (b, n)),
        count=np.broadcast_to(nkids, (b, n)),
    )


def _compact(
    keep: np.ndarray, parent_col: np.ndarray, token_col: np.ndarray, depth_col: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row's kept columns (keep bool[T], column 0 the root) in column order as a tree:
    (parents, tokens, depth), the layout prune_tree compacts to."""
    cols = np.flatnonzero(keep)
    where = {int(c): j for j, c in enumerate(cols)}
    parents = np.array([-1] + [where[int(parent_col[c])] for c in cols[1:]], dtype=np.int64)
    return parents, token_col[cols], depth_col[cols]


def _assert_row(r: SpecRunner, b: int, parents: np.ndarray, tokens: np.ndarray, depth: np.ndarray):
    assert r.counts is not None
    n = int(r.counts[b])
    assert n == parents.size
    np.testing.assert_array_equal(r.tree.parents[b, :n].numpy(), parents)
    np.testing.assert_array_equal(r.tree.tokens[b, :n].numpy(), tokens)
    np.testing.assert_array_equal(r.tree.depth[b, :n].numpy(), depth)
    # placeholders: children of the root that never match
    assert (r.tree.tokens[b, n:] == PRUNED).all()
    assert (r.tree.parents[b, n:] == 0).all()
    assert (r.tree.accept[b, n:] == 0).all()


@pytest.mark.parametrize(
    "policy",
    [
        TreePolicy("dynamic-topk", 4, 3, 12, 0.05),
        TreePolicy("dynamic-topk", 3, 2, 7, 0.2),
        TreePolicy("dynamic-topk", 5, 4, 20, 0.01),
        TreePolicy("dynamic-topk", 1, 4, 8, 0.3),
    ],
)
def test_dynamic_pruning_equals_planner_choose(policy: TreePolicy) -> None:
    """select_tree + prune_tree on the drafted pool == planner.trees.build._choose on it."""
    r = _runner(policy=policy, batch=4, use_kernels=False)
    src = _dynamic(r)
    rng = np.random.default_rng(0)
    for _ in range(3):
        r.draft()
        r.build()
        score = src.pool_score.numpy()
        parent = src.pool_parent.numpy()
        pool = _dynamic_flat_pool(
            score, parent, pool_levels(policy.depth, policy.topk), policy.topk
        )
        keep, _, grafts = _choose(policy, MODEL, pool, rng, False)
        assert grafts is None
        for b in range(r.batch):
            tok = np.r_[r.root.token[b].item(), src.pool_token[b].numpy()]
            dep = pool.level
            _assert_row(r, b, *_compact(keep[b], pool.parent[b], tok, dep))


def test_static_pruning_equals_planner_choose() -> None:
    """The static shape drafted with path log-probs, pruned == _choose on the same pool (the
    planner keeps the whole shape, then prunes by path probability)."""
    policy = TreePolicy("static", 4, 3, 14, 0.08)
    r = _runner(policy=policy, batch=5, use_kernels=False)
    rng = np.random.default_rng(0)
    src = _static(r)
    parents = src.plan.parents.numpy()
    depth = src.plan.depth.numpy()
    pruned_some = False
    for _ in range(4):
        r.draft()
        r.build()
        assert src.drafted.score is not None and r.counts is not None
        pool = _static_flat_pool(parents, depth, src.drafted.score.numpy())
        keep, _, _ = _choose(policy, MODEL, pool, rng, False)
        for b in range(r.batch):
            tok = src.drafted.tokens[b].numpy()
            _assert_row(r, b, *_compact(keep[b], parents, tok, depth))
        pruned_some |= bool((r.counts < r.nodes).any())
    assert pruned_some


@st.composite
def _pools(draw: st.DrawFn) -> tuple[int, int, int, float, int]:
    d = draw(st.integers(1, 4))
    k = draw(st.integers(1, 3))
    p = k + (d - 1) * k * k
    budget = draw(st.integers(2, p + 1))
    threshold = draw(st.floats(1e-4, 0.95))
    return d, k, budget, threshold, draw(st.integers(0, 2**31 - 1))


@given(_pools())
def test_prune_tree_equals_planner_on_random_pools(case: tuple[int, int, int, float, int]) -> None:
    """Random pools (ties included) and thresholds: the torch selection + pruning equals the
    planner's _choose and reference_prune."""
    d, k, budget, threshold, seed = case
    g = torch.Generator().manual_seed(seed)
    b, p = 3, k + (d - 1) * k * k
    par = torch.full((b, p), -1, dtype=torch.int64)
    for lvl in range(2, d + 1):  # frontier = the first k entries of the level above
        base, above = k + (lvl - 2) * k * k, k + (lvl - 3) * k * k if lvl > 2 else 0
        par[:, base : base + k * k] = above + torch.arange(k).repeat_interleave(k)
    edge = -torch.randint(0, 6, (b, p), generator=g).float() * 0.5  # many ties
    score = edge.clone()
    for j in range(p):  # path log-prob: parent's + own (parents come first)
        if par[0, j] >= 0:
            score[:, j] += score[:, par[0, j]]
    tok = torch.randint(0, 50, (b, p), generator=g)
    lv = torch.tensor(pool_levels(d, k))
    z = torch.zeros(b, p)
    full = select_tree(tok, par, score, z, z, lv, torch.tensor([7, 8, 9]), budget, d, True)
    tree, counts = prune_tree(full, threshold)
    policy = TreePolicy("dynamic-topk", d, k, budget, threshold)
    pool = _dynamic_flat_pool(score.numpy(), par.numpy(), lv.numpy(), k)
    keep, _, _ = _choose(policy, MODEL, pool, np.random.default_rng(0), False)
    assert full.score is not None
    kept_ref, par_ref = reference_prune(full.parents.numpy(), full.score.numpy(), threshold)
    np.testing.assert_array_equal(counts.numpy(), kept_ref.sum(axis=1))
    np.testing.assert_array_equal(tree.parents.numpy(), par_ref)
    for i in range(b):
        want = _compact(keep[i], pool.parent[i], np.r_[[7, 8, 9][i], tok[i].numpy()], pool.level)
        n = int(counts[i])
        assert n == want[0].size
        np.testing.assert_array_equal(tree.parents[i, :n].numpy(), want[0])
        np.testing.assert_array_equal(tree.tokens[i, :n].numpy(), want[1])
        np.testing.assert_array_equal(tree.depth[i, :n].numpy(), want[2])
        # the compacted mask is the ancestor matrix of the compacted tree
        m = tree.mask[i, :n, :n].numpy()
        for j in range(n):
            anc = {j}
            a = int(tree.parents[i, j])
            while a >= 0:
                anc.add(a)
                a = int(tree.parents[i, a])
            np.testing.assert_array_equal(np.flatnonzero(m[j]), sorted(anc))


# ---- the ragged verify ----------------------------------------------------------------------------
def test_ragged_verify_equals_dense_verify_on_the_same_trees() -> None:
    """The packed verify of the kept nodes gives the dense verify's argmax and EAGLE-3
    features on every kept node and the same K/V in their slots; pruned slots, padding rows and
    every other cache slot are left untouched."""
    pytest.importorskip("triton")
    policy = TreePolicy("dynamic-topk", 4, 3, 12, 0.2)
    r = _runner(policy=policy, batch=3)
    assert isinstance(r.verifier, RaggedVerifier) and r.counts is not None
    lay = r.verifier.plan
    torch.manual_seed(3)
    for _ in range(20):  # a step where something is pruned
        r.draft()
        r.build()
        if (r.counts < r.nodes).any() and lay.bucket(int(lay.total)) > int(lay.total):
            break
    counts = r.counts.clone()
    total = int(counts.sum())
    assert int(lay.total) == total and lay.bucket(total) > total  # padding rows are exercised
    assert (counts < r.nodes).any()  # something was pruned
    before = r.tcache.kv.clone()
    r.verify()
    after = r.tcache.kv.clone()
    argmax, h3 = r.verifier.argmax_tok.clone(), r.verifier.hidden3.clone()
    # the dense path on the same trees (pruned slots given a real token; nobody sees them)
    r.tcache.kv.copy_(before)
    t = r.tree
    hidden, captured = r.target.forward(
        t.tokens.clamp(min=0), 24 + t.depth, r.tcache, 24, t.mask, capture=r.verifier.capture_layers
    )
    logits = r.target.lm_head(hidden)
    dense_h3 = torch.cat(captured, dim=-1)
    c = 24
    for b in range(r.batch):
        n = int(counts[b])
        top2 = logits[b, :n].topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 1e-4
        assert torch.equal(argmax[b, :n][clear], logits[b, :n].argmax(-1)[clear])
        assert (argmax[b, n:] == PRUNED).all()
        assert torch.allclose(h3[b, :n], dense_h3[b, :n], atol=1e-4)
        kv_dense = r.tcache.kv[:, :, b, c : c + n]
        assert torch.allclose(after[:, :, b, c : c + n], kv_dense, atol=1e-5)
        # nothing else of this sequence's cache row moved
        assert torch.equal(after[:, :, b, :c], before[:, :, b, :c])
        assert torch.equal(after[:, :, b, c + n :], before[:, :, b, c + n :])


def test_pruned_run_verifies_exactly_the_kept_tokens() -> None:
    """Per step, the verify runs T = sum(kept) rows (+ bucket padding), the recorded verified
    tokens are the kept counts, and kept counts are the nodes at or above the threshold."""
    pytest.importorskip("triton")
    policy = TreePolicy("dynamic-topk", 3, 2, 7, 0.15)
    r = _runner(policy=policy, batch=2)
    res = r.run(2, warmup=0)
    assert isinstance(r.verifier, RaggedVerifier) and r.counts is not None
    assert len(res.verified) == 2
    assert res.verified_mean == pytest.approx(sum(res.verified) / 2)
    assert all(1.0 <= v <= r.nodes for v in res.verified)
    assert r.verifier.totals[-1] == int(r.counts.sum()) == int(r.verifier.plan.qo[-1])
    assert res.verified[-1] == pytest.approx(float(r.counts.double().mean()))
    counts = r.counts.double()
    spread = float(counts.std(unbiased=False) / counts.mean())
    assert len(res.spread) == 2 and res.spread[-1] == pytest.approx(spread, abs=1e-6)
    assert res.verified_cv == pytest.approx(sum(res.spread) / 2)
    src = _dynamic(r)
    full = select_tree(
        src.pool_token, src.pool_parent, src.pool_score, src.pool_accept, src.pool_lo,
        src.pool_level, r.root.token, r.nodes, policy.depth, with_score=True,
    )  # fmt: skip
    assert full.score is not None
    want = (full.score.double() >= math.log(policy.prune_threshold)).sum(dim=1)  # root: 0 >= log p
    assert torch.equal(r.counts, want)
    # accepted paths stay root paths of the pruned trees
    path, num_acc = r.acceptor.path, r.acceptor.num_acc
    for b in range(r.batch):
        for j in range(1, int(num_acc[b]) + 1):
            assert r.tree.parents[b, path[b, j]] == path[b, j - 1]
            assert path[b, j] < r.counts[b]


def test_prune_zero_is_the_dense_runner_and_a_no_op_threshold_matches_it() -> None:
    """prune_threshold 0 builds no ragged layout (the fixed-shape graphs of before); a threshold
    that prunes nothing gives the same trajectory through the ragged verify (incl. padding)."""
    pytest.importorskip("triton")
    outs = []
    for p in (0.0, 1e-30):
        torch.manual_seed(5)
        r = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6, p), batch=2)
        assert isinstance(r.verifier, RaggedVerifier) == (p > 0)
        torch.manual_seed(6)
        for _ in range(2):
            for f in (r.draft, r.build, r.verify, r.accept, r.compact, r.extend):
                f()
        if r.counts is not None:
            assert (r.counts == r.nodes).all()
        acc = r.acceptor
        outs.append(
            (r.tree.tokens.clone(), acc.path.clone(), r.tcache.kv.clone(), acc.num_acc.clone())
        )
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(outs[0][3], outs[1][3])
    for b in range(2):
        end = 24 + int(outs[0][3][b]) + 1
        assert torch.allclose(outs[0][2][:, :, b, :end], outs[1][2][:, :, b, :end], atol=1e-5)


# ---- acceptance -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "policy",
    [TreePolicy("dynamic-topk", 4, 3, 12, 0.05), TreePolicy("static", 4, 3, 12, 0.05)],
)
def test_pruned_accepted_lengths_and_tree_size_match_the_planner(policy: TreePolicy) -> None:
    """Over many drafted steps, the mean accepted length and the mean kept tokens of pruned
    trees match the planner's expected tokens and tree size (what the cost model prices)."""
    r = _runner(policy=policy, batch=64, use_kernels=False)
    acc, kept, count = 0.0, 0.0, 0
    for _ in range(40):
        r.draft()
        r.build()
        t = r.tree
        target = draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, TARGET.vocab - 1)
        num, _, _ = greedy_accept(t.parents, t.tokens, t.depth, t.mask, target, policy.depth)
        acc += float(num.double().sum())
        kept += float(r.counts.double().sum())
        count += num.numel()
    want_tokens = expected_tokens_for_policy(policy, MODEL, samples=4000)
    _, nodes, _ = sample_step(policy, MODEL, np.random.default_rng(0), 4000)
    assert abs(acc / count + 1 - want_tokens) < 0.1
    assert abs(kept / count - float(np.mean(nodes))) < 0.35


# ---- measurement + check ------------------------------------------------------------------------
def test_check_prices_pruned_runs_at_the_measured_tree_size(tmp_path: Path) -> None:
    """run_record writes verified_mean; check prices a pruned run's verify at it, and falls back
    to the planner's tree_tokens for a document without it."""
    import json

    from spectune.executor.loop import PhaseResult
    from spectune.planner.costmodel import CostModel
    from spectune.planner.objective import closed_form_objective
    from spectune.specs import load_hardware, load_model
    from spectune.validate.check import check_folder
    from spectune.validate.measure import RunSpec, measurement_doc, run_record

    pol = TreePolicy("dynamic-topk", 6, 10, 32, 0.05)
    ph = {k: 1e-3 for k in ("draft", "tree", "verify", "accept", "compact", "extend", "overhead")}
    ph["step"] = 0.02
    res = PhaseResult(ph, [3.0, 3.0], 8, 32, [17.0, 18.0])
    ar = PhaseResult({"verify": 6e-3, "overhead": 0.0, "step": 7e-3}, [0.0], 8, 1)
    rec = run_record(RunSpec(8, pol, "p"), res, ar)
    assert rec["verified_mean"] == 17.5 and rec["nodes"] == 32
    dense = run_record(RunSpec(8, TreePolicy("dynamic-topk", 6, 10, 32), "d"), res, ar)
    kw = dict(gpu="x", hardware="h200", target="llama-3.1-8b", drafter="eagle3-llama-3.1-8b")
    doc = measurement_doc(
        **kw, workload="mt-bench", context=4096, steps=2, attention="a", runs=[rec, dense]
    )
    (tmp_path / "m.json").write_text(json.dumps(doc))
    cm = CostModel(load_hardware("h200"), load_model(kw["target"]), load_model(kw["drafter"]))
    got = check_folder(tmp_path)
    verify = {r.what: r.predicted for r in got.verify}
    # 8 x 17.5 = 140 kept tokens run as the next multiple of the token bucket (16): 144
    assert verify["verify B=8 p 6/10/32/p0.05 N=17.5"] == pytest.approx(
        float(cm.verify_time(8, 144 / 8, 4096))
    )
    assert verify["verify B=8 d 6/10/32 N=32"] == pytest.approx(float(cm.verify_time(8, 32, 4096)))
    del doc["runs"][0]["verified_mean"]
    (tmp_path / "m.json").write_text(json.dumps(doc))
    n = closed_form_objective(kw["target"], kw["drafter"], "h200", "mt-bench").tree_tokens(pol)
    assert 1 < n < 32
    rows = {r.what: r.predicted for r in check_folder(tmp_path).verify}
    bucketed = -(-8 * n // 16) * 16 / 8  # the kept tokens' next multiple of 16, per request
    assert rows[f"verify B=8 p 6/10/32/p0.05 N={n:g}"] == pytest.approx(
        float(cm.verify_time(8, max(bucketed, n), 4096))
    )


# ---- GPU ------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_pruned_session_graphs() -> None:
    """Pruned dynamic and static policies through the graph-captured session: bucket graphs
    captured lazily, verified tokens recorded."""
    from test_executor import HEAD

    from spectune.executor.session import Session, SessionConfig, measure_runs

    s = Session(TARGET, HEAD, SessionConfig(8, 256, 16, autotune_gemm=False), "cuda")
    runs = [
        (5, TreePolicy("dynamic-topk", 3, 3, 10, 0.1), "p"),
        (5, TreePolicy("static", 3, 3, 10, 0.1), "s"),
        (5, TreePolicy("dynamic-topk", 3, 3, 10), "d"),
    ]
    recs = measure_runs(s, runs, 256, MODEL, 6, 2)
    assert 1.0 <= recs[0]["verified_mean"] <= 10.0
    assert 1.0 <= recs[1]["verified_mean"] <= 10.0
    assert recs[2]["verified_mean"] == recs[2]["nodes"] == 10
    assert all(r["tokens_per_step"] >= 1.0 for r in recs)


def test_route_buckets() -> None:
    """A bucket runs at a larger one (within reach) only when that is cheaper by the margin;
    the route never goes to a smaller bucket; no costs, no routes."""
    from spectune.executor.verifiers import route_buckets

    cost = {16: 1.0, 32: 1.1, 48: 2.0, 64: 1.2, 80: 1.3, 96: 1.31}
    route = route_buckets(cost, reach=2, margin=0.02)
    assert route == {16: 16, 32: 32, 48: 64, 64: 64, 80: 80, 96: 96}
    assert route_buckets({}, reach=4) == {}
    assert route_buckets({16: 1.0, 32: 0.99}, reach=4, margin=0.02) == {16: 16, 32: 32}
    assert route_buckets({16: 1.0, 32: 0.5}, reach=0) == {16: 16, 32: 32}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=1, max_size=12), st.integers(0, 5))
def test_route_buckets_properties(costs: list[float], reach: int) -> None:
    """Routes stay within reach, never go down, and never to a costlier bucket."""
    from spectune.executor.verifiers import route_buckets

    cost = {16 * (i + 1): c for i, c in enumerate(costs)}
    route = route_buckets(cost, reach=reach)
    for b, r in route.items():
        assert b <= r <= b + 16 * reach
        assert cost[r] <= cost[b]
