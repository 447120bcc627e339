"""MoE decoder (executor/moe.py) on CPU at small shapes: the fused-kernel path (Triton
interpreter) equals the torch path, chains equal token-by-token, the FFN equals the expert loop,
and the roofline counts worked by hand. GPU: a Qwen3-30B-A3B-shaped slice in a CUDA graph."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.executor.model import Decoder  # noqa: E402
from spectune.executor.moe import (  # noqa: E402
    AliasedKVCache,
    MoEDecoder,
    MoELayerWeights,
    moe_ffn_roofline,
    moe_floor_bytes,
    moe_rows,
    moe_weight_shapes,
)
from spectune.kernels.fused_moe import (  # noqa: E402
    moe_combine,
    reference_moe,
    reference_route_topk,
    route_topk,
)
from spectune.kernels.gemm import linear  # noqa: E402
from spectune.specs import ModelSpec, SpecError, model_preset  # noqa: E402

TINY = ModelSpec(
    name="tiny-moe",
    layers=2,
    hidden=64,
    heads=4,
    kv_heads=2,
    head_dim=16,
    ffn=0,
    vocab=300,
    experts=8,
    experts_topk=2,
    expert_ffn=32,
)
TINY_DENSE_FIRST = dataclasses.replace(TINY, name="tiny-moe-d", layers=3, dense_layers=1, ffn=96)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def _inputs(b: int, n: int, c: int, vocab: int) -> tuple[torch.Tensor, ...]:
    tok = torch.randint(0, vocab, (b, n))
    pos = c + torch.arange(n).expand(b, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(b, n, n)
    return tok, pos, causal


def test_specs_are_checked() -> None:
    with pytest.raises(SpecError, match="dense decoders only"):
        Decoder(TINY, "cpu", torch.float32)
    with pytest.raises(SpecError, match="MoE"):
        MoEDecoder(model_preset("llama-3.2-1b"), "cpu", torch.float32)
    with pytest.raises(SpecError, match="shared experts"):
        MoEDecoder(dataclasses.replace(TINY, shared_experts=1), "cpu", torch.float32)


def test_layer_weights_have_the_expert_shapes() -> None:
    m = MoEDecoder(TINY_DENSE_FIRST, "cpu", torch.float32, max_pos=256)
    assert not isinstance(m.layers[0], MoELayerWeights)
    w = m.layers[1]
    assert isinstance(w, MoELayerWeights)
    assert w.w_gate_up.shape == (8, 64, 64)
    assert w.w_down.shape == (8, 64, 32)
    assert w.router.shape == (8, 64)


@pytest.mark.parametrize("spec", [TINY, TINY_DENSE_FIRST])
def test_kernel_path_equals_torch_path(spec: ModelSpec) -> None:
    """The fused MoE kernels (interpreter) and the expert loop give the same forward."""
    outs = []
    for tri in (False, True):
        m = MoEDecoder(spec, "cpu", torch.float32, seed=1, max_pos=256, use_triton=tri)
        cache = m.new_cache(2, 64)
        torch.manual_seed(3)
        cache.kv.uniform_(-1, 1)
        tok, pos, mask = _inputs(2, 5, 20, spec.vocab)
        h, cap = m.forward(tok, pos, cache, 20, mask, capture=(0,))
        outs.append((h, cap[0], cache.kv.clone()))
    torch.testing.assert_close(outs[0][0], outs[1][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outs[0][1], outs[1][1], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(outs[0][2], outs[1][2], atol=1e-5, rtol=1e-5)


def test_chain_forward_equals_token_by_token() -> None:
    m = MoEDecoder(TINY, "cpu", torch.float32, max_pos=256)
    b, n, c = 2, 5, 20
    a, z = m.new_cache(b, 64), m.new_cache(b, 64)
    z.kv.copy_(a.kv)
    tok, pos, causal = _inputs(b, n, c, TINY.vocab)
    full, _ = m.forward(tok, pos, a, c, causal)
    for i in range(n):
        one, _ = m.forward(tok[:, : i + 1], pos[:, : i + 1], z, c, causal[:, : i + 1, : i + 1])
        assert torch.allclose(one[:, i], full[:, i], atol=1e-4)
    assert m.lm_head(full).shape == (b, n, TINY.vocab)


@pytest.mark.parametrize("tri", [False, True])
def test_ffn_equals_expert_loop(tri: bool) -> None:
    m = MoEDecoder(TINY, "cpu", torch.float32, seed=2, use_triton=tri, max_pos=64)
    w = m.layers[0]
    assert isinstance(w, MoELayerWeights)
    x = torch.randn(33, 64)
    rows = moe_rows(x, w, TINY, use_triton=tri)
    assert rows.shape == (33, 2, 64)
    ids, weights = reference_route_topk(linear(x, w.router), 2)
    want = reference_moe(x, w.w_gate_up, w.w_down, ids, weights)
    got = moe_combine(rows, use_triton=tri)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_independent_routing_spreads_tokens_over_experts() -> None:
    """Identical hidden states all route alike ("hidden"); "independent" routing draws fresh
    logits per token, so the same rows touch many experts (the cost model's expert union)."""
    w = MoEDecoder(TINY, "cpu", torch.float32, seed=4, use_triton=False, max_pos=64).layers[0]
    assert isinstance(w, MoELayerWeights)
    x = torch.randn(1, 64).expand(64, 64).contiguous()
    ids_hidden, _ = route_topk(linear(x, w.router), 2, use_triton=False)
    assert torch.unique(ids_hidden).numel() == 2
    torch.manual_seed(1)
    rows = moe_rows(x, w, TINY, use_triton=False, routing="independent")
    assert rows.shape == (64, 2, 64) and torch.isfinite(rows).all()
    assert len({tuple(r.flatten().tolist()[:3]) for r in rows.unbind(0)}) > 8
    with pytest.raises(SpecError, match="routing"):
        MoEDecoder(TINY, "cpu", torch.float32, routing="skewed")


def test_aliased_cache_shares_layers() -> None:
    m = MoEDecoder(TINY_DENSE_FIRST, "cpu", torch.float32, max_pos=256)
    cache = m.new_cache(2, 64, kv_layers=2)
    assert isinstance(cache, AliasedKVCache) and cache.kv.shape[0] == 2
    assert cache.layer(2, 2).data_ptr() == cache.layer(0, 2).data_ptr()
    assert cache.layer(1, 1).data_ptr() != cache.layer(0, 1).data_ptr()
    tok, pos, mask = _inputs(2, 3, 10, TINY.vocab)
    h, _ = m.forward(tok, pos, cache, 10, mask)
    assert h.shape == (2, 3, 64) and torch.isfinite(h).all()
    assert not isinstance(m.new_cache(2, 64, kv_layers=3), AliasedKVCache)


def test_roofline_by_hand() -> None:
    spec = model_preset("qwen3-30b-a3b")
    one = moe_ffn_roofline(spec, 1)
    # one token, top-8: exactly 8 experts x 3 x 2048 x 768 bf16, + router 128 x 2048 bf16
    assert one["experts"] == pytest.approx(8.0)
    assert one["weight_bytes"] == pytest.approx(8 * 3 * 2048 * 768 * 2 + 128 * 2048 * 2)
    assert one["act_bytes"] == pytest.approx(8 * (2 * 2048 + 3 * 768) * 2)
    assert one["flops"] == pytest.approx(2 * 8 * 3 * 2048 * 768 + 2 * 2048 * 128)
    many = moe_ffn_roofline(spec, 4096)
    assert many["experts"] == pytest.approx(128.0)
    assert many["weight_bytes"] == pytest.approx(128 * 3 * 2048 * 768 * 2 + 128 * 2048 * 2)
    # every expert touched: the floor is all weights but the embedding table, plus the KV read
    floor = moe_floor_bytes(spec, 64, 64, 4096)
    want = spec.weight_bytes() - spec.vocab * 2048 * 2 + 64 * 4096 * 48 * 2 * 4 * 128 * 2
    assert floor == pytest.approx(want, rel=1e-9)
    assert 60e9 < spec.weight_bytes() < 62e9
    assert (128, 2048) in moe_weight_shapes(spec) and (2 * 6144, 2048) not in moe_weight_shapes(
        spec
    )


# ---- GPU ---------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_gpu_qwen3_slice_in_a_cuda_graph() -> None:
    """Two layers at Qwen3-30B-A3B's shape: graph replay equals the eager forward, and the bf16
    MoE FFN equals the fp32 expert loop (rel err < 1e-2)."""
    spec = dataclasses.replace(model_preset("qwen3-30b-a3b"), layers=2)
    m = MoEDecoder(spec, "cuda", max_pos=1024)
    b, n, c = 4, 16, 256
    cache = m.new_cache(b, c + n + 8)
    dev = torch.device("cuda")
    tok = torch.randint(0, spec.vocab, (b, n), device=dev)
    pos = c + torch.arange(n, device=dev).expand(b, n)
    mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril().expand(b, n, n).contiguous()
    eager, _ = m.forward(tok, pos, cache, c, mask)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        m.forward(tok, pos, cache, c, mask)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out, _ = m.forward(tok, pos, cache, c, mask)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager, atol=2e-2, rtol=2e-2)
    w = m.layers[0]
    assert isinstance(w, MoELayerWeights)
    x = torch.randn((b * n, spec.hidden), device=dev).to(torch.bfloat16)
    ids, weights = route_topk(linear(x, w.router), spec.experts_topk)  # bf16 logits can tie
    want = reference_moe(x, w.w_gate_up, w.w_down, ids, weights)
    got = moe_combine(moe_rows(x, w, spec)).float()
    assert float((got - want).abs().max() / want.abs().max()) < 1e-2


def test_session_runs_speculation_with_an_moe_target() -> None:
    """`spectune execute` on an MoE target: the session builds the MoE decoder (independent
    routing) and a speculative run completes with tokens accepted."""
    from spectune.executor.session import Session, SessionConfig
    from spectune.planner.acceptance import acceptance_model
    from spectune.specs import TreePolicy

    draft = ModelSpec(
        name="tiny-draft", layers=1, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=300
    )
    cfg = SessionConfig(2, 32, 16, use_graphs=False, use_kernels=False, autotune_gemm=False)
    session = Session(TINY, draft, cfg, "cpu")
    assert isinstance(session.target, MoEDecoder) and session.target.routing == "independent"
    (res,) = session.run_spec(
        2, 32, TreePolicy("dynamic-topk", 3, 2, 6), acceptance_model("mt-bench"), 3, 1
    )
    assert res.tokens_per_step >= 1.0
