"""Split-K weight GEMMs (plain and SwiGLU-fused) against the torch reference, and the per-shape
plan that `linear` consults (interpreter on CPU; bf16 on the GPU)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels import (  # noqa: E402
    GemmPlan,
    linear,
    linear_gated,
    make_gemm_inputs,
    reference_linear,
    splitk_linear,
)
from spectune.kernels.gemm import (  # noqa: E402
    PLAN_TIE,
    VARIANTS,
    parse_variant,
    pick_variant,
    run_variant,
    set_plan,
)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def test_splitk_linear_matches_matmul() -> None:
    for m, n, k, s in ((1, 40, 300, 1), (5, 64, 512, 4), (17, 70, 256, 2)):
        x, w = torch.randn(m, k), torch.randn(n, k)
        assert torch.allclose(splitk_linear(x, w, s), x @ w.T, atol=1e-3)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("variant", ["splitk1", "splitk2/32x64/4w3s", "splitk4"])
def test_splitk_variants_match_reference(gated: bool, variant: str) -> None:
    """Each tile/split variant, plain and with silu(gate) * up fused into the input read; K not
    a multiple of the split (the last split is partial)."""
    x, w = make_gemm_inputs(9, 48, 200, gated=gated, seed=3)
    out = splitk_linear(x, w, gated=gated, **parse_variant(variant))
    torch.testing.assert_close(out, reference_linear(x, w, gated=gated), atol=1e-4, rtol=1e-4)


def test_plan_picks_variant_per_bucket_and_linear_dispatches() -> None:
    plan = GemmPlan({(48, 64, 16, False): "splitk2", (48, 64, 64, True): "splitk4"})
    assert plan.variant(48, 64, 1) == "cublas"  # no entry: the library GEMM
    assert plan.variant(48, 64, 9) == "splitk2"  # M 9 falls in bucket 16
    assert plan.variant(48, 64, 40, gated=True) == "splitk4"
    assert plan.variant(48, 64, 4096) == "cublas"  # past the last bucket
    assert plan.to_dict() == {"48x64@16": "splitk2", "48x64@64+silu": "splitk4"}
    assert all(
        v in ("cublas", "cublaslt") or parse_variant(v)["splits"] in (1, 2, 4, 8) for v in VARIANTS
    )
    # off the GPU linear / linear_gated are torch's, whatever the plan
    set_plan(plan)
    try:
        x, w = make_gemm_inputs(9, 48, 64, seed=1)
        torch.testing.assert_close(linear(x, w), reference_linear(x, w), atol=1e-4, rtol=1e-4)
        gu, _ = make_gemm_inputs(9, 48, 64, gated=True, seed=2)
        torch.testing.assert_close(
            linear_gated(gu, w), reference_linear(gu, w, gated=True), atol=1e-4, rtol=1e-4
        )
    finally:
        set_plan(GemmPlan())


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("variant", ["cublas", "cublaslt"])
def test_library_variants_match_reference(gated: bool, variant: str) -> None:
    """The library variants (silu(gate) * up first where gated) give the reference product; off
    the GPU both are torch's linear."""
    x, w = make_gemm_inputs(9, 48, 200, gated=gated, seed=4)
    out = run_variant(variant, x, w, gated)
    torch.testing.assert_close(out, reference_linear(x, w, gated=gated), atol=1e-4, rtol=1e-4)


def test_pick_variant_keeps_the_previous_bucket_within_the_tie() -> None:
    """A bucket runs its fastest variant, unless the previous bucket's is within PLAN_TIE of it
    (near-tied variants do not flip from one bucket to the next); nothing timed: cuBLAS."""
    timed = {"cublas": 31.0e-6, "splitk1": 30.9e-6 * (1 + PLAN_TIE) / 1.0001, "splitk2": 30.9e-6}
    assert pick_variant(timed) == "splitk2"
    assert pick_variant(timed, "splitk1") == "splitk1"  # within the tie: kept
    assert pick_variant(timed, "cublas") == "cublas"
    slow = {**timed, "splitk1": 30.9e-6 * (1 + PLAN_TIE) * 1.001}
    assert pick_variant(slow, "splitk1") == "splitk2"  # past the tie: the fastest
    assert pick_variant(timed, "splitk8") == "splitk2"  # the previous one was not timed here
    assert pick_variant({}) == "cublas"


def test_rejects_malformed_inputs() -> None:
    x, w = make_gemm_inputs(4, 16, 32)
    with pytest.raises(ValueError, match="x must be"):
        splitk_linear(x[:, :31], w, 1)
    with pytest.raises(ValueError, match="x must be"):
        splitk_linear(x, w, 1, gated=True)
    with pytest.raises(ValueError, match="w must be contiguous"):
        splitk_linear(x, torch.randn(32, 16).t(), 1)


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
def test_gpu_bf16_variants_match_reference(gated: bool) -> None:
    x, w = make_gemm_inputs(64, 4096, 1024, gated=gated, dtype=torch.bfloat16, device="cuda")
    ref = reference_linear(x, w, gated=gated).float()
    for v in ("splitk1", "splitk4/128x128/8w3s", "splitk8/64x256/4w3s"):
        out = splitk_linear(x, w, gated=gated, **parse_variant(v)).float()
        assert float((out - ref).norm() / ref.norm()) < 1e-2, v
    before = torch.backends.cuda.preferred_blas_library()
    out = run_variant("cublaslt", x, w, gated).float()
    assert float((out - ref).norm() / ref.norm()) < 1e-2
    assert torch.backends.cuda.preferred_blas_library() == before  # one call's preference only


def test_rotating_weights_cycle_the_bytes_asked_for() -> None:
    """Copies enough to cover total_bytes (at least one), distinct, at the executor's scale."""
    from spectune.kernels.gemm import rotating_weights

    ws = rotating_weights(4, 8, "cpu", total_bytes=200)  # 64 bytes a copy -> 4 copies
    assert len(ws) == 4
    assert all(w.shape == (4, 8) and w.dtype == torch.bfloat16 for w in ws)
    assert all(float(w.abs().max()) <= 0.02 for w in ws)
    assert len({w.data_ptr() for w in ws}) == 4
    assert len(rotating_weights(4, 8, "cpu", total_bytes=1)) == 1


def test_autotune_times_cublaslt_from_its_least_bucket(monkeypatch: pytest.MonkeyPatch) -> None:
    """The autotune offers "cublaslt" only at buckets of LT_MIN_BUCKET rows or more: below it
    the plan never runs it, though it times fastest (timings stubbed: no kernel runs)."""
    import spectune.kernels.gemm as gemm

    last: list[str] = []

    def run(v: str, *args: object, **kwargs: object) -> None:
        last.append(v)

    def timed(fn: Callable[[], object], device: object) -> float:
        fn()  # runs the stub above for each weight copy
        return 1e-6 if last[-1] == "cublaslt" else 2e-6

    monkeypatch.setattr(gemm, "run_variant", run)
    monkeypatch.setattr(gemm, "graph_time", timed)
    plan, rows = gemm.autotune([(64, 32)], torch.device("cpu"), copies_bytes=1)
    assert {r["m"] for r in rows if r["variant"] == "cublaslt"} == {
        m for m in gemm.M_BUCKETS if m >= gemm.LT_MIN_BUCKET
    }
    for m in gemm.M_BUCKETS:
        assert (plan.variant(64, 32, m) == "cublaslt") == (m >= gemm.LT_MIN_BUCKET), m
