"""KV compaction: after verification, move the accepted path's K/V rows from their tree slots to
contiguous cache positions, so the next step's prefix is dense.

Sequence b's tree node i sits at slot kv_indptr[b] + prefix_lens[b] + i (layout.py). For path
entry j (accepted_nodes[b, j], root first, j = 0 .. num_accepted[b]) the row moves from
slot ... + accepted_nodes[b, j] to slot ... + j. Entry 0 is the root (node 0), already in place;
after compaction the sequence holds prefix_lens[b] + num_accepted[b] + 1 valid slots (the bonus
token's K/V comes with the next step, where it is the new root).

In-place safety: along a root path node indices strictly increase (accepted_nodes[b, j] >= j),
yet one entry's destination can be an earlier entry's source (path [0, 2, 5]: entry 1 reads
slot 2, entry 2 writes slot 2). Each program therefore loads all of its rows, waits at a
barrier, then stores. Programs split the (head, dim) columns, so no two programs touch one element.

Bytes: 2 (K, V) x 2 (read + write) x moved rows x layers x kv_heads x head_dim x elem; rows
already in place (accepted_nodes[b, j] == j, e.g. a fully accepted chain) are skipped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from spectune.kernels.layout import random_trees


@triton.jit
def _kv_compact_kernel(
    K, V, KV_START, PREFIX, PATH, NUM_ACC, path_width,
    stride_kl, stride_kt, stride_kh, stride_vl, stride_vt, stride_vh,
    num_cols, num_col_blocks,
    HEAD_DIM: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    layer = tl.program_id(1).to(tl.int64)
    cb = tl.program_id(2)
    count = tl.load(NUM_ACC + b)
    base = tl.load(KV_START + b).to(tl.int64) + tl.load(PREFIX + b)
    j = tl.arange(0, BLOCK_P)
    src = tl.load(PATH + b.to(tl.int64) * path_width + j, mask=(j >= 1) & (j <= count), other=0)
    move = (j >= 1) & (j <= count) & (src != j)
    c = cb * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < num_cols
    h = c // HEAD_DIM
    d = c % HEAD_DIM
    ok = move[:, None] & c_ok[None, :]
    k_off = layer * stride_kl + h[None, :] * stride_kh + d[None, :]
    v_off = layer * stride_vl + h[None, :] * stride_vh + d[None, :]
    k_rows = K + k_off
    v_rows = V + v_off
    k = tl.load(k_rows + (base + src)[:, None] * stride_kt, mask=ok)
    v = tl.load(v_rows + (base + src)[:, None] * stride_vt, mask=ok)
    tl.debug_barrier()  # every read of this program lands before any write
    tl.store(k_rows + (base + j)[:, None] * stride_kt, k, mask=ok)
    tl.store(v_rows + (base + j)[:, None] * stride_vt, v, mask=ok)


def _as_layers(t: torch.Tensor, name: str) -> torch.Tensor:
    if t.dim() == 3:
        return t.unsqueeze(0)
    if t.dim() == 4:
        return t
    raise ValueError(
        f"{name} must be [slots, kv_heads, head_dim] or [layers, slots, kv_heads, head_dim]"
    )


def compact_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    accepted_nodes: torch.Tensor,
    num_accepted: torch.Tensor,
    *,
    block_c: int | None = None,
) -> None:
    """Move accepted K/V rows into place, in place, for every layer at once.

    k_cache, v_cache: [slots, kv_heads, head_dim] or [layers, slots, kv_heads, head_dim]
        (last dim contiguous); kv_indptr: int32[B+1] (or [B]) start slot of each sequence;
    prefix_lens: int32[B] cached tokens before the tree (tree node i at prefix + i);
    accepted_nodes: int32[B, P], num_accepted: int32[B] (VerifyResult of verify.py).
    """
    k4, v4 = _as_layers(k_cache, "k_cache"), _as_layers(v_cache, "v_cache")
    if k4.shape != v4.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ"
        )
    if k4.stride(3) != 1 or v4.stride(3) != 1:
        raise ValueError("the caches need a contiguous head_dim")
    batch = prefix_lens.numel()
    for name, t in (
        ("kv_indptr", kv_indptr),
        ("prefix_lens", prefix_lens),
        ("num_accepted", num_accepted),
    ):
        if t.dtype != torch.int32:
            raise ValueError(f"{name} must be int32")
    if (
        accepted_nodes.dtype != torch.int32
        or accepted_nodes.dim() != 2
        or accepted_nodes.shape[0] != batch
    ):
        raise ValueError(f"accepted_nodes must be int32[B={batch}, P]")
    if not accepted_nodes.is_contiguous():
        raise ValueError("accepted_nodes must be contiguous")
    if kv_indptr.numel() < batch or num_accepted.numel() != batch:
        raise ValueError("kv_indptr needs >= B entries and num_accepted B entries")
    if batch == 0:
        return
    layers, _, heads, dim = k4.shape
    width = accepted_nodes.shape[1]
    cols = heads * dim
    if block_c is None:
        block_c = 256 if k_cache.device.type == "cuda" else 64
    block_c = min(block_c, triton.next_power_of_2(cols))
    col_blocks = triton.cdiv(cols, block_c)
    _kv_compact_kernel[(batch, layers, col_blocks)](
        k4, v4, kv_indptr, prefix_lens, accepted_nodes, num_accepted, width,
        k4.stride(0), k4.stride(1), k4.stride(2), v4.stride(0), v4.stride(1), v4.stride(2),
        cols, col_blocks,
        HEAD_DIM=dim, BLOCK_P=max(2, triton.next_power_of_2(width)), BLOCK_C=block_c, num_warps=4,
    )  # fmt: skip


def reference_compact_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    prefix_lens: torch.Tensor,
    accepted_nodes: torch.Tensor,
    num_accepted: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Out-of-place torch version: returns compacted copies of (k_cache, v_cache)."""
    k, v = k_cache.clone(), v_cache.clone()
    layer_dim = k.dim() - 3  # slots axis
    for b in range(prefix_lens.numel()):
        base = int(kv_indptr[b]) + int(prefix_lens[b])
        cnt = int(num_accepted[b])
        src = base + accepted_nodes[b, : cnt + 1].long().cpu()
        dst = base + torch.arange(cnt + 1)
        k.index_copy_(
            layer_dim, dst.to(k.device), k_cache.index_select(layer_dim, src.to(k.device))
        )
        v.index_copy_(
            layer_dim, dst.to(v.device), v_cache.index_select(layer_dim, src.to(v.device))
        )
    return k, v


@dataclass
class CompactInputs:
    k_cache: torch.Tensor  # [layers, slots, kv_heads, head_dim]
    v_cache: torch.Tensor
    kv_indptr: torch.Tensor  # int32[B+1]
    prefix_lens: torch.Tensor  # int32[B]
    accepted_nodes: torch.Tensor  # int32[B, P]
    num_accepted: torch.Tensor  # int32[B]

    def args(self) -> tuple[torch.Tensor, ...]:
        return (
            self.k_cache,
            self.v_cache,
            self.kv_indptr,
            self.prefix_lens,
            self.accepted_nodes,
            self.num_accepted,
        )


def make_compact_inputs(
    prefix_lens: list[int],
    tree_sizes: list[int],
    layers: int = 2,
    kv_heads: int = 2,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    max_depth: int = 16,
) -> CompactInputs:
    """Seeded random caches and, per sequence, the root path to a random node as the accepted path."""
    rng = np.random.default_rng(seed)
    trees = random_trees(rng, tree_sizes, max_depth=max_depth)
    lens = np.asarray(prefix_lens, dtype=np.int64) + np.asarray(tree_sizes, dtype=np.int64)
    starts = np.zeros(len(trees) + 1, dtype=np.int64)
    starts[1:] = np.cumsum(lens)
    width = max(1, max(t.max_depth + 1 for t in trees))
    path = np.full((len(trees), width), -1, dtype=np.int32)
    count = np.zeros(len(trees), dtype=np.int32)
    for b, t in enumerate(trees):
        p = t.path_to(int(rng.integers(0, t.num_nodes)))
        path[b, : p.size] = p
        count[b] = p.size - 1
    gen = torch.Generator(device=device).manual_seed(seed)
    shape = (layers, int(starts[-1]), kv_heads, head_dim)
    return CompactInputs(
        k_cache=torch.randn(shape, generator=gen, device=device).to(dtype),
        v_cache=torch.randn(shape, generator=gen, device=device).to(dtype),
        kv_indptr=torch.from_numpy(starts.astype(np.int32)).to(device),
        prefix_lens=torch.tensor(list(prefix_lens), dtype=torch.int32, device=device),
        accepted_nodes=torch.from_numpy(path).to(device),
        num_accepted=torch.from_numpy(count).to(device),
    )
