"""The streaming read kernel (kernels/stream.py) against torch's sum, on the interpreter."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs a GPU or TRITON_INTERPRET=1", allow_module_level=True)

from spectune.kernels.stream import stream_read  # noqa: E402


@pytest.mark.parametrize(("n", "programs", "block"), [(1, 3, 64), (1000, 3, 64), (4097, 5, 128)])
def test_partials_sum_to_the_whole(n: int, programs: int, block: int) -> None:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.randn(n, dtype=torch.float32, device=dev).to(torch.bfloat16)
    parts = stream_read(x, programs=programs, block=block, num_warps=1)
    assert parts.numel() == min(programs, -(-n // block))
    want = x.float().sum()
    assert torch.allclose(parts.sum(), want, rtol=1e-4, atol=1e-3)


def test_refuses_a_strided_tensor() -> None:
    x = torch.zeros(8, 8, dtype=torch.bfloat16)[:, ::2]
    with pytest.raises(ValueError, match="contiguous"):
        stream_read(x)
