"""Executor tests on CPU at small shapes (torch CPU, Triton under the interpreter); GPU tests are
marked and gated in conftest."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from spectune.executor.attention import reference_tree_attention, tree_attention  # noqa: E402
from spectune.executor.drafter import Eagle3Head, ModelDrafter  # noqa: E402
from spectune.executor.fused import (  # noqa: E402
    add_rmsnorm,
    reference_add_rmsnorm,
    reference_rope_,
    reference_silu_mul,
    rope_,
    rope_scatter_,
    rope_store_,
    rope_tables,
    silu_mul,
)
from spectune.executor.gemm import splitk_linear  # noqa: E402
from spectune.executor.loop import ARRunner, SpecRunner, greedy_accept  # noqa: E402
from spectune.executor.model import Decoder, floor_bytes  # noqa: E402
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
def test_tree_attention_matches_one_softmax() -> None:
    b, n, c = 2, 6, 11
    q = torch.randn(b, n, 4, 16)
    kp, vp = torch.randn(b, 2, c, 16), torch.randn(b, 2, c, 16)
    kn, vn = torch.randn(b, 2, n, 16), torch.randn(b, 2, n, 16)
    mask = ancestor_mask(torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4]]), 5)
    out = tree_attention(q, kp, vp, kn, vn, mask)
    ref = reference_tree_attention(q, kp, vp, kn, vn, mask)
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.allclose(
        tree_attention(q, None, None, kn, vn, mask),
        reference_tree_attention(q, None, None, kn, vn, mask),
        atol=1e-5,
    )


def test_fused_triton_kernels_match_references() -> None:
    x, res, w = torch.randn(5, 40), torch.randn(5, 40), torch.rand(40) + 0.5
    r1, r2 = res.clone(), res.clone()
    assert torch.allclose(
        add_rmsnorm(x, r1, w, use_triton=True), reference_add_rmsnorm(x, r2, w, 1e-5), atol=1e-5
    )
    assert torch.allclose(r1, r2)
    gu = torch.randn(3, 2 * 50)
    assert torch.allclose(silu_mul(gu, use_triton=True), reference_silu_mul(gu), atol=1e-5)
    cos, sin = rope_tables(64, 16, 10000.0, torch.device("cpu"))
    qkv = torch.randn(4, 5 * 16)
    pos = torch.tensor([0, 3, 17, 63])
    a, b_ = qkv.clone(), qkv.clone()
    rope_(a, 3, pos, cos, sin, use_triton=True)
    reference_rope_(b_, 3, pos, cos, sin)
    assert torch.allclose(a, b_, atol=1e-5)
    assert torch.equal(a[:, 48:], qkv[:, 48:])  # v untouched


def test_rope_store_and_scatter_kernels_match_torch() -> None:
    """The one RoPE + K/V store kernel, both ways: contiguous positions per sequence
    (rope_store_) and packed tokens to flat slots, padding (dst < 0) not stored (rope_scatter_).
    Rotated q comes back in qkv; rotated k only goes to the cache (the torch path also rotates
    qkv's k columns in place, which nothing reads), so the q columns and the cache are compared."""
    hq, hk, d, b, cap, n = 4, 2, 16, 2, 12, 3
    cos, sin = rope_tables(64, d, 10000.0, torch.device("cpu"))
    qkv = torch.randn(b * n, (hq + 2 * hk) * d)
    pos = torch.randint(0, 64, (b * n,))
    outs = []
    for tri in (True, False):
        x, kv = qkv.clone(), torch.zeros(2, b, cap, hk, d)
        rope_store_(x, hq, hk, pos, cos, sin, kv, 5, use_triton=tri)
        outs.append((x, kv))
    torch.testing.assert_close(outs[0][0][:, : hq * d], outs[1][0][:, : hq * d])
    torch.testing.assert_close(outs[0][1], outs[1][1])
    assert outs[0][1][:, :, 5:8].abs().sum() > 0 and outs[0][1][:, :, :5].abs().sum() == 0
    dst = torch.tensor([0 * cap + 7, 1 * cap + 4, -1, 1 * cap + 5, 0 * cap + 8, -1])
    outs = []
    for tri in (True, False):
        x, kv = qkv.clone(), torch.zeros(2, b, cap, hk, d)
        rope_scatter_(x, hq, hk, pos, dst, cos, sin, kv, use_triton=tri)
        outs.append((x, kv))
    torch.testing.assert_close(outs[0][0][:, : hq * d], outs[1][0][:, : hq * d])
    torch.testing.assert_close(outs[0][1], outs[1][1])
    stored = outs[0][1].view(2, b * cap, hk, d).abs().sum((0, 2, 3)) > 0
    assert stored.nonzero().flatten().tolist() == sorted(int(s) for s in dst if s >= 0)


def test_splitk_linear_matches_matmul() -> None:
    for m, n, k, s in ((1, 40, 300, 1), (5, 64, 512, 4), (17, 70, 256, 2)):
        x, w = torch.randn(m, k), torch.randn(n, k)
        assert torch.allclose(splitk_linear(x, w, s), x @ w.T, atol=1e-3)


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
    for _ in range(3):
        r.draft()
        r.build()
        for b in range(r.batch):
            pool = DraftTree.from_parents(
                np.r_[-1, r.pool_parent[b].numpy() + 1],
                tokens=np.r_[r.root_token[b].item(), r.pool_token[b].numpy()],
                logprobs=np.r_[0.0, _edge_logprobs(r, b)],
                source=np.r_[0, np.full(r.pool_token.shape[1], SOURCE_MODEL)],
            )
            keep = select_dynamic(pool, policy.depth, policy.topk, policy.budget)
            ref = pool.subtree(keep)
            assert ref.num_nodes == r.nodes
            np.testing.assert_array_equal(ref.parents, r.tree.parents[b].numpy())
            np.testing.assert_array_equal(ref.tokens, r.tree.tokens[b].numpy())
            np.testing.assert_array_equal(ref.depth, r.tree.depth[b].numpy())
            np.testing.assert_array_equal(ref.ancestor_matrix, r.tree.mask[b].numpy())


def _edge_logprobs(r: SpecRunner, b: int) -> np.ndarray:
    """Per-entry draft log-prob (score minus the parent's score)."""
    score = r.pool_score[b].double().numpy()
    par = r.pool_parent[b].numpy()
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
    assert (r.path[:, 0] == 0).all()
    # accepted path is a root path: each entry is the parent of the next
    for b in range(r.batch):
        n = int(r.num_acc[b])
        for j in range(1, n + 1):
            assert r.tree.parents[b, r.path[b, j]] == r.path[b, j - 1]
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
        assert (r.layout is not None) == kern
        torch.manual_seed(6)
        for _ in range(2):
            for f in (r.draft, r.build, r.verify, r.accept, r.compact, r.extend):
                f()
        outs.append((r.tree.tokens.clone(), r.path.clone(), r.tcache.kv.clone(), r.num_acc.clone()))
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


def test_graft_is_rejected_clearly_and_prune_is_run() -> None:
    with pytest.raises(SpecError, match="cannot graft"):
        _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6, 0.0, 4))
    assert _runner(policy=TreePolicy("dynamic-topk", 3, 2, 6, 0.1, 0)).ragged is not None


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


def test_fused_tree_merge_kernel_matches_reference() -> None:
    """The Triton tree-part + log-sum-exp merge kernel (interpreter) against one softmax."""
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(4)
    for b, n, h, kvh, c, s in ((2, 5, 4, 2, 30, 5), (1, 3, 8, 2, 0, 7), (2, 9, 4, 2, 40, 12)):
        q = torch.randn(b, n, h, 16, generator=g)
        kp, vp = torch.randn(b, kvh, c, 16, generator=g), torch.randn(b, kvh, c, 16, generator=g)
        kn, vn = torch.randn(b, kvh, s, 16, generator=g), torch.randn(b, kvh, s, 16, generator=g)
        mask = torch.rand(b, n, s, generator=g) < 0.6
        mask[:, :, 0] = True
        pre = (kp, vp) if c else (None, None)
        out = tree_attention(q, *pre, kn, vn, mask, use_triton=True)
        assert torch.allclose(out, reference_tree_attention(q, *pre, kn, vn, mask), atol=1e-5)


def test_split_prefix_path_matches_reference() -> None:
    """Few query rows over a long prefix: flash-decoding splits merged with the tree part."""
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(5)
    for b, n, h, kvh, c, s in ((2, 5, 4, 2, 700, 5), (3, 1, 4, 1, 1000, 1)):
        q = torch.randn(b, n, h, 16, generator=g)
        kp, vp = torch.randn(b, kvh, c, 16, generator=g), torch.randn(b, kvh, c, 16, generator=g)
        kn, vn = torch.randn(b, kvh, s, 16, generator=g), torch.randn(b, kvh, s, 16, generator=g)
        mask = torch.ones(b, n, s, dtype=torch.bool)
        out = tree_attention(q, kp, vp, kn, vn, mask, use_triton=True)
        assert torch.allclose(out, reference_tree_attention(q, kp, vp, kn, vn, mask), atol=1e-5)
