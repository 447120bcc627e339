"""Every Triton kernel of spectune, each with a host wrapper (checks shapes, allocates, launches),
a plain torch `reference_*` and a seeded `make_*inputs`. Needs the `gpu` extra (torch, triton).

Modules: tree_attention (+ _config: launch and split choice, _plan: plan once per shape / run
per step, _reference), ragged_plan (tree attention over packed pruned trees, per token bucket),
span_attention (+ _reference: few queries over a prefix plus a masked key span, the drafter's
attention), verify (greedy / stochastic tree walk; verify_rule: token-level recursive rejection,
Traversal Verification, SpecTr on probability rows), sampling (fused argmax / Gumbel-max),
kv_compact, fused_moe, gemm (split-K weight GEMMs and their per-shape plan), gemm_fused
(weight GEMMs carrying a layer's RMSNorm, residual add, SwiGLU or RoPE + K/V store), elementwise
(add + RMSNorm, silu * up), rope (RoPE, fused with the K/V store), timing (CUDA-event timers).

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

from spectune.kernels.elementwise import (
    add_rmsnorm,
    make_elementwise_inputs,
    reference_add_rmsnorm,
    reference_silu_mul,
    silu_mul,
)
from spectune.kernels.gemm import (
    GemmPlan,
    linear,
    linear_gated,
    make_gemm_inputs,
    reference_linear,
    splitk_linear,
)
from spectune.kernels.gemm_fused import (
    RopeStore,
    fused_linear,
    make_fused_linear_inputs,
    reference_fused_linear,
)
from spectune.kernels.gemm_fused_config import (
    FusedLinearConfig,
    LayerGemmPlan,
)
from spectune.kernels.kv_compact import (
    CompactInputs,
    compact_kv,
    make_compact_inputs,
    reference_compact_kv,
)
from spectune.kernels.layout import PackedTrees, mask_words, pack_trees, random_trees
from spectune.kernels.ragged_plan import RaggedBucket, RaggedTreePlan, token_bucket
from spectune.kernels.rope import (
    make_rope_inputs,
    reference_rope_,
    rope_,
    rope_scatter_,
    rope_store_,
    rope_tables,
)
from spectune.kernels.sampling import reference_sample_target, sample_target
from spectune.kernels.span_attention import span_attention
from spectune.kernels.span_attention_reference import (
    SpanAttentionInputs,
    make_span_attention_inputs,
    reference_span_attention,
)
from spectune.kernels.tree_attention import tree_attention
from spectune.kernels.tree_attention_config import TreeAttentionConfig, plan_launch
from spectune.kernels.tree_attention_plan import HeadShape, TreeAttentionPlan, tune_tree_attention
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
    verify_rule,
    verify_stochastic,
    walk_tree,
)

__all__ = [
    "CompactInputs",
    "FusedLinearConfig",
    "GemmPlan",
    "HeadShape",
    "LayerGemmPlan",
    "PackedTrees",
    "RaggedBucket",
    "RaggedTreePlan",
    "RopeStore",
    "SpanAttentionInputs",
    "TreeAttentionConfig",
    "TreeAttentionInputs",
    "TreeAttentionPlan",
    "VerifyInputs",
    "VerifyResult",
    "add_rmsnorm",
    "compact_kv",
    "fused_linear",
    "linear",
    "linear_gated",
    "make_compact_inputs",
    "make_elementwise_inputs",
    "make_fused_linear_inputs",
    "make_gemm_inputs",
    "make_rope_inputs",
    "make_span_attention_inputs",
    "make_tree_attention_inputs",
    "make_verify_inputs",
    "mask_words",
    "pack_trees",
    "plan_launch",
    "random_trees",
    "reference_add_rmsnorm",
    "reference_compact_kv",
    "reference_fused_linear",
    "reference_linear",
    "reference_rope_",
    "reference_sample_target",
    "reference_silu_mul",
    "reference_span_attention",
    "reference_tree_attention",
    "reference_walk_tree",
    "rope_",
    "rope_scatter_",
    "rope_store_",
    "rope_tables",
    "sample_target",
    "silu_mul",
    "span_attention",
    "splitk_linear",
    "token_bucket",
    "tree_attention",
    "tune_tree_attention",
    "verify_greedy",
    "verify_rule",
    "verify_stochastic",
    "walk_tree",
]
