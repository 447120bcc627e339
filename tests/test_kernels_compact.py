"""KV compaction: the Triton kernel equals the torch reference; untouched rows stay untouched."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels import compact_kv, make_compact_inputs, reference_compact_kv  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("layered", [True, False])
def test_matches_reference(dtype, layered) -> None:
    inp = make_compact_inputs([3, 0, 17, 5], [9, 40, 1, 70], dtype=dtype, seed=4)
    k, v = (
        (inp.k_cache, inp.v_cache) if layered else (inp.k_cache[1].clone(), inp.v_cache[1].clone())
    )
    rk, rv = reference_compact_kv(k, v, *inp.args()[2:])
    compact_kv(k, v, *inp.args()[2:])
    assert torch.equal(k, rk) and torch.equal(v, rv)


def test_overlapping_moves() -> None:
    """Path [0, 2, 5]: entry 1 reads slot 2, which entry 2 writes; the read must win."""
    k = torch.arange(8, dtype=torch.float32).repeat_interleave(16).reshape(8, 1, 16)
    v = -k.clone()
    path = torch.tensor([[0, 2, 5]], dtype=torch.int32)
    args = (
        torch.tensor([0, 8], dtype=torch.int32),
        torch.tensor([1], dtype=torch.int32),
        path,
        torch.tensor([2], dtype=torch.int32),
    )
    rk, rv = reference_compact_kv(k, v, *args)
    compact_kv(k, v, *args)
    assert k[:, 0, 0].tolist() == [0, 1, 3, 6, 4, 5, 6, 7]
    assert torch.equal(k, rk) and torch.equal(v, rv)


@settings(max_examples=10, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 130), min_size=1, max_size=4),
    prefix=st.integers(0, 20),
    seed=st.integers(0, 2**16),
)
def test_random_paths(sizes, prefix, seed) -> None:
    inp = make_compact_inputs(
        [prefix] * len(sizes), sizes, layers=1, kv_heads=1, head_dim=16, seed=seed
    )
    before = inp.k_cache.clone()
    rk, rv = reference_compact_kv(*inp.args())
    compact_kv(*inp.args())
    assert torch.equal(inp.k_cache, rk) and torch.equal(inp.v_cache, rv)
    # only slots prefix+1 .. prefix+count of each sequence may change
    changed = (inp.k_cache != before).any(-1).any(-1)[0].numpy()
    allowed = np.zeros_like(changed)
    for b in range(len(sizes)):
        base = int(inp.kv_indptr[b]) + prefix
        allowed[base + 1 : base + 1 + int(inp.num_accepted[b])] = True
    assert not (changed & ~allowed).any()


def test_rejects_malformed_inputs() -> None:
    inp = make_compact_inputs([2], [5])
    with pytest.raises(ValueError, match="int32"):
        compact_kv(
            inp.k_cache,
            inp.v_cache,
            inp.kv_indptr,
            inp.prefix_lens.long(),
            inp.accepted_nodes,
            inp.num_accepted,
        )
    with pytest.raises(ValueError, match="differ"):
        compact_kv(inp.k_cache, inp.v_cache[:, :-1], *inp.args()[2:])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_matches_reference(dtype) -> None:
    inp = make_compact_inputs(
        [100, 7, 0],
        [64, 130, 16],
        layers=3,
        kv_heads=8,
        head_dim=128,
        dtype=dtype,
        device="cuda",
        seed=2,
    )
    rk, rv = reference_compact_kv(*inp.args())
    compact_kv(*inp.args())
    assert torch.equal(inp.k_cache, rk) and torch.equal(inp.v_cache, rv)
