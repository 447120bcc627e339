"""Triton kernels for tree verification (tree attention, verification, KV compaction), each with a
torch reference and a seeded input builder. Needs the `gpu` extra (torch, triton).

Tensor layouts are in spectune/kernels/layout.py; in short, per batch of B trees:
q [total_q, Hq, D], K/V cache [slots, Hkv, D] (+ optional leading layers axis for compaction),
qo_indptr / kv_indptr int32[B+1], kv_lens int32[B] (tree K/V are the last N_b used slots),
tree_mask int64[total_q, ceil(max N / 64)], parents int32[total_q] (local), tokens int64[total_q].
"""

try:
    import torch  # noqa: F401
    import triton  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the gpu extra
    raise ImportError(
        "spectune.kernels needs torch and triton; install the `gpu` extra: "
        "pip install 'spectune[gpu]'"
    ) from exc

from spectune.kernels.kv_compact import (
    CompactInputs,
    compact_kv,
    make_compact_inputs,
    reference_compact_kv,
)
from spectune.kernels.layout import PackedTrees, pack_trees, random_trees
from spectune.kernels.sampling import reference_sample_target, sample_target
from spectune.kernels.tree_attention import TreeAttentionConfig, tree_attention
from spectune.kernels.tree_attention_reference import (
    TreeAttentionInputs,
    make_tree_attention_inputs,
    reference_tree_attention,
)
from spectune.kernels.verify import (
    VerifyInputs,
    VerifyResult,
    make_verify_inputs,
    reference_walk_tree,
    verify_greedy,
    verify_stochastic,
    walk_tree,
)

__all__ = [
    "CompactInputs",
    "PackedTrees",
    "TreeAttentionConfig",
    "TreeAttentionInputs",
    "VerifyInputs",
    "VerifyResult",
    "compact_kv",
    "make_compact_inputs",
    "make_tree_attention_inputs",
    "make_verify_inputs",
    "pack_trees",
    "random_trees",
    "reference_compact_kv",
    "reference_sample_target",
    "reference_tree_attention",
    "reference_walk_tree",
    "sample_target",
    "tree_attention",
    "verify_greedy",
    "verify_stochastic",
    "walk_tree",
]
