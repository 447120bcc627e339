"""The executor's fused decoder layer (four fused GEMMs around attention) against the unfused
layer on CPU, with the fused GEMMs under the Triton interpreter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.executor.model import Decoder  # noqa: E402
from spectune.kernels.gemm_fused_config import FusedLinearConfig, LayerGemmPlan  # noqa: E402
from spectune.specs import ModelSpec  # noqa: E402

TARGET = ModelSpec(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=300
)
PLANS = (
    LayerGemmPlan(
        pdl=False,
        **dict.fromkeys(("qkv", "o", "gate_up", "down"), FusedLinearConfig(1, 32, 32, 4, 2)),
    ),
    LayerGemmPlan(
        qkv=FusedLinearConfig(2, 32, 32, 4, 2),
        o=FusedLinearConfig(3, 16, 16, 4, 2),
        gate_up=FusedLinearConfig(2, 16, 32, 4, 2),
        down=FusedLinearConfig(4, 32, 16, 4, 2),
    ),
    LayerGemmPlan(  # RoPE + K/V store in the q|k|v epilogue (head dim 16: tiles of 8)
        qkv=FusedLinearConfig(3, 8, 16, 4, 2),
        o=FusedLinearConfig(1, 16, 16, 4, 2),
        gate_up=FusedLinearConfig(1, 16, 32, 4, 2),
        down=FusedLinearConfig(2, 32, 16, 4, 2),
        rope_in_qkv=True,
    ),
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


@pytest.mark.parametrize("plan", PLANS, ids=("unsplit", "split", "rope"))
def test_fused_forward_equals_unfused(plan: LayerGemmPlan) -> None:
    """Same weights, cache and tokens: the fused layers give the unfused final hidden, the same
    captured residual streams, and write the same K/V into the cache."""
    m = Decoder(TARGET, "cpu", torch.float32, max_pos=512)
    for w in m.layers:  # norm weights away from 1, so a misplaced norm shows
        w.norm_attn.uniform_(0.5, 1.5)
        w.norm_mlp.uniform_(0.5, 1.5)
    m.norm_final.uniform_(0.5, 1.5)
    b, n, c = 2, 5, 20
    a, z = m.new_cache(b, 64), m.new_cache(b, 64)
    z.kv.copy_(a.kv)
    tok = torch.randint(0, TARGET.vocab, (b, n))
    pos = c + torch.arange(n).expand(b, n)
    causal = torch.ones(n, n, dtype=torch.bool).tril().expand(b, n, n)
    want, want_cap = m.forward(tok, pos, a, c, causal, capture=(0, 1))
    m.fused = plan
    got, got_cap = m.forward(tok, pos, z, c, causal, capture=(0, 1))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for g, w in zip(got_cap, want_cap, strict=True):
        torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(z.kv, a.kv, atol=1e-5, rtol=1e-5)


def test_fused_plan_applies_only_to_dense_single_gpu_layers() -> None:
    m = Decoder(TARGET, "cpu", torch.float32, max_pos=64)
    assert m._fused_plan() is None
    m.fused = LayerGemmPlan()
    assert m._fused_plan() is m.fused
    m.layers[1].reduce = lambda t: t  # a tensor-parallel layer: the unfused path
    assert m._fused_plan() is None


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_gpu_fused_forward_in_a_graph_equals_unfused(pdl: bool) -> None:
    """bf16 on the GPU, replayed from a CUDA graph (split-K tickets and programmatic launches
    inside the capture): the fused forward gives the unfused one's hidden and argmax."""
    from spectune.kernels.tree_attention_plan import TreeAttentionPlan

    dev = torch.device("cuda")
    spec = ModelSpec(
        name="small", layers=3, hidden=512, heads=8, kv_heads=2, head_dim=64, ffn=1024, vocab=1000
    )
    m = Decoder(spec, dev, torch.bfloat16, max_pos=2048)
    n, c = 64, 1000
    cache = m.new_cache(1, c + n + 8)
    tok = torch.randint(0, spec.vocab, (1, n), device=dev)
    pos = c + torch.arange(n, device=dev)[None]
    mask = torch.ones((n, n), dtype=torch.bool, device=dev).tril()[None]
    plan = TreeAttentionPlan(1, n, c, cache.capacity, m.heads, dev)
    plan.set_mask(mask)
    want, _ = m.forward(tok, pos, cache, c, mask, plan=plan)
    m.fused = LayerGemmPlan(
        FusedLinearConfig(4, evict_first=pdl),
        FusedLinearConfig(3, 32, prefetch_k=4096 if pdl else 0),  # o: prefetched during attention
        FusedLinearConfig(2, prefetch_k=256 if pdl else 0),
        FusedLinearConfig(8),
        pdl=pdl,
        rope_in_qkv=pdl,
    )
    out = torch.zeros_like(want)

    def fwd() -> None:
        h, _ = m.forward(tok, pos, cache, c, mask, plan=plan)
        out.copy_(h)

    fwd()  # outside the capture: Triton compiles, the ticket buffer is allocated
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fwd()
    out.zero_()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    err = float((out.float() - want.float()).norm() / want.float().norm())
    assert err < 2e-2, err
    from spectune.kernels.gemm_fused import _tickets

    assert int(_tickets(out.device, 1).abs().sum()) == 0  # every replay left its counters at 0
