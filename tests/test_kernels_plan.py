"""Tree attention planned once per shape and run per step: the dense plan and the ragged (packed,
per token bucket) plan against the torch reference, and the planned launch equal to the
wrapper's own per-call choice (interpreter on CPU)."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.executor.tree_build import ancestor_mask  # noqa: E402
from spectune.kernels import (  # noqa: E402
    HeadShape,
    RaggedTreePlan,
    TreeAttentionConfig,
    TreeAttentionPlan,
    mask_words,
    plan_launch,
    reference_tree_attention,
    token_bucket,
)
from spectune.kernels.layout import unpack_mask_row, word_bits  # noqa: E402
from spectune.kernels.ragged_plan import TOKEN_BUCKET  # noqa: E402
from spectune.kernels.tree_attention_plan import _TUNED, tuned_launch  # noqa: E402

HEADS = HeadShape(q_heads=4, kv_heads=2, head_dim=16, dtype=torch.float32)
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def _random_parents(g: torch.Generator, b: int, n: int) -> torch.Tensor:
    """int64[B, N] random trees (parents precede children), root -1."""
    par = torch.full((b, n), -1, dtype=torch.int64)
    for i in range(1, n):
        par[:, i] = torch.randint(0, i, (b,), generator=g)
    return par


def _cache(b: int, cap: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn((2, b, cap, HEADS.kv_heads, HEADS.head_dim), generator=g)


def test_mask_words_equal_the_bits() -> None:
    """mask_words sets bit j of word j // 64 exactly where the bool row is set (bit 63 too)."""
    g = torch.Generator().manual_seed(1)
    rows = torch.rand((5, 130), generator=g) < 0.5
    rows[:, 63] = True
    words = mask_words(rows, word_bits(3, CPU))
    for r in range(5):
        got = unpack_mask_row(words[r].numpy(), 130)
        np.testing.assert_array_equal(got, rows[r].numpy())


def test_dense_plan_matches_reference() -> None:
    """B x N trees over `context` cached tokens in a [B, capacity] cache: run == reference on the
    flat layout the plan describes, for two masks through the same plan (one plan, many steps)."""
    b, n, c, cap = 3, 9, 40, 64
    plan = TreeAttentionPlan(b, n, c, cap, HEADS, CPU)
    kv = _cache(b, cap, 2)
    g = torch.Generator().manual_seed(3)
    for _ in range(2):
        mask = ancestor_mask(_random_parents(g, b, n), n)
        plan.set_mask(mask)
        q = torch.randn((b, n, HEADS.q_heads, HEADS.head_dim), generator=g)
        out = plan.run(q, kv)
        ref = reference_tree_attention(
            q.reshape(b * n, HEADS.q_heads, HEADS.head_dim),
            kv[0].reshape(b * cap, HEADS.kv_heads, HEADS.head_dim),
            kv[1].reshape(b * cap, HEADS.kv_heads, HEADS.head_dim),
            plan.qo_indptr,
            plan.kv_indptr,
            plan.bitmask,
            plan.kv_lens,
        ).view(b, n, HEADS.q_heads, HEADS.head_dim)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_planned_launch_is_the_wrappers_choice() -> None:
    """The plan's launch equals what the wrapper would choose per call for the same shape, and
    an explicit or tuned config is kept."""
    b, n, c = 2, 16, 300
    plan = TreeAttentionPlan(b, n, c, 400, HEADS, CPU)
    per_call = plan_launch(
        batch=b, q_heads=4, kv_heads=2, head_dim=16, elem_bytes=4, total_q=b * n,
        max_q_len=n, max_kv_len=c + n, device=CPU,
    )  # fmt: skip
    assert plan.launch == per_call
    cfg = TreeAttentionConfig(block_m=16, block_n=16, tree_block=16, min_chunk=16)
    assert TreeAttentionPlan(b, n, c, 400, HEADS, CPU, config=cfg).launch.config == cfg
    key = (b, n, c)
    assert tuned_launch(*key) == (None, None)
    _TUNED[key] = (cfg, 3)
    try:
        tuned = TreeAttentionPlan(b, n, c, 400, HEADS, CPU).launch
        assert tuned.config == cfg and tuned.prefix_splits == 3
    finally:
        del _TUNED[key]


def test_tuner_rotates_layers_and_keeps_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """tune_tree_attention tries the shape's default first, calls the attention over distinct
    layers of a whole cache in each timed replay (TUNE_BYTES / TUNE_CALLS bound how many), times
    per call, and records the fastest candidate's (config, splits)."""
    from spectune.kernels import tree_attention_plan as tap

    layers, b, cap, n, c = 5, 1, 80, 4, 64
    kv = torch.zeros((layers, 2, b, cap, HEADS.kv_heads, HEADS.head_dim))
    seen: list[list[int]] = []
    labels: list[TreeAttentionConfig] = []

    def run(self: TreeAttentionPlan, q: torch.Tensor, layer: torch.Tensor) -> None:
        seen[-1].append(layer.data_ptr())

    def timed(fn: object, device: torch.device, reps: int = 20) -> float:
        seen.append([])
        fn()  # type: ignore[operator]
        cfg = labels[-1] if labels else None
        # synthetic seconds per replay: the 16 x 128 tile (a candidate, not the default) wins
        fast = cfg is not None and (cfg.block_m, cfg.block_n) == (16, 128)
        return (1.0 if fast else 2.0) * len(seen[-1])

    real_init = TreeAttentionPlan.__init__

    def init(self: TreeAttentionPlan, *a: object, **kw: object) -> None:
        real_init(self, *a, **kw)  # type: ignore[arg-type]
        labels.append(self.launch.config)

    monkeypatch.setattr(tap, "graph_time", timed)
    monkeypatch.setattr(TreeAttentionPlan, "run", run)
    monkeypatch.setattr(TreeAttentionPlan, "__init__", init)
    monkeypatch.setattr(tap, "TUNE_CALLS", 3)
    key = (b, n, c)
    try:
        rows = tap.tune_tree_attention(b, n, c, kv, HEADS.q_heads)
        assert rows[0]["config"] == ["default"]
        assert len(rows) > 1 and all(r["calls"] == 3 for r in rows)
        # each replay: 3 calls over 3 distinct layers, per-call seconds reported
        assert all(len(set(ptrs)) == 3 for ptrs in seen)
        assert {r["seconds"] for r in rows} == {1.0, 2.0}
        cfg, splits = tuned_launch(*key)
        assert cfg is not None and (cfg.block_m, cfg.block_n) == (16, 128)
        assert splits is None
        assert tap.tune_tree_attention(b, n, c, kv, HEADS.q_heads) == []  # tuned once
        # one layer's cache: one call per replay
        seen.clear()
        del _TUNED[key]
        rows = tap.tune_tree_attention(b, n, c, kv[0], HEADS.q_heads)
        assert all(r["calls"] == 1 for r in rows) and all(len(p) == 1 for p in seen)
    finally:
        _TUNED.pop(key, None)


def test_token_bucket() -> None:
    assert token_bucket(1, 64) == TOKEN_BUCKET
    assert token_bucket(16, 64) == 16
    assert token_bucket(17, 64) == 32
    assert token_bucket(63, 48) == 48
    assert token_bucket(690, 696) == 696  # the top bucket is B x N itself (8 x 87)
    assert token_bucket(680, 696) == 688


def test_ragged_plan_packs_kept_nodes_and_matches_reference() -> None:
    """Pruned trees (counts[b] kept nodes first in each row) packed into T rows: offsets,
    positions, slots and the [B, N] destinations; a bucket's run equals the reference over the
    real sequences, and the padding rows (a scratch sequence) output zeros."""
    b, n, c, cap = 3, 10, 20, 40
    g = torch.Generator().manual_seed(5)
    lay = RaggedTreePlan(b, n, c, cap, HEADS, CPU)
    parents = _random_parents(g, b, n)
    mask = ancestor_mask(parents, n)
    depth = mask.sum(-1) - 1
    tokens = torch.randint(0, 100, (b, n), generator=g)
    counts = torch.tensor([4, 10, 1])
    lay.set_trees(tokens, depth, mask, counts)
    total = int(counts.sum())
    assert int(lay.total) == total and lay.qo.tolist() == [0, 4, 14, 15]
    assert lay.kv_lens.tolist() == (c + counts).tolist()
    rows = [(s, i) for s in range(b) for i in range(int(counts[s]))]
    for r, (s, i) in enumerate(rows):
        assert int(lay.tokens[r]) == int(tokens[s, i])
        assert int(lay.pos[r]) == c + int(depth[s, i])
        assert int(lay.dst[r]) == s * cap + c + i
        assert int(lay.dest[r]) == s * n + i
    # padding rows up to B x N (the sink row after them is never read)
    assert (lay.dst[total:] == -1).all() and (lay.dest[total : b * n] == b * n).all()
    t_b = lay.bucket(total)
    assert t_b == 16 and t_b > total
    bucket = lay.bucket_plan(t_b)
    assert lay.bucket_plan(t_b) is bucket  # planned once per bucket
    bucket.prepare()
    assert bucket.qo.tolist() == [0, 4, 14, 15, 16] and bucket.kv_lens.tolist() == [24, 30, 21, 1]
    kv = _cache(b, cap, 6)
    q = torch.randn((1, t_b, HEADS.q_heads, HEADS.head_dim), generator=g)
    out = bucket.run(q, kv)[0]
    ref = reference_tree_attention(
        q[0, :total],
        kv[0].reshape(b * cap, HEADS.kv_heads, HEADS.head_dim),
        kv[1].reshape(b * cap, HEADS.kv_heads, HEADS.head_dim),
        lay.qo,
        torch.arange(b + 1, dtype=torch.int32) * cap,
        lay.bitmask[:total],
        lay.kv_lens,
    )
    torch.testing.assert_close(out[:total], ref, atol=1e-5, rtol=1e-5)
    assert (out[total:] == 0).all()


@pytest.mark.gpu
def test_gpu_plans_replay_in_cuda_graphs() -> None:
    """Dense plan and a ragged bucket at Llama-3.1-8B's heads, bf16: a CUDA-graph replay after a
    new mask / new trees equals the eager call, within bf16 of the float32 reference."""
    dev = torch.device("cuda")
    heads = HeadShape(32, 8, 128, torch.bfloat16)
    b, n, c, cap = 4, 24, 1000, 1100
    g = torch.Generator().manual_seed(7)
    kv = torch.randn((2, b, cap, 8, 128), device=dev).to(torch.bfloat16)
    q = torch.randn((b, n, 32, 128), device=dev).to(torch.bfloat16)
    plan = TreeAttentionPlan(b, n, c, cap, heads, dev)
    plan.set_mask(ancestor_mask(_random_parents(g, b, n), n).to(dev))
    out = torch.empty_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        out.copy_(plan.run(q, kv))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(plan.run(q, kv))
    plan.set_mask(ancestor_mask(_random_parents(g, b, n), n).to(dev))  # the next step's trees
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, plan.run(q, kv))
    ref = reference_tree_attention(
        q.reshape(b * n, 32, 128).float(),
        kv[0].reshape(b * cap, 8, 128).float(),
        kv[1].reshape(b * cap, 8, 128).float(),
        plan.qo_indptr,
        plan.kv_indptr,
        plan.bitmask,
        plan.kv_lens,
    )
    err = float((out.reshape(b * n, 32, 128).float() - ref).norm() / ref.norm())
    assert err < 1e-2
    lay = RaggedTreePlan(b, n, c, cap, heads, dev)
    parents = _random_parents(g, b, n).to(dev)
    mask = ancestor_mask(parents, n)
    tokens = torch.zeros((b, n), dtype=torch.int64, device=dev)
    lay.set_trees(tokens, mask.sum(-1) - 1, mask, torch.tensor([3, 24, 1, 10], device=dev))
    bucket = lay.bucket_plan(lay.bucket(38))
    qr = torch.randn((1, bucket.tokens, 32, 128), device=dev).to(torch.bfloat16)
    bucket.prepare()
    eager = bucket.run(qr, kv)
    got = torch.empty_like(eager)
    with torch.cuda.stream(side):
        bucket.prepare()
        got.copy_(bucket.run(qr, kv))
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bucket.prepare()
        got.copy_(bucket.run(qr, kv))
    got.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(got, eager)
    assert (got[0, 38:] == 0).all()  # padding rows read nothing
