"""Tree attention's plain-torch reference and seeded input builder (the kernel is in
tree_attention.py; layouts in layout.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from spectune.kernels.layout import PackedTrees, pack_trees, random_trees
from spectune.specs import DraftTree


def tree_mask_bool(tree_mask: torch.Tensor, rows: slice, n: int) -> torch.Tensor:
    """bool[rows, n] from bitmask rows: [i, j] = bit j of row i."""
    j = torch.arange(n, device=tree_mask.device)
    words = tree_mask[rows][:, j // 64]
    return ((words >> (j % 64)) & 1).bool()


def reference_tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    tree_mask: torch.Tensor,
    kv_lens: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
) -> torch.Tensor:
    """Plain torch, float32 (float64 for float64 inputs), one sequence at a time; returns float32/64."""
    if kv_lens is None:
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    acc_dtype = torch.float64 if q.dtype == torch.float64 else torch.float32
    total_q, hq, dim = q.shape
    group = hq // k_cache.shape[1]
    scale = (1.0 / math.sqrt(dim)) if sm_scale is None else sm_scale
    out = torch.zeros((total_q, hq, dim), dtype=acc_dtype, device=q.device)
    qo = qo_indptr.tolist()
    kv0 = kv_indptr.tolist()
    lens = kv_lens.tolist()
    for b in range(len(qo) - 1):
        n = qo[b + 1] - qo[b]
        if n == 0:
            continue
        prefix = lens[b] - n
        keys = k_cache[kv0[b] : kv0[b] + lens[b]].to(acc_dtype).repeat_interleave(group, dim=1)
        vals = v_cache[kv0[b] : kv0[b] + lens[b]].to(acc_dtype).repeat_interleave(group, dim=1)
        qs = q[qo[b] : qo[b + 1]].to(acc_dtype)  # [n, hq, d]
        scores = torch.einsum("nhd,khd->hnk", qs, keys) * scale  # [hq, n, kv]
        allowed = torch.ones((n, lens[b]), dtype=torch.bool, device=q.device)
        allowed[:, prefix:] = tree_mask_bool(tree_mask, slice(qo[b], qo[b + 1]), n)
        scores = scores.masked_fill(~allowed[None], float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
        out[qo[b] : qo[b + 1]] = torch.einsum("hnk,khd->nhd", probs, vals)
    return out


@dataclass
class TreeAttentionInputs:
    """Tensors for one tree_attention call (field names are the wrapper's arguments)."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    tree_mask: torch.Tensor
    kv_lens: torch.Tensor
    max_q_len: int
    max_kv_len: int
    trees: list[DraftTree] = field(repr=False)

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.q,
            self.k_cache,
            self.v_cache,
            self.qo_indptr,
            self.kv_indptr,
            self.tree_mask,
            self.kv_lens,
        )

    @property
    def kv_bytes(self) -> int:
        """Bytes of K and V the kernel must read (used slots only)."""
        row = self.k_cache.shape[1] * self.k_cache.shape[2] * self.k_cache.element_size()
        return 2 * int(self.kv_lens.sum().item()) * row


def make_tree_attention_inputs(
    prefix_lens: list[int] | np.ndarray,
    tree_sizes: list[int] | np.ndarray,
    num_q_heads: int = 32,
    num_kv_heads: int = 8,
    head_dim: int = 128,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    seed: int = 0,
    max_depth: int = 16,
    trees: list[DraftTree] | None = None,
    slack: int = 0,
) -> TreeAttentionInputs:
    """Seeded random inputs: random trees of `tree_sizes` nodes over `prefix_lens` cached tokens,
    K/V packed per sequence (plus `slack` unused slots after each sequence, to test kv_lens)."""
    rng = np.random.default_rng(seed)
    if trees is None:
        trees = random_trees(rng, [int(n) for n in tree_sizes], max_depth=max_depth)
    packed: PackedTrees = pack_trees(trees, device)
    lens = np.asarray(prefix_lens, dtype=np.int64) + np.array([t.num_nodes for t in trees])
    starts = np.zeros(len(trees) + 1, dtype=np.int64)
    starts[1:] = np.cumsum(lens + slack)
    slots = int(starts[-1])
    gen = torch.Generator(device=device).manual_seed(seed)
    total_q = int(packed.qo_indptr[-1].item())

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device, dtype=torch.float32).to(dtype)

    return TreeAttentionInputs(
        q=randn(total_q, num_q_heads, head_dim),
        k_cache=randn(slots, num_kv_heads, head_dim),
        v_cache=randn(slots, num_kv_heads, head_dim),
        qo_indptr=packed.qo_indptr,
        kv_indptr=torch.from_numpy(starts.astype(np.int32)).to(device),
        tree_mask=packed.tree_mask,
        kv_lens=torch.from_numpy(lens.astype(np.int32)).to(device),
        max_q_len=packed.max_nodes,
        max_kv_len=int(lens.max()),
        trees=trees,
    )
