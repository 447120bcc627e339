"""Span attention (the drafter's attention: few queries over a prefix plus a masked key span):
the Triton kernels (interpreter on CPU) and the torch path against one float64 softmax."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.executor.tree_build import ancestor_mask  # noqa: E402
from spectune.kernels import (  # noqa: E402
    make_span_attention_inputs,
    reference_span_attention,
    span_attention,
)
from spectune.kernels.span_attention import MAX_SPLIT_ROWS, self_check  # noqa: E402


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)


def test_span_attention_matches_one_softmax() -> None:
    """The torch path on CPU, with and without a prefix, on tree masks."""
    b, n, c = 2, 6, 11
    q = torch.randn(b, n, 4, 16)
    kp, vp = torch.randn(b, 2, c, 16), torch.randn(b, 2, c, 16)
    kn, vn = torch.randn(b, 2, n, 16), torch.randn(b, 2, n, 16)
    mask = ancestor_mask(torch.tensor([[-1, 0, 0, 1, 1, 2], [-1, 0, 1, 2, 3, 4]]), 5)
    out = span_attention(q, kp, vp, kn, vn, mask)
    ref = reference_span_attention(q, kp, vp, kn, vn, mask)
    assert torch.allclose(out, ref, atol=1e-5)
    assert torch.allclose(
        span_attention(q, None, None, kn, vn, mask),
        reference_span_attention(q, None, None, kn, vn, mask),
        atol=1e-5,
    )


def test_fused_span_merge_kernel_matches_reference() -> None:
    """The Triton span-part + log-sum-exp merge kernel (interpreter) against one softmax."""
    g = torch.Generator().manual_seed(4)
    for b, n, h, kvh, c, s in ((2, 5, 4, 2, 30, 5), (1, 3, 8, 2, 0, 7), (2, 9, 4, 2, 40, 12)):
        q = torch.randn(b, n, h, 16, generator=g)
        kp, vp = torch.randn(b, kvh, c, 16, generator=g), torch.randn(b, kvh, c, 16, generator=g)
        kn, vn = torch.randn(b, kvh, s, 16, generator=g), torch.randn(b, kvh, s, 16, generator=g)
        mask = torch.rand(b, n, s, generator=g) < 0.6
        mask[:, :, 0] = True
        pre = (kp, vp) if c else (None, None)
        out = span_attention(q, *pre, kn, vn, mask, use_triton=True)
        assert torch.allclose(out, reference_span_attention(q, *pre, kn, vn, mask), atol=1e-5)


def test_split_prefix_path_matches_reference() -> None:
    """Few query rows over a long prefix: flash-decoding splits merged with the span part."""
    g = torch.Generator().manual_seed(5)
    for b, n, h, kvh, c, s in ((2, 5, 4, 2, 700, 5), (3, 1, 4, 1, 1000, 1)):
        q = torch.randn(b, n, h, 16, generator=g)
        kp, vp = torch.randn(b, kvh, c, 16, generator=g), torch.randn(b, kvh, c, 16, generator=g)
        kn, vn = torch.randn(b, kvh, s, 16, generator=g), torch.randn(b, kvh, s, 16, generator=g)
        mask = torch.ones(b, n, s, dtype=torch.bool)
        out = span_attention(q, kp, vp, kn, vn, mask, use_triton=True)
        assert torch.allclose(out, reference_span_attention(q, kp, vp, kn, vn, mask), atol=1e-5)


@pytest.mark.parametrize("use_triton", [True, False])
@pytest.mark.parametrize(
    "batch, tokens, span, context, causal",
    [
        (2, 3, 10, 40, False),  # a draft step: the frontier sees earlier draft slots
        (1, 4, 4, 0, True),  # a draft extend with no prefix
        (2, 40, 40, 33, True),  # G*N = 80 rows > MAX_SPLIT_ROWS: one prefix partial
    ],
)
def test_strided_cache_views_match_reference(
    use_triton: bool, batch: int, tokens: int, span: int, context: int, causal: bool
) -> None:
    """Inputs as the executor passes them (transposed views of a [B, C, KVH, D] cache), span
    larger than the query set, both paths."""
    inp = make_span_attention_inputs(batch, tokens, span, context, seed=3, causal=causal)
    assert inp.k_prefix is None or not inp.k_prefix.is_contiguous()
    rows = inp.q.shape[2] // inp.k_new.shape[1] * tokens  # packed query rows per KV group
    assert (rows > MAX_SPLIT_ROWS) == (tokens == 40)
    out = span_attention(*inp.args(), use_triton=use_triton)
    ref = reference_span_attention(*inp.args())
    assert out.shape == inp.q.shape
    assert torch.allclose(out, ref, atol=1e-5)


def test_rejects_malformed_inputs() -> None:
    inp = make_span_attention_inputs(2, 3, 5, 8)
    q, kp, vp, kn, vn, mask = inp.args()
    with pytest.raises(ValueError, match="mask"):
        span_attention(q, kp, vp, kn, vn, mask.int())
    with pytest.raises(ValueError, match="mask"):
        span_attention(q, kp, vp, kn, vn, mask[:, :, :4])
    with pytest.raises(ValueError, match="multiple"):
        span_attention(q[:, :, :3], kp, vp, kn, vn, mask)
    with pytest.raises(ValueError, match="k_prefix"):
        span_attention(q, kp[:1], vp, kn, vn, mask)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "batch, tokens, span, context",
    [(1, 1, 1, 4096), (8, 10, 31, 4096), (4, 8, 8, 512), (2, 40, 40, 1000)],
)
def test_gpu_bf16_vs_reference(batch: int, tokens: int, span: int, context: int) -> None:
    """bf16 on the GPU (split prefix, flash prefix and no-prefix paths) against float64."""
    assert self_check(torch.device("cuda")) < 2e-2
    inp = make_span_attention_inputs(
        batch, tokens, span, context, heads=32, kv_heads=8, head_dim=128,
        dtype=torch.bfloat16, device="cuda", seed=1,
    )  # fmt: skip
    out = span_attention(*inp.args())
    ref = reference_span_attention(*inp.args()).double()
    err = float((out.double() - ref).norm() / ref.norm())
    assert err < 2e-2
