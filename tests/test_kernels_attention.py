"""Tree attention: the Triton kernel against the torch reference (interpreter on CPU, bf16 on GPU)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from spectune.kernels import (  # noqa: E402
    TreeAttentionConfig,
    make_tree_attention_inputs,
    reference_tree_attention,
    tree_attention,
)
from spectune.specs import DraftTree  # noqa: E402
from tests.conftest import HAS_CUDA  # noqa: E402
from tests.strategies import parents_arrays  # noqa: E402

DEVICE = "cuda" if HAS_CUDA else "cpu"
# Big tiles: few programs, which is what makes the interpreter fast.
FAST = TreeAttentionConfig(block_m=64, block_n=64, tree_block=64, min_chunk=64)


def rel_err(out: Any, ref: Any) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def run(inp, **kw) -> Any:
    return tree_attention(*inp.args(), max_q_len=inp.max_q_len, max_kv_len=inp.max_kv_len, **kw)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.float16, 3e-3)])
@pytest.mark.parametrize(
    "prefix, sizes, splits",
    [([5, 40, 0], [1, 7, 70], None), ([37, 2], [16, 3], 1), ([90], [65], 4), ([0], [1], None)],
)
def test_matches_reference(dtype, tol, prefix, sizes, splits) -> None:
    inp = make_tree_attention_inputs(
        prefix, sizes, num_q_heads=4, num_kv_heads=2, head_dim=32, dtype=dtype, seed=7, slack=3
    )
    out = torch.full_like(inp.q, float("nan"))  # poison: every element must be written
    run(inp, num_splits=splits, out=out)
    ref = reference_tree_attention(*inp.args())
    assert not out.isnan().any()
    assert rel_err(out, ref) < tol


def test_fused_and_separate_merge_agree() -> None:
    """The last-arriving split merges in-kernel (atomic ticket) or a second kernel does."""
    from spectune.kernels.tree_attention import _TICKETS

    inp = make_tree_attention_inputs(
        [70, 20], [9, 30], num_q_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32, seed=5
    )
    ref = reference_tree_attention(*inp.args())
    for fuse in (True, False):
        cfg = TreeAttentionConfig(
            block_m=32, block_n=16, tree_block=16, min_chunk=16, fuse_merge=fuse
        )
        out = run(inp, config=cfg, num_splits=4)
        assert rel_err(out, ref) < 1e-5
    assert all(int(t.abs().sum()) == 0 for t in _TICKETS.values())  # counters left at zero


def test_half_partials_fp16() -> None:
    """Partials stored in q's dtype (fp16 here), merged by either path: within fp16 rounding."""
    inp = make_tree_attention_inputs(
        [70, 20], [9, 30], num_q_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float16, seed=6
    )
    ref = reference_tree_attention(*[t.float() if t.is_floating_point() else t for t in inp.args()])
    for fuse in (True, False):
        cfg = TreeAttentionConfig(
            block_m=32, block_n=16, tree_block=16, min_chunk=16, fuse_merge=fuse,
            half_partials=True,
        )  # fmt: skip
        out = run(inp, config=cfg, num_splits=4)
        assert out.dtype == torch.float16
        assert rel_err(out, ref) < 5e-3


def test_merge_warps() -> None:
    """The split merge on 1, 2 or 4 warps per row (the [S, D] tile spread differently): the same
    result, for ragged sequences (a short one has empty splits) and an odd head dim."""
    inp = make_tree_attention_inputs(
        [70, 20, 3], [9, 16, 40], num_q_heads=4, num_kv_heads=2, head_dim=24,
        dtype=torch.float32, seed=8,
    )  # fmt: skip
    ref = reference_tree_attention(*inp.args())
    for warps in (1, 2, 4):
        cfg = TreeAttentionConfig(
            block_m=32, block_n=16, tree_block=16, min_chunk=16, merge_warps=warps
        )
        assert rel_err(run(inp, config=cfg, num_splits=5), ref) < 1e-5, warps


def test_tree_split() -> None:
    """The tree keys in a program of their own or in the last prefix split: the same result for
    ragged sequences (a short one leaves prefix splits empty), trees longer than one tree block
    and one split (direct store, where there is no tree split). 32 resident programs per SM (x 4
    "SMs" off the GPU) leave room for the tree programs at 2 and 7 splits, not at 4."""
    from spectune.kernels.tree_attention_config import tree_split_fits

    inp = make_tree_attention_inputs(
        [70, 20, 3], [9, 16, 40], num_q_heads=4, num_kv_heads=2, head_dim=16,
        dtype=torch.float32, seed=9,
    )  # fmt: skip
    ref = reference_tree_attention(*inp.args())
    per_split, slots = 3 * 2 * 5, 4 * 32  # (sequences x KV heads x m-blocks of 32 of 4 x 40 rows)
    for splits in (1, 2, 4, 7):
        for tree_split in (True, False):
            cfg = TreeAttentionConfig(
                block_m=32, block_n=16, tree_block=16, min_chunk=16, tree_split=tree_split,
                ctas_per_sm=32,
            )  # fmt: skip
            fits = tree_split_fits(per_split, splits, slots, cfg)
            assert fits == (tree_split and splits in (2, 7))
            assert rel_err(run(inp, config=cfg, num_splits=splits), ref) < 1e-5


def test_small_tiles_and_odd_head_dim() -> None:
    """Head dim 24 (padded to 32), one query head per KV head, several prefix blocks per split."""
    inp = make_tree_attention_inputs(
        [50, 9], [20, 5], num_q_heads=3, num_kv_heads=3, head_dim=24, dtype=torch.float32, seed=3
    )
    cfg = TreeAttentionConfig(block_m=16, block_n=16, tree_block=16, min_chunk=16)
    out = run(inp, config=cfg)
    assert rel_err(out, reference_tree_attention(*inp.args())) < 1e-5


def test_chain_tree_is_causal_attention() -> None:
    """A chain tree is plain causal attention over prefix + chain (mask = lower triangle)."""
    tree = DraftTree.chain(5)
    inp = make_tree_attention_inputs(
        [11], [6], num_q_heads=2, num_kv_heads=1, head_dim=16, dtype=torch.float32, trees=[tree]
    )
    out = run(inp, config=FAST)
    k = inp.k_cache[:17, 0].double()
    v = inp.v_cache[:17, 0].double()
    for h in range(2):
        s = inp.q[:, h].double() @ k.T / 4.0
        causal = torch.ones(6, 17, dtype=torch.bool).tril(11)
        p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
        assert torch.allclose(out[:, h].double(), p @ v, atol=1e-5)


@settings(max_examples=6, deadline=None)
@given(
    trees=st.lists(parents_arrays(1, 130, 16), min_size=1, max_size=3),
    prefixes=st.lists(st.integers(0, 80), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_random_trees(trees, prefixes, seed) -> None:
    dtrees = [DraftTree.from_parents(p) for p in trees]
    inp = make_tree_attention_inputs(
        prefixes[: len(dtrees)], [t.num_nodes for t in dtrees], num_q_heads=2, num_kv_heads=1,
        head_dim=16, dtype=torch.float32, seed=seed, trees=dtrees,
    )  # fmt: skip
    out = run(inp, config=FAST)
    assert rel_err(out, reference_tree_attention(*inp.args())) < 1e-5


def test_rejects_malformed_inputs() -> None:
    inp = make_tree_attention_inputs(
        [4], [3], num_q_heads=4, num_kv_heads=2, head_dim=16, dtype=torch.float32
    )
    with pytest.raises(ValueError, match="int32"):
        tree_attention(
            inp.q, inp.k_cache, inp.v_cache, inp.qo_indptr.long(), inp.kv_indptr, inp.tree_mask
        )
    with pytest.raises(ValueError, match="multiple"):
        tree_attention(
            inp.q[:, :3], inp.k_cache, inp.v_cache, inp.qo_indptr, inp.kv_indptr, inp.tree_mask
        )
    with pytest.raises(ValueError, match="tree_mask"):
        tree_attention(
            inp.q, inp.k_cache, inp.v_cache, inp.qo_indptr, inp.kv_indptr, inp.tree_mask.int()
        )
    with pytest.raises(ValueError, match="dtypes"):
        tree_attention(
            inp.q.half(), inp.k_cache, inp.v_cache, inp.qo_indptr, inp.kv_indptr, inp.tree_mask
        )


def test_import_without_torch_names_gpu_extra() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "try:\n    import spectune.kernels\nexcept ImportError as e:\n    print(e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "gpu" in res.stdout and "spectune[gpu]" in res.stdout


@pytest.mark.gpu
@pytest.mark.parametrize(
    "prefix, sizes",
    [([4096], [64]), ([1000, 3000, 17, 0], [16, 64, 130, 5]), ([8192] * 4, [16] * 4), ([300], [1])],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_low_precision_vs_fp32_reference(prefix, sizes, dtype) -> None:
    inp = make_tree_attention_inputs(prefix, sizes, dtype=dtype, device="cuda", seed=11, slack=5)
    out = run(inp)
    ref_inp = [t.float() if t.is_floating_point() else t for t in inp.args()]
    ref = reference_tree_attention(*ref_inp)
    assert np.isfinite(out.float().cpu().numpy()).all()
    assert rel_err(out, ref) < 1e-2


@pytest.mark.gpu
def test_gpu_timeline_stamps() -> None:
    """The timeline probe (stamps) leaves the output unchanged and stamps every program of both
    kernels with ordered, non-zero globaltimer readings and a valid SM id; the batch-1 default
    launch gives the tree keys programs of their own."""
    inp = make_tree_attention_inputs([4096], [16], dtype=torch.bfloat16, device="cuda", seed=4)
    plain = run(inp)
    stamps: list[torch.Tensor] = []
    out = run(inp, stamps=stamps)
    assert torch.equal(out, plain)
    assert len(stamps) == 2  # attention programs, then merge programs
    attn, merge = (t.cpu() for t in stamps)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    assert attn.shape[0] % 8 == 0 and attn.shape[0] // 8 >= 2  # splits x 8 KV heads
    assert (attn[:, :5] > 0).all() and (attn[:, 1:5] >= attn[:, 0:4]).all()
    assert ((attn[:, 7] >= 0) & (attn[:, 7] < sms)).all()
    assert (merge[:, :3] > 0).all() and (merge[:, 1:3] >= merge[:, 0:2]).all()
    assert merge[:, 1].min() >= attn[:, 4].max()  # the merge waits for every attention program
