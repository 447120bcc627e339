"""Fused MoE: routing, on-device expert alignment and the grouped GEMMs equal their torch
references (Triton interpreter on CPU); GPU: bf16 at Qwen3-30B-A3B's expert shape vs fp32."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels.fused_moe import (  # noqa: E402
    MoEConfig,
    default_config,
    fused_moe,
    make_moe_inputs,
    max_blocks,
    moe_align,
    moe_combine,
    moe_expert_rows,
    reference_moe,
    reference_moe_align,
    reference_moe_combine,
    reference_route_topk,
    route_topk,
)

SMALL = MoEConfig(block_m=16, block_n=16, block_n_down=32, block_k=32, num_warps=4, num_stages=1)


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-6))


def _check_alignment(al, ids: torch.Tensor, experts: int) -> None:
    """Every pair once, in a block of its own expert; used blocks first, then -1."""
    pairs = ids.numel()
    flat = ids.reshape(-1).long()
    used = int(al.num_padded.item())
    bm = al.block_m
    assert used % bm == 0 and used <= al.sorted_ids.numel()
    rows = al.sorted_ids.long()
    real = rows[rows < pairs]
    assert sorted(real.tolist()) == list(range(pairs))
    assert (rows[used:] == pairs).all()
    be = al.block_expert.long()
    assert (be[used // bm :] == -1).all()
    assert ((be[: used // bm] >= 0) & (be[: used // bm] < experts)).all()
    for b in range(used // bm):
        blk = rows[b * bm : (b + 1) * bm]
        blk = blk[blk < pairs]
        assert blk.numel() > 0, "a used block holds no pair"
        assert (flat[blk] == be[b]).all()
    counts = torch.bincount(flat, minlength=experts)
    assert used == int(((counts + bm - 1) // bm * bm).sum())


@pytest.mark.parametrize("renorm", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_route_topk_matches_reference(renorm, dtype) -> None:
    logits = torch.randn((37, 24), generator=torch.Generator().manual_seed(1)).to(dtype)
    ids, w = route_topk(logits, 3, renorm, use_triton=True)
    rids, rw = reference_route_topk(logits, 3, renorm)
    assert torch.equal(ids, rids)
    torch.testing.assert_close(w, rw, atol=1e-6, rtol=1e-5)
    if renorm:
        torch.testing.assert_close(w.sum(-1), torch.ones(37))


@pytest.mark.parametrize("tokens", [1, 2, 9, 64, 130])
@pytest.mark.parametrize("block_m", [16, 32])
def test_alignment_invariants(tokens, block_m) -> None:
    inp = make_moe_inputs(tokens, experts=8, topk=2, seed=tokens, live_experts=5)
    al = moe_align(inp.topk_ids, 8, block_m, use_triton=True)
    _check_alignment(al, inp.topk_ids, 8)
    ref = reference_moe_align(inp.topk_ids, 8, block_m)
    _check_alignment(ref, inp.topk_ids, 8)
    assert torch.equal(al.block_expert, ref.block_expert)
    assert torch.equal(al.num_padded, ref.num_padded)


def test_max_blocks_is_the_worst_case() -> None:
    """The most blocks n pairs can fill: one pair on each of z = min(E, n) experts, the rest in
    whole blocks, z + (n - z) // block_m; the bound is safe and at most one block above it."""
    for pairs, experts, bm in [
        (8, 128, 16),
        (3, 8, 16),
        (260, 8, 16),
        (1000, 128, 64),
        (16, 1, 16),
    ]:
        z = min(pairs, experts)
        worst = z + (pairs - z) // bm
        assert worst <= max_blocks(pairs, experts, bm) <= worst + 1
    assert max_blocks(8, 128, 16) == 8  # one token, top-8: eight one-row blocks


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-2)])
@pytest.mark.parametrize("tokens", [1, 2, 7, 16, 33, 130])
def test_fused_moe_matches_reference(tokens, dtype, tol) -> None:
    inp = make_moe_inputs(tokens, experts=8, topk=2, hidden=64, inter=32, dtype=dtype, seed=3)
    out = fused_moe(*inp.args(), config=SMALL, use_triton=True)
    assert out.dtype == dtype and out.shape == (tokens, 64)
    assert _rel_err(out, reference_moe(*inp.args())) < tol


@pytest.mark.parametrize("tokens", [1, 40, 130])
def test_default_configs_match_reference(tokens) -> None:
    inp = make_moe_inputs(tokens, experts=8, topk=2, hidden=64, inter=32, seed=5)
    cfg = default_config(tokens, 8, 2)
    out = fused_moe(*inp.args(), config=cfg, use_triton=True)
    assert _rel_err(out, reference_moe(*inp.args())) < 1e-5


def test_unrouted_experts_are_never_read() -> None:
    """Experts that get no token may hold NaN: padding blocks and dead experts are skipped."""
    inp = make_moe_inputs(20, experts=8, topk=2, seed=9, live_experts=3)
    live = set(inp.topk_ids.flatten().tolist())
    dead = [e for e in range(8) if e not in live]
    assert dead
    inp.w_gate_up[dead] = float("nan")
    inp.w_down[dead] = float("nan")
    out = fused_moe(*inp.args(), config=SMALL, use_triton=True)
    assert torch.isfinite(out).all()
    assert _rel_err(out, reference_moe(*inp.args())) < 1e-5


@settings(max_examples=12, deadline=None)
@given(
    tokens=st.integers(1, 130),
    topk=st.integers(1, 3),
    live=st.integers(1, 8),
    seed=st.integers(0, 2**16),
)
def test_random_routing(tokens, topk, live, seed) -> None:
    inp = make_moe_inputs(tokens, experts=8, topk=topk, seed=seed, live_experts=max(live, topk))
    ids, w = route_topk(inp.logits, topk, use_triton=True)
    assert torch.equal(ids, inp.topk_ids)
    torch.testing.assert_close(w, inp.topk_weights)
    al = moe_align(ids, 8, 16, use_triton=True)
    _check_alignment(al, ids, 8)
    rows = moe_expert_rows(*inp.args(), align=al, config=SMALL, use_triton=True)
    ref = reference_moe(*inp.args())
    assert _rel_err(moe_combine(rows.view(tokens, topk, -1), use_triton=True), ref) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_combine_with_residual_and_norm(dtype) -> None:
    g = torch.Generator().manual_seed(2)
    rows = torch.randn((5, 3, 48), generator=g).to(dtype)
    res = torch.randn((5, 48), generator=g).to(dtype)
    w = torch.rand(48, generator=g).to(dtype)
    res_ref = res.clone()
    out = moe_combine(rows, res, w, use_triton=True)
    ref = reference_moe_combine(rows, res_ref, w)
    tol = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(res, res_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(out, ref, atol=tol * 10, rtol=tol * 10)


def test_shape_errors() -> None:
    inp = make_moe_inputs(4)
    with pytest.raises(ValueError, match="shapes"):
        moe_expert_rows(inp.x[:, :32], *inp.args()[1:], config=SMALL, use_triton=True)
    al = moe_align(inp.topk_ids, 8, 32, use_triton=True)
    with pytest.raises(ValueError, match="block_m"):
        moe_expert_rows(*inp.args(), align=al, config=SMALL, use_triton=True)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 16, 64, 1024])
def test_gpu_bf16_qwen3_shape_matches_fp32_reference(tokens) -> None:
    """Qwen3-30B-A3B's experts (E 128, top-8, h 2048, I 768) in bf16 vs the fp32 loop, with
    the default and the large-tile configs, eager and replayed from a CUDA graph."""
    inp = make_moe_inputs(
        tokens, 128, 8, 2048, 768, dtype=torch.bfloat16, device="cuda", seed=tokens
    )
    ids, w = route_topk(inp.logits, 8)
    assert torch.equal(ids, inp.topk_ids)
    torch.testing.assert_close(w, inp.topk_weights)
    ref = reference_moe(*inp.args())
    for cfg in (default_config(tokens, 128, 8), MoEConfig(64, 128, 128, 64, 8, 3)):
        out = fused_moe(*inp.args(), config=cfg)
        assert _rel_err(out, ref) < 1e-2
        graph = torch.cuda.CUDAGraph()
        fused_moe(*inp.args(), config=cfg)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            gout = fused_moe(*inp.args(), config=cfg)
        graph.replay()
        torch.cuda.synchronize()
        assert _rel_err(gout, ref) < 1e-2
