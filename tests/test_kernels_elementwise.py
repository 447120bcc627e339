"""Fused elementwise kernels (add + RMSNorm, silu * up) and RoPE (alone, fused with the K/V store,
scattered to packed slots): the Triton kernels (interpreter on CPU) against the torch references."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels import (  # noqa: E402
    add_rmsnorm,
    make_elementwise_inputs,
    make_rope_inputs,
    reference_add_rmsnorm,
    reference_rope_,
    reference_silu_mul,
    rope_,
    rope_scatter_,
    rope_store_,
    rope_tables,
    silu_mul,
)
from tests.conftest import HAS_CUDA  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


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


@pytest.mark.parametrize("tokens, hidden, ffn", [(1, 64, 96), (7, 96, 200), (3, 4096, 1024)])
def test_elementwise_inputs_match_references(tokens: int, hidden: int, ffn: int) -> None:
    """Seeded inputs at several widths (one program per row, a block past the width masked):
    with and without a residual, whose in-place update must match too."""
    inp = make_elementwise_inputs(tokens, hidden, ffn, seed=tokens)
    res_k, res_r = inp.residual.clone(), inp.residual.clone()
    out = add_rmsnorm(inp.x, res_k, inp.weight, use_triton=True)
    ref = reference_add_rmsnorm(inp.x, res_r, inp.weight, 1e-5)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(res_k, res_r)
    torch.testing.assert_close(
        add_rmsnorm(inp.x, None, inp.weight, use_triton=True),
        reference_add_rmsnorm(inp.x, None, inp.weight, 1e-5),
        atol=1e-5,
        rtol=1e-5,
    )
    torch.testing.assert_close(
        silu_mul(inp.gate_up, use_triton=True), reference_silu_mul(inp.gate_up)
    )


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


@settings(max_examples=25, deadline=None)
@given(
    hq=st.integers(1, 24),
    group=st.sampled_from([1, 2, 4, 8]),
    d=st.sampled_from([8, 16]),
    b=st.integers(1, 3),
    n=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_rope_store_head_blocks_match_torch(
    hq: int, group: int, d: int, b: int, n: int, seed: int
) -> None:
    """Rows of any head count, split into blocks of at most HEADS_PER_PROGRAM heads (the last
    one partly masked, q / k / v boundaries anywhere inside a block): both rope_store_ and
    rope_scatter_ write exactly what the torch path writes, and nothing past the row's heads."""
    hk = max(1, hq // group)
    inp = make_rope_inputs(b, n, hq, hk, d, n + 3, seed=seed)
    for scatter in (False, True):
        outs = []
        for tri in (True, False):
            x, kv = inp.qkv.clone(), inp.kv.clone()
            if scatter:
                rope_scatter_(x, hq, hk, inp.pos, inp.dst, inp.cos, inp.sin, kv, use_triton=tri)
            else:
                rope_store_(x, hq, hk, inp.pos, inp.cos, inp.sin, kv, 2, use_triton=tri)
            outs.append((x, kv))
        torch.testing.assert_close(outs[0][0][:, : hq * d], outs[1][0][:, : hq * d])
        # the kernel leaves the k and v columns of qkv as they were
        torch.testing.assert_close(outs[0][0][:, (hq + hk) * d :], inp.qkv[:, (hq + hk) * d :])
        torch.testing.assert_close(outs[0][1], outs[1][1])


def test_rope_inputs_scatter_matches_torch() -> None:
    """Seeded RoPE inputs: the scatter stores exactly the rows with a slot, both paths agree."""
    inp = make_rope_inputs(3, 5, 4, 2, 16, 12, seed=2)
    outs = []
    for tri in (True, False):
        x, kv = inp.qkv.clone(), inp.kv.clone()
        rope_scatter_(x, inp.hq, inp.hk, inp.pos, inp.dst, inp.cos, inp.sin, kv, use_triton=tri)
        outs.append((x[:, : inp.hq * 16], kv))
    torch.testing.assert_close(outs[0][0], outs[1][0])
    torch.testing.assert_close(outs[0][1], outs[1][1])
    stored = outs[0][1].view(2, 3 * 12, 2, 16).abs().sum((0, 2, 3)) > 0
    assert stored.nonzero().flatten().tolist() == sorted(int(s) for s in inp.dst if s >= 0)


def test_rejects_malformed_inputs() -> None:
    x, w = torch.randn(4, 32), torch.ones(32)
    with pytest.raises(ValueError, match="contiguous"):
        add_rmsnorm(torch.randn(32, 4).t(), None, w, use_triton=True)
    with pytest.raises(ValueError, match="residual"):
        add_rmsnorm(x, torch.randn(3, 32), w, use_triton=True)
    with pytest.raises(ValueError, match="weight"):
        add_rmsnorm(x, None, torch.ones(31), use_triton=True)
    with pytest.raises(ValueError, match="gate_up"):
        silu_mul(torch.randn(64, 6).t(), use_triton=True)
    cos, sin = rope_tables(8, 16, 10000.0, torch.device("cpu"))
    with pytest.raises(ValueError, match="pos"):
        rope_(torch.randn(4, 48), 3, torch.zeros(3, dtype=torch.int64), cos, sin, use_triton=True)


@pytest.mark.gpu
def test_gpu_bf16_kernels_match_references() -> None:
    assert HAS_CUDA
    inp = make_elementwise_inputs(16, 4096, 14336, torch.bfloat16, "cuda", seed=1)
    r1, r2 = inp.residual.clone(), inp.residual.clone()
    out = add_rmsnorm(inp.x, r1, inp.weight)
    ref = reference_add_rmsnorm(inp.x, r2, inp.weight, 1e-5)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(
        silu_mul(inp.gate_up).float(), reference_silu_mul(inp.gate_up).float(), atol=2e-2, rtol=2e-2
    )
    rp = make_rope_inputs(4, 16, 32, 8, 128, 64, torch.bfloat16, "cuda", seed=2)
    a, b = rp.qkv.clone(), rp.qkv.clone()
    rope_(a, rp.hq + rp.hk, rp.pos, rp.cos, rp.sin)
    reference_rope_(b, rp.hq + rp.hk, rp.pos, rp.cos, rp.sin)
    torch.testing.assert_close(a.float(), b.float(), atol=2e-2, rtol=2e-2)
    for scatter in (False, True):
        outs = []
        for tri in (True, False):
            x, kv = rp.qkv.clone(), rp.kv.clone()
            if scatter:
                rope_scatter_(x, rp.hq, rp.hk, rp.pos, rp.dst, rp.cos, rp.sin, kv, use_triton=tri)
            else:
                rope_store_(x, rp.hq, rp.hk, rp.pos, rp.cos, rp.sin, kv, 3, use_triton=tri)
            outs.append((x[:, : rp.hq * 128].float(), kv.float()))
        torch.testing.assert_close(outs[0][0], outs[1][0], atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(outs[0][1], outs[1][1], atol=2e-2, rtol=2e-2)
