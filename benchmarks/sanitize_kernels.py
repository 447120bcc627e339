"""Run every spectune kernel once on small GPU inputs, for `compute-sanitizer --tool memcheck`.

    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck --error-exitcode 9 \\
        python benchmarks/sanitize_kernels.py
    (add --tool racecheck for the fused MoE grouping kernel's shared-memory cursors)

(PYTORCH_NO_CUDA_MEMORY_CACHING gives each tensor its own allocation, so an out-of-bounds access
is not hidden inside a larger cached block.) Each kernel is also checked against its reference.
"""

from __future__ import annotations

import torch

from spectune.kernels import (
    HeadShape,
    RaggedTreePlan,
    TreeAttentionConfig,
    add_rmsnorm,
    compact_kv,
    make_compact_inputs,
    make_elementwise_inputs,
    make_gemm_inputs,
    make_rope_inputs,
    make_span_attention_inputs,
    make_tree_attention_inputs,
    make_verify_inputs,
    reference_add_rmsnorm,
    reference_compact_kv,
    reference_linear,
    reference_span_attention,
    reference_tree_attention,
    reference_walk_tree,
    rope_scatter_,
    rope_store_,
    sample_target,
    silu_mul,
    span_attention,
    splitk_linear,
    tree_attention,
    verify_greedy,
    verify_stochastic,
)
from spectune.kernels.fused_moe import fused_moe, make_moe_inputs, reference_moe, route_topk


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm())


def decoder_kernels(dev: str, dtype: torch.dtype = torch.bfloat16) -> None:
    """The kernels of a decoder layer: span attention (drafting), add + RMSNorm, silu * up,
    RoPE + K/V store (contiguous and scattered), split-K GEMMs, a ragged tree-attention bucket."""
    for batch, tokens, span, context in ((1, 1, 1, 3000), (4, 10, 31, 700), (2, 40, 40, 300)):
        si = make_span_attention_inputs(
            batch, tokens, span, context, 32, 8, 128, dtype, dev, seed=batch
        )
        err = rel_err(span_attention(*si.args()), reference_span_attention(*si.args()))
        print(f"span_attention B={batch} N={tokens} S={span}: rel err {err:.2e}")
        assert err < 2e-2
    ei = make_elementwise_inputs(9, 4096, 1000, dtype, dev, seed=6)
    r1, r2 = ei.residual.clone(), ei.residual.clone()
    assert (
        rel_err(add_rmsnorm(ei.x, r1, ei.weight), reference_add_rmsnorm(ei.x, r2, ei.weight, 1e-5))
        < 1e-2
    )
    silu_mul(ei.gate_up)
    ri = make_rope_inputs(3, 5, 32, 8, 128, 16, dtype, dev, seed=7)
    rope_store_(ri.qkv.clone(), ri.hq, ri.hk, ri.pos, ri.cos, ri.sin, ri.kv, 4)
    rope_scatter_(ri.qkv.clone(), ri.hq, ri.hk, ri.pos, ri.dst, ri.cos, ri.sin, ri.kv)
    for gated in (False, True):
        x, w = make_gemm_inputs(37, 1000, 520, gated=gated, dtype=dtype, device=dev)
        for splits in (1, 4):
            err = rel_err(splitk_linear(x, w, splits, gated=gated), reference_linear(x, w, gated))
            assert err < 1e-2, (gated, splits, err)
    heads = HeadShape(32, 8, 128, dtype)
    lay = RaggedTreePlan(3, 20, 500, 600, heads, torch.device(dev))
    mask = torch.ones((20, 20), dtype=torch.bool, device=dev).tril().expand(3, 20, 20)
    depth = torch.arange(20, device=dev).expand(3, 20)
    tokens = torch.zeros((3, 20), dtype=torch.int64, device=dev)
    lay.set_trees(tokens, depth, mask, torch.tensor([5, 20, 1], device=dev))
    bucket = lay.bucket_plan(lay.bucket(26))
    bucket.prepare()
    kv = torch.randn((2, 3, 600, 8, 128), device=dev).to(dtype)
    bucket.run(torch.randn((1, bucket.tokens, 32, 128), device=dev).to(dtype), kv)
    print("decoder kernels ran and matched their references")


def main() -> None:
    dev = "cuda"
    for splits in (1, 3):  # direct store, and split partials + merge kernel
        for sizes, prefix in (([64, 5, 130], [300, 0, 77]), ([16], [1000])):
            inp = make_tree_attention_inputs(
                prefix, sizes, 32, 8, 128, torch.bfloat16, dev, seed=1, slack=7
            )
            out = tree_attention(*inp.args(), num_splits=splits)
            ref = reference_tree_attention(
                *[t.float() if t.is_floating_point() else t for t in inp.args()]
            )
            err = float((out.float() - ref).norm() / ref.norm())
            print(f"tree_attention sizes={sizes} splits={splits}: rel err {err:.2e}")
            assert err < 1e-2
    for cfg in (
        TreeAttentionConfig(block_m=128, block_n=64, num_warps=8),
        TreeAttentionConfig(fuse_merge=False),
        TreeAttentionConfig(fuse_merge=True, half_partials=True),
        TreeAttentionConfig(pdl=True, half_partials=True),
        TreeAttentionConfig(block_m=64, num_stages=3, pdl=True, half_partials=True),
        TreeAttentionConfig(tree_split=False, merge_warps=2),
    ):
        inp = make_tree_attention_inputs([2000], [64], 32, 8, 128, torch.float16, dev, seed=2)
        tree_attention(*inp.args(), config=cfg, num_splits=5)
    # batch 1 on its default config (13 prefix splits + the tree's own programs on an H200),
    # with the timeline probe's stamps
    inp = make_tree_attention_inputs([4096], [16], 32, 8, 128, torch.bfloat16, dev, seed=4)
    stamps: list[torch.Tensor] = []
    tree_attention(*inp.args(), stamps=stamps)
    # a trailing padding-only sequence left out of the split choice (the executor's ragged view)
    inp = make_tree_attention_inputs([1500, 0], [40, 8], 32, 8, 128, torch.bfloat16, dev, seed=5)
    tree_attention(*inp.args(), split_batch=1)
    # fused MoE: routing, grouping, grouped GEMMs and combine, against the expert loop
    for tokens in (1, 37, 300):
        mi = make_moe_inputs(tokens, experts=16, topk=4, hidden=256, inter=128,
                             dtype=torch.bfloat16, device=dev, seed=tokens)  # fmt: skip
        route_topk(mi.logits, 4)
        got = fused_moe(*mi.args()).float()
        want = reference_moe(*[t.float() if t.is_floating_point() else t for t in mi.args()])
        err = float((got - want).norm() / want.norm())
        print(f"fused_moe T={tokens}: rel err {err:.2e}")
        assert err < 1e-2
    vi = make_verify_inputs([64, 1, 130, 9], vocab=5000, dtype=torch.bfloat16, device=dev, seed=3)
    res = verify_greedy(vi.tokens, vi.parents, vi.qo_indptr, logits=vi.logits)
    ref_w = reference_walk_tree(vi.tokens, vi.parents, vi.qo_indptr, vi.logits.float().argmax(1))
    assert torch.equal(res.num_accepted.cpu(), ref_w.num_accepted)
    verify_stochastic(vi.tokens, vi.parents, vi.qo_indptr, vi.logits, 0.7, 11)
    for br in (1, 4):
        sample_target(vi.logits, 1.0, 5, block_r=br)
    ci = make_compact_inputs(
        [10, 0, 50],
        [64, 130, 2],
        layers=2,
        kv_heads=8,
        head_dim=128,
        dtype=torch.bfloat16,
        device=dev,
        seed=4,
    )
    rk, rv = reference_compact_kv(*ci.args())
    compact_kv(*ci.args())
    assert torch.equal(ci.k_cache, rk) and torch.equal(ci.v_cache, rv)
    decoder_kernels(dev)
    torch.cuda.synchronize()
    print("sanitize_kernels: all kernels ran and matched their references")


if __name__ == "__main__":
    main()
