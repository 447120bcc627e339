"""fused_linear (RMSNorm prologue, residual / SwiGLU epilogues, split-K reduced in the launch)
against the unfused torch reference (interpreter on CPU; bf16 on the GPU)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels.gemm_fused import (  # noqa: E402
    RopeStore,
    _tickets,
    fused_linear,
    make_fused_linear_inputs,
    reference_fused_linear,
)
from spectune.kernels.gemm_fused_config import (  # noqa: E402
    FusedLinearConfig,
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


MODES = ("plain", "norm", "residual", "gated", "norm+gated")
CONFIGS = (
    FusedLinearConfig(1, 32, 32, 4, 2),
    FusedLinearConfig(3, 32, 32, 4, 2),  # K 200 in 3 splits of 96: the last split is partial
    FusedLinearConfig(2, 16, 64, 4, 2, prefetch_k=64, evict_first=True),  # no prefetch off-GPU
)


def _run(mode: str, m: int, rows: int, k: int, cfg: FusedLinearConfig, seed: int) -> None:
    x, w, g, r = make_fused_linear_inputs(m, rows, k, seed=seed)
    norm = g if "norm" in mode else None
    gated = "gated" in mode
    if mode == "residual":
        ref_res, res = r.clone(), r.clone()
        ref = reference_fused_linear(x, w, residual=ref_res)
        out = fused_linear(x, w, residual=res, config=cfg, use_triton=True)
        assert out.data_ptr() == res.data_ptr()  # in place
    else:
        ref = reference_fused_linear(x, w, norm, gated=gated)
        out = fused_linear(x, w, norm_weight=norm, gated=gated, config=cfg, use_triton=True)
    assert out.shape == (m, rows // 2 if gated else rows)
    torch.testing.assert_close(out, ref, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
def test_fused_linear_matches_reference(mode: str, cfg: FusedLinearConfig) -> None:
    """Every epilogue x prologue, split and unsplit; M, N and K not multiples of the tiles."""
    _run(mode, 9, 70, 200, cfg, seed=1)


def test_split_counters_are_left_at_zero_for_the_next_call() -> None:
    """The reducing program resets its ticket: a second call (same or other shape) reduces
    again, and the counter buffer is all zeros afterwards."""
    cfg = FusedLinearConfig(4, 16, 32, 4, 2)
    for seed in (2, 3):
        _run("norm+gated", 5, 48, 128, cfg, seed)
        _run("residual", 17, 40, 160, cfg, seed)
    assert int(_tickets(torch.device("cpu"), 1).abs().sum()) == 0


def test_norm_prologue_equals_add_rmsnorm_then_linear() -> None:
    """The executor's unfused pair (kernels.elementwise.add_rmsnorm, then x @ W^T) is what the
    prologue replaces."""
    from spectune.kernels.elementwise import add_rmsnorm

    x, w, g, _ = make_fused_linear_inputs(6, 24, 64, seed=4)
    two_step = add_rmsnorm(x, None, g, use_triton=True) @ w.T
    fused = fused_linear(x, w, norm_weight=g, config=FusedLinearConfig(2, 16, 32), use_triton=True)
    torch.testing.assert_close(fused, two_step, atol=2e-4, rtol=2e-4)


def _rope_case(
    b: int, n: int, hq: int, hk: int, d: int, k: int, dtype: torch.dtype, device: str, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, RopeStore, RopeStore]:
    """x [B*N, K], w [(hq + 2hk) * d, K], norm weight, and two RopeStores over equal caches."""
    from spectune.kernels.rope import rope_tables

    rows = (hq + 2 * hk) * d
    x, w, g, _ = make_fused_linear_inputs(b * n, rows, k, dtype, device, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    pos = torch.randint(0, 40, (b * n,), generator=gen).to(device)
    cos, sin = rope_tables(40, d, 10000.0, torch.device(device))
    slots = 7 + n + 8  # the store writes [7, 7 + n) of each sequence; slots past it stay untouched
    kv = torch.randn((2, b + 1, slots, hk, d), generator=gen).to(device=device, dtype=dtype)
    stores = [RopeStore(pos, cos, sin, kv.clone(), 7, n, hq, hk) for _ in range(2)]
    return x, w, g, stores[0], stores[1]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name)
@pytest.mark.parametrize("norm", [False, True])
def test_rope_epilogue_equals_rope_store(cfg: FusedLinearConfig, norm: bool) -> None:
    """q|k|v GEMM with RoPE + K/V store in the epilogue == GEMM, then rope_store_ (reference):
    the same q, the same cache (k rotated, v as is, at [lo, lo + N) of each sequence, nothing
    else touched)."""
    x, w, g, ref, got = _rope_case(2, 5, 4, 2, 32, 80, torch.float32, "cpu", seed=7)
    gw = g if norm else None
    want_q = reference_fused_linear(x, w, gw, rope=ref)
    q = fused_linear(x, w, norm_weight=gw, config=cfg, rope=got, use_triton=True)
    assert q.shape == (10, 4 * 32)
    torch.testing.assert_close(q, want_q, atol=2e-4, rtol=2e-4)
    torch.testing.assert_close(got.kv, ref.kv, atol=2e-4, rtol=2e-4)


def test_rope_rejects_mismatched_shapes() -> None:
    x, w, _, r, _ = _rope_case(1, 4, 4, 2, 32, 48, torch.float32, "cpu", seed=1)
    with pytest.raises(ValueError, match="heads of D"):
        fused_linear(x, w[:-32].contiguous(), rope=r, use_triton=True)
    with pytest.raises(ValueError, match=r"rope\.pos"):
        fused_linear(
            x, w, rope=RopeStore(r.pos[:3], r.cos, r.sin, r.kv, 0, 4, 4, 2), use_triton=True
        )
    with pytest.raises(ValueError, match="capacity"):
        fused_linear(x, w, rope=RopeStore(r.pos, r.cos, r.sin, r.kv, 18, 4, 4, 2), use_triton=True)
    with pytest.raises(ValueError, match="do not combine"):
        fused_linear(x, w, rope=r, gated=True, use_triton=True)


def test_rejects_malformed_inputs() -> None:
    x, w, g, r = make_fused_linear_inputs(4, 16, 32)
    with pytest.raises(ValueError, match="w must be"):
        fused_linear(x, w[:, :31].contiguous(), use_triton=True)
    with pytest.raises(ValueError, match="x must be"):
        fused_linear(x.t(), w, use_triton=True)
    with pytest.raises(ValueError, match="norm_weight"):
        fused_linear(x, w, norm_weight=g[:31], use_triton=True)
    with pytest.raises(ValueError, match="residual"):
        fused_linear(x, w, residual=r[:, :15].contiguous(), use_triton=True)
    with pytest.raises(ValueError, match="gated w"):
        fused_linear(x, w[:15], gated=True, use_triton=True)
    with pytest.raises(ValueError, match="do not combine"):
        fused_linear(x, w, gated=True, residual=r[:, :8].contiguous(), use_triton=True)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["norm", "residual", "norm+gated"])
@pytest.mark.parametrize("pdl", [False, True])
def test_gpu_bf16_fused_linear(mode: str, pdl: bool) -> None:
    """bf16 at a real layer's K, split and unsplit, with and without programmatic launch and
    the L2 prefetch before the wait (the plain and gated-only modes differ from these only in
    constexpr branches the interpreter tests cover)."""
    for cfg in (
        FusedLinearConfig(1),
        FusedLinearConfig(4),
        FusedLinearConfig(2, 64, 64, 4, 4, prefetch_k=4096, evict_first=True),  # whole slice
    ):
        x, w, g, r = make_fused_linear_inputs(64, 1024, 4096, torch.bfloat16, "cuda", seed=5)
        norm = g if "norm" in mode else None
        gated = "gated" in mode
        res = r.clone() if mode == "residual" else None
        ref = reference_fused_linear(
            x, w, norm, r.clone() if res is not None else None, gated
        ).float()
        out = fused_linear(
            x, w, norm_weight=norm, residual=res, gated=gated, config=cfg, pdl=pdl
        ).float()
        err = float((out - ref).norm() / ref.norm())
        assert err < 1e-2, (mode, cfg.name, err)
    torch.cuda.synchronize()
    assert int(_tickets(x.device, 1).abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", [False, True])
def test_gpu_bf16_rope_epilogue(pdl: bool) -> None:
    """Llama-3.1-8B's head shape (32 q, 8 kv heads of 128) at K 4096, bf16, split and not."""
    for cfg in (FusedLinearConfig(1), FusedLinearConfig(4, prefetch_k=256, evict_first=True)):
        x, w, g, ref, got = _rope_case(1, 64, 32, 8, 128, 4096, torch.bfloat16, "cuda", seed=3)
        want_q = reference_fused_linear(x, w, g, rope=ref).float()
        q = fused_linear(x, w, norm_weight=g, config=cfg, rope=got, pdl=pdl).float()
        assert float((q - want_q).norm() / want_q.norm()) < 1e-2, cfg.name
        dk = (got.kv.float() - ref.kv.float()).norm() / ref.kv.float().norm()
        assert float(dk) < 1e-2, cfg.name
