"""How a batch of draft trees is laid out for the kernels (one flat, ragged layout for all three).

A batch of B trees with N_b nodes each is flattened in sequence order: node i of sequence b is
row `qo_indptr[b] + i` of every per-node tensor (`total_q = qo_indptr[B]`).

    qo_indptr:  int32[B+1]        row offsets of each sequence's tree nodes
    parents:    int32[total_q]    parent of each node, as a LOCAL index (root: -1)
    tokens:     int64[total_q]    token id of each node (root: the last verified token)
    tree_mask:  int64[total_q, W] ancestor bitmask, W = ceil(max N_b / 64); bit (j % 64) of word
                                  j // 64 of row i is set when local node j is i or an ancestor
                                  of i (DraftTree.ancestor_bitmask, uint64 bits viewed as int64)

KV cache (tree attention and KV compaction), one layer:

    k_cache, v_cache: [kv_slots, num_kv_heads, head_dim]   (any strides; last dim contiguous)
    kv_indptr:  int32[B+1]   sequence b owns slots kv_indptr[b] .. kv_indptr[b+1]-1
    kv_lens:    int32[B]     slots in use by b: prefix_len_b + N_b; the tree tokens' K/V sit in
                             the LAST N_b used slots, in node order (tree node i at slot
                             kv_indptr[b] + prefix_len_b + i). Defaults to diff(kv_indptr).

A packed cache uses kv_lens = diff(kv_indptr); a fixed-capacity cache [B, max_len, H, D] is
viewed as [B * max_len, H, D] with kv_indptr = arange(B + 1) * max_len and kv_lens = used rows.

`pack_trees` builds this layout on the host from DraftTrees; `mask_words` builds the bitmask on
the device from a bool ancestor matrix (fixed shapes, no host sync: what a CUDA graph needs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from spectune.specs import DraftTree


@dataclass(frozen=True)
class PackedTrees:
    """A batch of DraftTrees in the flat kernel layout (see the module docstring)."""

    qo_indptr: torch.Tensor  # int32[B+1]
    parents: torch.Tensor  # int32[total_q], local indices
    tokens: torch.Tensor  # int64[total_q]
    tree_mask: torch.Tensor  # int64[total_q, W]
    max_nodes: int  # max N_b
    max_depth: int  # max depth over the batch

    @property
    def batch(self) -> int:
        return int(self.qo_indptr.numel() - 1)


def pack_trees(trees: Sequence[DraftTree], device: torch.device | str = "cpu") -> PackedTrees:
    """Flatten a batch of DraftTrees into the kernel layout (host-side numpy, one copy to device)."""
    if not trees:
        raise ValueError("pack_trees needs at least one tree")
    sizes = np.array([t.num_nodes for t in trees], dtype=np.int64)
    max_nodes = int(sizes.max())
    words = (max_nodes + 63) // 64
    indptr = np.zeros(len(trees) + 1, dtype=np.int32)
    indptr[1:] = np.cumsum(sizes)
    mask = np.zeros((int(indptr[-1]), words), dtype=np.uint64)
    for b, t in enumerate(trees):
        bm = t.ancestor_bitmask
        mask[indptr[b] : indptr[b + 1], : bm.shape[1]] = bm
    parents = np.concatenate([t.parents for t in trees]).astype(np.int32)
    tokens = np.concatenate([t.tokens for t in trees]).astype(np.int64)
    return PackedTrees(
        qo_indptr=torch.from_numpy(indptr).to(device),
        parents=torch.from_numpy(parents).to(device),
        tokens=torch.from_numpy(tokens).to(device),
        tree_mask=torch.from_numpy(mask.view(np.int64)).to(device),
        max_nodes=max_nodes,
        max_depth=max(t.max_depth for t in trees),
    )


def random_trees(
    rng: np.random.Generator,
    sizes: Sequence[int],
    max_depth: int = 16,
    vocab: int = 32000,
) -> list[DraftTree]:
    """Seeded random DraftTrees of the given node counts (depth capped), for make_inputs."""
    out = []
    for n in sizes:
        parents = np.full(n, -1, dtype=np.int64)
        depth = np.zeros(n, dtype=np.int64)
        for i in range(1, n):
            ok = np.flatnonzero(depth[:i] < max_depth)
            p = int(rng.choice(ok))
            parents[i] = p
            depth[i] = depth[p] + 1
        out.append(DraftTree.from_parents(parents, tokens=rng.integers(0, vocab, n)))
    return out


def word_bits(words: int, device: torch.device) -> torch.Tensor:
    """int64[words, 64]: the value of bit j of each mask word (bit 63 is the sign bit)."""
    j = torch.arange(words * 64, device=device)
    bits = torch.where(j % 64 == 63, torch.iinfo(torch.int64).min, 1 << (j % 64).clamp(max=62))
    return bits.view(words, 64)


def mask_words(rows: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """bool[R, n] mask rows -> int64[R, words] bitmask words, with bits = word_bits(words, .)
    (a sum of distinct bits is their OR). Fixed shapes, no host sync."""
    r, n = rows.shape
    words = bits.shape[0]
    full = torch.zeros((r, words * 64), dtype=torch.int64, device=rows.device)
    full[:, :n] = rows.long()
    return (full.view(r, words, 64) * bits).sum(-1)


def unpack_mask_row(mask_row: np.ndarray, n: int) -> np.ndarray:
    """bool[n] from one int64[W] bitmask row (test helper)."""
    bits = np.unpackbits(mask_row.astype(np.int64).view(np.uint8), bitorder="little")
    return bits[:n].astype(bool)
