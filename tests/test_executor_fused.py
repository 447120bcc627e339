"""The executor's fused decoder layer (four fused GEMMs around attention) against the unfused
layer on CPU, with the fused GEMMs under the Triton interpreter."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.executor.model import Decoder  # noqa: E402
from spectune.kernels.gemm_fused import FusedLinearConfig, LayerGemmPlan  # noqa: E402
from spectune.specs import ModelSpec  # noqa: E402

TARGET = ModelSpec(
    name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=300
)
PLANS = (
    LayerGemmPlan(pdl=False, **dict.fromkeys(("qkv", "o", "gate_up", "down"), FusedLinearConfig(1, 32, 32, 4, 2))),
    LayerGemmPlan(
        qkv=FusedLinearConfig(2, 32, 32, 4, 2),
        o=FusedLinearConfig(3, 16, 16, 4, 2),
        gate_up=FusedLinearConfig(2, 16, 32, 4, 2),
        down=FusedLinearConfig(4, 32, 16, 4, 2),
    ),
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


@pytest.mark.parametrize("plan", PLANS, ids=("unsplit", "split"))
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
