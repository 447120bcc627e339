"""Executor tests on CPU at small shapes (torch CPU, Triton under the interpreter); GPU tests are
marked and gated in conftest."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from spectune.executor.accept import greedy_accept  # noqa: E402
from spectune.executor.drafter import Eagle3Head, ModelDrafter  # noqa: E402
from spectune.executor.loop import ARRunner, SpecRunner  # noqa: E402
from spectune.executor.model import Decoder, floor_bytes  # noqa: E402
from spectune.executor.sources import DynamicTopK, Pruned, StaticPlan, StaticShape  # noqa: E402
from spectune.executor.synthetic import draw_target_tokens  # noqa: E402
from spectune.executor.tree_build import (  # noqa: E402
    ancestor_mask,
    pool_levels,
    reference_select_tree,
    select_tree,
    tree_size,
)
from spectune.planner.acceptance import ConfidenceAcceptance, acceptance_model  # noqa: E402
from spectune.planner.trees.pool import select_dynamic  # noqa: E402
from spectune.specs import SOURCE_MODEL, DraftTree, ModelSpec, SpecError, TreePolicy, model_preset  # noqa: E402

TARGET = ModelSpec(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=300
)
HEAD = ModelSpec(
    name="tiny-eagle",
    arch="eagle3-head",
    layers=1,
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    ffn=96,
    vocab=300,
    draft_vocab=100,
)
SMALL = ModelSpec(
    name="tiny-draft", layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, ffn=64, vocab=300
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def _target() -> Decoder:
    return Decoder(TARGET, "cpu", torch.float32, max_pos=512)


# ---- model pieces ---------------------------------------------------------------------------------
def test_chain_forward_equals_token_by_token() -> None:
    m = _target()
    b, n, c = 2, 5, 20
    a, z = m.new_cache(b, 64), m.new_cache(b, 64)
    z.kv.copy_(a.kv)
    tok = torch.randint(0, TARGET.vocab, (b, n))
    pos = c + torch.arange(n).expand(b, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(b, n, n)
    full, _ = m.forward(tok, pos, a, c, causal)
    for i in range(n):
        one, _ = m.forward(tok[:, : i + 1], pos[:, : i + 1], z, c, causal[:, : i + 1, : i + 1])
        assert torch.allclose(one[:, i], full[:, i], atol=1e-4)
    assert m.lm_head(full).shape == (b, n, TARGET.vocab)


def test_floor_bytes_by_hand() -> None:
    spec = model_preset("llama-3.1-8b")
    # 8.03e9 params - 0.525e9 embedding rows, bf16; + 4096 tokens x 131072 B of KV
    want = (spec.total_params() - 128256 * 4096) * 2 + 4096 * 32 * 2 * 8 * 128 * 2
    assert floor_bytes(spec, 1, 4096) == pytest.approx(want)
    assert 15.0e9 < want < 16.1e9


def test_drafter_shape_checks() -> None:
    m = _target()
    with pytest.raises(SpecError):
        Eagle3Head(TARGET, m)
    with pytest.raises(SpecError):
        ModelDrafter(
            ModelSpec(
                name="x", layers=1, hidden=32, heads=2, kv_heads=1, head_dim=16, ffn=64, vocab=7
            ),
            m,
        )


# ---- trees ---------------------------------------------------------------------------------------
def _runner(
    drafter: str = "eagle", policy: TreePolicy | None = None, batch: int = 3, **kw: object
) -> SpecRunner:
    m = _target()
    dr = Eagle3Head(HEAD, m) if drafter == "eagle" else ModelDrafter(SMALL, m)
    pol = policy or TreePolicy("dynamic-topk", 4, 3, 12)
    return SpecRunner(
        m,
        dr,
        acceptance_model("mt-bench"),
        pol,
        batch,
        24,
        m.new_cache(batch, 128),
        dr.new_cache(batch, 128),
        **kw,
    )  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "policy",
    [
        TreePolicy("dynamic-topk", 4, 3, 12),
        TreePolicy("dynamic-topk", 3, 2, 7),
        TreePolicy("dynamic-topk", 1, 4, 8),
        TreePolicy("dynamic-topk", 5, 1, 6),
    ],
)
def test_torch_builder_equals_planner_numpy_builder(policy: TreePolicy) -> None:
    """The device pool + selection equals planner.trees' EAGLE-2 selection on the same pool."""
    r = _runner(policy=policy)
    src = _dynamic(r)
    for _ in range(3):
        r.draft()
        r.build()
        for b in range(r.batch):
            pool = DraftTree.from_parents(
                np.r_[-1, src.pool_parent[b].numpy() + 1],
                tokens=np.r_[r.root.token[b].item(), src.pool_token[b].numpy()],
                logprobs=np.r_[0.0, _edge_logprobs(r, b)],
                source=np.r_[0, np.full(src.pool_token.shape[1], SOURCE_MODEL)],
            )
            keep = select_dynamic(pool, policy.depth, policy.topk, policy.budget)
            ref = pool.subtree(keep)
            assert ref.num_nodes == r.nodes
            np.testing.assert_array_equal(ref.parents, r.tree.parents[b].numpy())
            np.testing.assert_array_equal(ref.tokens, r.tree.tokens[b].numpy())
            np.testing.assert_array_equal(ref.depth, r.tree.depth[b].numpy())
            np.testing.assert_array_equal(ref.ancestor_matrix, r.tree.mask[b].numpy())


def _dynamic(r: SpecRunner) -> DynamicTopK:
    """The runner's dynamic top-k source (under the pruning, for pruned policies)."""
    src = r.source.base if isinstance(r.source, Pruned) else r.source
    assert isinstance(src, DynamicTopK)
    return src


def _static(r: SpecRunner) -> StaticShape:
    """The runner's static source (under the pruning, for pruned policies)."""
    src = r.source.base if isinstance(r.source, Pruned) else r.source
    assert isinstance(src, StaticShape)
    return src


def _edge_logprobs(r: SpecRunner, b: int) -> np.ndarray:
    """Per-entry draft log-prob (score minus the parent's score)."""
    src = _dynamic(r)
    score = src.pool_score[b].double().numpy()
    par = src.pool_parent[b].numpy()
    return score - np.where(par >= 0, score[np.maximum(par, 0)], 0.0)


def test_select_tree_equals_reference_with_ties() -> None:
    g = torch.Generator().manual_seed(3)
    d, k = 3, 3
    p = k + (d - 1) * k * k
    lv = torch.tensor(pool_levels(d, k))
    par = torch.full((2, p), -1, dtype=torch.int64)
    par[:, k : k + k * k] = torch.arange(k).repeat_interleave(k)
    par[:, k + k * k :] = k + torch.arange(k).repeat_interleave(k)
    score = torch.randint(-3, 0, (2, p), generator=g).float()  # many ties
    score = torch.where(par >= 0, torch.minimum(score, score.gather(1, par.clamp(min=0))), score)
    tok = torch.randint(0, 50, (2, p), generator=g)
    root = torch.tensor([7, 8])
    z = torch.zeros(2, p)
    t = select_tree(tok, par, score, z, z, lv, root, 9, d)
    rp, rt, rd = reference_select_tree(
        tok.numpy(), par.numpy(), score.numpy(), lv.numpy(), root.numpy(), 9
    )
    np.testing.assert_array_equal(t.parents.numpy(), rp)
    np.testing.assert_array_equal(t.tokens.numpy(), rt)
    np.testing.assert_array_equal(t.depth.numpy(), rd)


def test_tree_size() -> None:
    assert tree_size(5, 4, 8) == 8
    assert tree_size(1, 4, 8) == 5
    assert tree_size(7, 10, 60) == 60


# ---- acceptance ------------------------------------------------------------------------------------
def test_synthetic_acceptance_matches_model_probabilities() -> None:
    """Accepted lengths drawn on the device agree with AcceptanceModel.expected_tokens."""
    r = _runner(policy=TreePolicy("dynamic-topk", 4, 3, 10), batch=1)
    r.draft()
    r.build()
    t = r.tree
    reps = 20000
    par, tok = t.parents.expand(reps, -1), t.tokens.expand(reps, -1)
    target = draw_target_tokens(
        par, tok, t.accept.expand(reps, -1), t.lo.expand(reps, -1), TARGET.vocab - 1
    )
    num, path, _ = greedy_accept(
        par, tok, t.depth.expand(reps, -1), t.mask.expand(reps, -1, -1), target, 4
    )
    tree = DraftTree.from_parents(
        t.parents[0].numpy(), tokens=t.tokens[0].numpy(), logprobs=_edge_logprobs_tree(r)
    )
    model = acceptance_model("mt-bench")
    assert isinstance(model, ConfidenceAcceptance)
    want = model.expected_tokens(tree)
    got = num.double().mean().item() + 1
    se = num.double().std().item() / reps**0.5
    assert abs(got - want) < 4 * se + 1e-3
    # per-node frequency of lying on the accepted path
    on = torch.zeros(t.parents.shape[1])
    for j in range(path.shape[1]):
        sel = num >= j
        on.index_add_(0, path[sel, j], torch.ones(int(sel.sum())))
    np.testing.assert_allclose(on.numpy() / reps, model.node_accept_prob(tree), atol=0.02)


def _edge_logprobs_tree(r: SpecRunner) -> np.ndarray:
    """Draft log-prob of each tree node given its parent, from the accept values: the mt-bench
    calibration is the identity, so log(accept) is the draft log-prob."""
    a = r.tree.accept[0].double().numpy()
    out = np.log(np.maximum(a, 1e-300))
    out[0] = 0.0
    return out


def test_greedy_accept_matches_kernel_reference() -> None:
    from spectune.kernels.verify import reference_walk_tree

    g = torch.Generator().manual_seed(1)
    par = torch.tensor([[-1, 0, 0, 1, 1, 3, 2], [-1, 0, 1, 2, 0, 4, 4], [-1, 0, 0, 0, 1, 2, 3]])
    mask = ancestor_mask(par, 3)
    depth = mask.sum(-1) - 1
    tok = torch.tensor([[5, 1, 2, 3, 4, 5, 6], [5, 1, 2, 3, 4, 5, 6], [5, 1, 2, 3, 4, 5, 6]])
    for _ in range(20):
        target = torch.randint(0, 7, (3, 7), generator=g)
        num, path, bonus = greedy_accept(par, tok, depth, mask, target, 3)
        ref = reference_walk_tree(
            tok.reshape(-1),
            par.to(torch.int32).reshape(-1),
            torch.arange(4, dtype=torch.int32) * 7,
            target.reshape(-1),
        )
        assert torch.equal(num, ref.num_accepted.long())
        assert torch.equal(bonus, ref.next_token)
        for b in range(3):
            n = int(num[b])
            assert torch.equal(path[b, : n + 1], ref.accepted_nodes[b, : n + 1].long())


# ---- the loop ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("drafter", ["eagle", "model"])
def test_spec_runner_runs_and_reports(drafter: str) -> None:
    r = _runner(drafter)
    res = r.run(4, warmup=1)
    assert set(res.phases_s) >= {
        "draft",
        "tree",
        "verify",
        "accept",
        "compact",
        "extend",
        "overhead",
        "step",
    }
    assert 1.0 <= res.tokens_per_step <= 5.0
    path, num_acc = r.acceptor.path, r.acceptor.num_acc
    assert (path[:, 0] == 0).all()
    # accepted path is a root path: each entry is the parent of the next
    for b in range(r.batch):
        n = int(num_acc[b])
        for j in range(1, n + 1):
            assert r.tree.parents[b, path[b, j]] == path[b, j - 1]
    ar = ARRunner(r.target, 2, 24, r.tcache)
    assert ar.run(2, warmup=0).tokens_per_step == 1.0


def test_kernel_path_equals_torch_path() -> None:
    """spectune.kernels' tree attention, walk and compaction (Triton interpreter) give the same
    trajectory as the torch fallbacks."""
    pytest.importorskip("triton")
    outs = []
    for kern in (False, True):
        torch.manual_seed(5)
        r = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6), batch=2, use_kernels=kern)
        assert (r.verifier.plan is not None) == kern
        torch.manual_seed(6)
        for _ in range(2):
            for f in (r.draft, r.build, r.verify, r.accept, r.compact, r.extend):
                f()
        acc = r.acceptor
        outs.append(
            (r.tree.tokens.clone(), acc.path.clone(), r.tcache.kv.clone(), acc.num_acc.clone())
        )
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])
    for b in range(2):  # valid cache rows: the prefix and the compacted accepted path
        end = 24 + int(outs[0][3][b]) + 1
        assert torch.allclose(outs[0][2][:, :, b, :end], outs[1][2][:, :, b, :end], atol=1e-5)


def test_static_tree_is_the_planner_shape_and_accepts_as_predicted() -> None:
    """A static policy verifies planner.trees.static_shape's tree, and the mean accepted length
    over many drafts matches the shape's expected tokens (a product of mean acceptances)."""
    from spectune.planner.trees import static_shape

    policy = TreePolicy("static", 4, 3, 10)
    r = _runner(policy=policy, batch=64, use_kernels=False)
    shape = static_shape(acceptance_model("mt-bench"), 10, 4, 3)
    np.testing.assert_array_equal(r.tree.parents[0].numpy(), shape.parents)
    total, count = 0.0, 0
    for _ in range(40):
        r.draft()
        r.build()
        t = r.tree
        target = draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, TARGET.vocab - 1)
        num, _, _ = greedy_accept(t.parents, t.tokens, t.depth, t.mask, target, 4)
        total += float(num.double().sum())
        count += num.numel()
    assert abs(total / count + 1 - shape.expected_tokens) < 0.06


def test_a_static_run_records_the_widths_it_drafts() -> None:
    """A static run's PhaseResult and measurement record carry its shape's drafted nodes per
    step after the first (what check and the fit price its draft phase over); a dynamic
    run's carry none."""
    from spectune.executor.loop import PhaseResult
    from spectune.planner.trees import static_shape
    from spectune.validate.measure import RunSpec, run_record

    ar = PhaseResult({"verify": 6e-3, "overhead": 0.0, "step": 7e-3}, [0.0], 2, 1)
    for policy in (TreePolicy("static", 4, 3, 10), TreePolicy("dynamic-topk", 3, 2, 6)):
        res = _runner(policy=policy, batch=2, use_kernels=False, use_graphs=False).run(2, 0)
        rec = run_record(RunSpec(2, policy, "p"), res, ar)
        if policy.builder == "static":
            shape = static_shape(acceptance_model("mt-bench"), 10, 4, 3)
            assert res.draft_widths == shape.draft_widths and len(shape.draft_widths) >= 1
            assert rec["draft_widths"] == list(shape.draft_widths)
        else:
            assert res.draft_widths is None and "draft_widths" not in rec


def test_graft_and_prune_policies_get_their_sources() -> None:
    from spectune.executor.sources import Grafted

    graft = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6, 0.0, 4), use_kernels=False)
    assert isinstance(graft.source, Grafted) and graft.retrieval is not None
    assert isinstance(_runner(policy=TreePolicy("dynamic-topk", 3, 2, 6, 0.1, 0)).source, Pruned)


# ---- GPU ---------------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_small_session_graphs() -> None:
    from spectune.executor.session import Session, SessionConfig, measure_runs

    s = Session(TARGET, HEAD, SessionConfig(4, 256, 16, autotune_gemm=False), "cuda")
    recs = measure_runs(
        s, [(2, TreePolicy("dynamic-topk", 3, 2, 6), "p")], 256, acceptance_model("mt-bench"), 5, 2
    )
    assert recs[0]["tokens_per_step"] >= 1.0
    assert s.verify_time(2, 4, 128, reps=3) > 0


@pytest.mark.parametrize(
    "policy",
    [
        TreePolicy("delayed", 4, 3, 32, delay=2),
        TreePolicy("delayed", 4, 3, 7, delay=1),
        TreePolicy("delayed", 3, 2, 7, delay=0, verify="traversal"),
    ],
    ids=lambda p: p.label,
)
def test_delayed_source_verifies_the_planner_shape(policy: TreePolicy) -> None:
    """The executor's delayed source lays out planner.trees.delayed's shape, its rollouts
    attend only the chain and themselves, and the spec loop runs it."""
    from spectune.planner.trees.delayed import delayed_parents

    r = _runner(policy=policy, batch=2, use_kernels=False)
    want = delayed_parents(policy.depth, policy.topk, policy.delay, policy.budget)
    for _ in range(2):
        for f in (r.draft, r.build, r.verify, r.accept, r.compact, r.extend):
            f()
        np.testing.assert_array_equal(r.tree.parents[0].numpy(), want)
        assert (r.acceptor.num_acc <= policy.depth).all()
    tree = DraftTree.from_parents(want)
    np.testing.assert_array_equal(r.tree.mask[0].numpy(), tree.ancestor_matrix)
    sm = r.source.slot_mask[0]
    chain = min(policy.delay, policy.budget - 1)
    assert sm[: chain + 1, : chain + 1].equal(torch.ones(chain + 1, chain + 1).tril().bool())
    if policy.topk > 1 and sm.shape[0] > chain + 2:
        assert not sm[chain + 2, chain + 1]  # rollout 1 does not see rollout 0


@pytest.mark.parametrize("rule", ["token", "traversal", "greedy"])
def test_accept_by_rule_returns_a_root_path(rule: str) -> None:
    """executor.accept.accept_by_rule on a source's trees with one-hot draft rows (top-k
    drafts): the path is a root path, its length the accepted count, the bonus in vocabulary."""
    from spectune.executor.accept import accept_by_rule

    r = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6), batch=4, use_kernels=False)
    r.draft()
    r.build()
    t = r.tree
    b, n = t.parents.shape
    vocab = 8
    local = t.tokens % vocab
    tree = type(t)(t.parents, local, t.depth, t.accept, t.lo, t.mask)
    g = torch.Generator().manual_seed(0)
    p = torch.rand((b, n, vocab), generator=g)
    p = p / p.sum(-1, keepdim=True)
    q = torch.nn.functional.one_hot(local, vocab).float()
    num, path, bonus = accept_by_rule(rule, tree, p, q, seed=3, max_depth=3)
    assert ((bonus >= 0) & (bonus < vocab)).all()
    for i in range(b):
        k = int(num[i])
        assert int(path[i, 0]) == 0
        for j in range(1, k + 1):
            assert int(t.parents[i, path[i, j]]) == int(path[i, j - 1])


def test_traversal_in_the_loop_accepts_as_the_walk() -> None:
    """With top-k drafts (one-hot draft rows) Traversal Verification accepts like the walk:
    the loop's traversal path (rule kernel under the interpreter) gives the mean accepted
    length of the same synthetic trees verified by the walk."""
    from spectune.executor.accept import accept_by_rule, synthetic_rows

    pytest.importorskip("triton")
    r = _runner(policy=TreePolicy("dynamic-topk", 3, 3, 10), batch=256, use_kernels=False)
    r.draft()
    r.build()
    t = r.tree
    tokens, p, q = synthetic_rows(t)
    assert torch.allclose(p.sum(-1), torch.ones(p.shape[:2]), atol=1e-5)
    local = type(t)(t.parents, tokens, t.depth, t.accept, t.lo, t.mask)
    walk, trav = 0.0, 0.0
    for s in range(8):
        target = draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, TARGET.vocab - 1)
        walk += float(
            greedy_accept(t.parents, t.tokens, t.depth, t.mask, target, 3)[0].double().mean()
        )
        trav += float(accept_by_rule("traversal", local, p, q, s, 3)[0].double().mean())
    assert abs(walk - trav) / 8 < 0.08
    r2 = _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6, verify="traversal"), batch=2)
    assert r2.acceptor.rule == "traversal" and r2.acceptor.use_kernels
    for f in (r2.draft, r2.build, r2.verify, r2.accept, r2.compact, r2.extend):
        f()
    assert (r2.acceptor.num_acc <= 3).all()


@settings(max_examples=25, deadline=None)
@given(
    rows=st.lists(st.lists(st.floats(0.0, 0.9), min_size=1, max_size=4), min_size=1, max_size=4),
    depth=st.integers(1, 7),
    budget=st.integers(2, 48),
    width=st.integers(1, 6),
)
def test_static_plan_drafts_the_widths_the_cost_model_prices(
    rows: list[list[float]], depth: int, budget: int, width: int
) -> None:
    """The executor's StaticPlan drafts, at each step after the first, exactly the nodes
    planner.trees.draft_widths gives CostModel.iteration (StaticShape.draft_widths)."""
    from spectune.planner.acceptance import PositionalAcceptance
    from spectune.planner.trees import draft_widths, static_shape

    model = PositionalAcceptance([[v / max(sum(r), 1.0) for v in r] for r in rows])
    shape = static_shape(model, budget, depth, width)
    plan = StaticPlan(shape.parents, shape.rank, "cpu")
    drafted = tuple(int(lv.nodes.numel()) for lv in plan.levels)
    policy = TreePolicy("static", depth, width, budget)
    if not drafted:  # a root alone: nothing is drafted
        assert shape.parents.size == 1 and draft_widths(policy, model) == ()
        return
    assert drafted[0] == 1  # the first step drafts the root's children
    assert draft_widths(policy, model) == shape.draft_widths == drafted[1:]
