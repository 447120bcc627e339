"""Tree attention for verification: N tree tokens per sequence attend to the whole cached prefix
(no mask) and to their ancestors among the tree tokens (ancestor bitmask rows).

Layouts (see spectune.kernels.layout): q [total_q, num_q_heads, head_dim]; K/V cache
[kv_slots, num_kv_heads, head_dim] with kv_indptr / kv_lens; the tree tokens' K/V are the last
N_b used slots of each sequence, in node order; tree_mask int64[total_q, W].

Work decomposition, one program per (m-block, split x kv head, sequence):
- GQA packing: the G = num_q_heads / num_kv_heads query heads of one KV head and the N tree
  tokens form one tile of G*N rows (row r = token r // G, head r % G), so each K/V byte is read
  once per group (twice from L2 when G*N > BLOCK_M; the m-blocks are the fastest grid axis so
  they run together and share K/V through L2).
- Flash-decoding: each sequence's prefix is cut into S splits (whole key blocks each) so that
  batch 1 fills the GPU.
  The tree keys (under the bitmask) go to one more program per tile where it fits in the last
  round (tree_split_fits), else to the last split. With S > 1 every split writes
  a float32 partial output and its log-sum-exp; `_merge_splits_kernel` combines them. With
  S == 1 the kernel writes the final output directly (no second launch, no partials).

The split count and tile config come from tree_attention_config.plan_launch (per call, or once
per shape by a caller that plans: tree_attention_plan.py). The torch reference and the seeded
input builder are in tree_attention_reference.py.

Roofline per call: bytes = K + V of every used slot, read once = 2 * sum(kv_lens) * Hkv * D *
elem (+ q and out, + 2 * S * total_q * Hq * D * 4 of partials when S > 1); FLOPs = 4 *
total_q * Hq * D * (mean kv_len) (QK^T and PV), so at G*N rows per KV head the arithmetic
intensity is about G*N FLOP per KV byte (H100 ridge ~ 300): N=16 is memory bound, N=64 near
balanced.
"""

from __future__ import annotations

import math
import os
from functools import lru_cache

import torch
import triton
import triton.language as tl

from spectune.kernels.tree_attention_config import TreeAttentionConfig, plan_launch

LOG2E = 1.4426950408889634


@triton.jit
def _softmax_step(
    q, k, v, m_i, l_i, acc, qk_scale, allowed, MASKED: tl.constexpr, DOT_PREC: tl.constexpr
):
    """One key block of online softmax (base 2): scores, running max/sum, rescale, P @ V."""
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if MASKED:
        qk = tl.where(allowed, qk, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=DOT_PREC)
    return m_new, l_i, acc


@triton.jit
def _tree_attention_kernel(
    Q, K, V, MASK, QO_INDPTR, KV_START, KV_LENS, OUT, O_PART, LSE_PART, SEM, STAMPS,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_ot, stride_oh, stride_mt, stride_ps, stride_ls,
    num_kv_heads, num_q_heads, num_splits, prefix_splits, qk_scale,
    G: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, TREE_BLOCK: tl.constexpr,
    DIRECT: tl.constexpr, DOT_PREC: tl.constexpr, EVEN_D: tl.constexpr, FUSE_MERGE: tl.constexpr,
    PDL: tl.constexpr, BLOCK_S: tl.constexpr, STAMP: tl.constexpr,
):  # fmt: skip
    pid_m = tl.program_id(0)
    pid_sh = tl.program_id(1)
    b = tl.program_id(2)
    if STAMP:  # timeline probe: globaltimer (ns) at entry, after each phase, and the SM id
        stamp = STAMPS + ((b * tl.num_programs(1) + pid_sh) * tl.num_programs(0) + pid_m) * 8
        tl.store(stamp, tl.extra.cuda.globaltimer())
        tl.store(stamp + 7, tl.extra.cuda.smid().to(tl.int64))
    if PDL:  # let the merge launch now; wait for the previous kernel's writes before reading
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    split = pid_sh // num_kv_heads
    kvh = pid_sh % num_kv_heads

    # the four per-sequence scalars are independent loads: issue them together (one round trip)
    q_start = tl.load(QO_INDPTR + b)
    q_end = tl.load(QO_INDPTR + b + 1)
    kv_start = tl.load(KV_START + b).to(tl.int64)
    kv_len = tl.load(KV_LENS + b)
    n = q_end - q_start
    if pid_m * BLOCK_M >= n * G:
        return
    prefix = kv_len - n
    is_last = split == num_splits - 1
    # this sequence's prefix in prefix_splits chunks of whole key blocks (a short sequence
    # leaves its last splits empty); with a tree split (prefix_splits = num_splits - 1) the last
    # program's range starts past the prefix, so it attends to the tree keys only
    chunk = tl.cdiv(tl.cdiv(prefix, prefix_splits), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, prefix)

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    tok = rows // G
    head = kvh * G + rows % G
    row_ok = tok < n
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    q_rows = (q_start + tok).to(tl.int64)
    q = tl.load(
        Q + q_rows[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :],
        mask=row_ok[:, None] & d_ok[None, :],
        other=0.0,
    )
    k_base = K + kv_start * stride_kt + kvh * stride_kh
    v_base = V + kv_start * stride_vt + kvh * stride_vh

    if STAMP:
        tl.store(stamp + 1, tl.extra.cuda.globaltimer())

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    # Prefix keys of this split: no mask (reads 2 * (hi - lo) * D elements of K/V). Full blocks
    # load without predicates; only a sequence's last split can end in a partial block.
    hi_full = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
    for start in range(lo, hi_full, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        k_ptrs = k_base + cols[:, None] * stride_kt + d[None, :]
        v_ptrs = v_base + cols[:, None] * stride_vt + d[None, :]
        if EVEN_D:
            k = tl.load(k_ptrs)
            v = tl.load(v_ptrs)
        else:
            k = tl.load(k_ptrs, mask=d_ok[None, :], other=0.0)
            v = tl.load(v_ptrs, mask=d_ok[None, :], other=0.0)
        m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, qk_scale, None, False, DOT_PREC)
    if hi_full < hi:
        cols = hi_full + tl.arange(0, BLOCK_N)
        col_ok = cols < hi
        kv_mask = col_ok[:, None] & d_ok[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kt + d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_base + cols[:, None] * stride_vt + d[None, :], mask=kv_mask, other=0.0)
        m_i, l_i, acc = _softmax_step(
            q, k, v, m_i, l_i, acc, qk_scale, col_ok[None, :], True, DOT_PREC
        )

    if STAMP:
        tl.store(stamp + 2, tl.extra.cuda.globaltimer() + (tl.sum(l_i, 0) == -1.0).to(tl.int64))

    # Tree keys (last split only): key j allowed for row token t when bit j of its mask row is set.
    if is_last:
        mask_rows = MASK + q_rows * stride_mt
        for start in range(0, n, TREE_BLOCK):
            cols = start + tl.arange(0, TREE_BLOCK)
            col_ok = cols < n
            word = tl.load(mask_rows + start // 64, mask=row_ok, other=0)  # one word per row
            shift = (cols % 64).to(tl.int64)
            bit = (word[:, None] >> shift[None, :]) & 1
            allowed = (bit != 0) & col_ok[None, :]
            kv_mask = col_ok[:, None] & d_ok[None, :]
            slot = prefix + cols
            k = tl.load(k_base + slot[:, None] * stride_kt + d[None, :], mask=kv_mask, other=0.0)
            v = tl.load(v_base + slot[:, None] * stride_vt + d[None, :], mask=kv_mask, other=0.0)
            m_i, l_i, acc = _softmax_step(q, k, v, m_i, l_i, acc, qk_scale, allowed, True, DOT_PREC)
    if STAMP:
        tl.store(stamp + 3, tl.extra.cuda.globaltimer() + (tl.sum(l_i, 0) == -1.0).to(tl.int64))

    l_safe = tl.where(l_i > 0.0, l_i, 1.0)
    o = acc / l_safe[:, None]
    out_mask = row_ok[:, None] & d_ok[None, :]
    if DIRECT:
        o_ptrs = OUT + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
        tl.store(o_ptrs, o.to(OUT.dtype.element_ty), mask=out_mask)
    else:
        # partials: O_PART float32 (or q's dtype)[S, total_q * Hq, BLOCK_D],
        # LSE_PART float32[S, total_q * Hq]
        qh = q_rows * num_q_heads + head
        p_ptrs = O_PART + split * stride_ps + qh[:, None] * BLOCK_D + d[None, :]
        tl.store(p_ptrs, o.to(O_PART.dtype.element_ty), mask=out_mask)
        lse = tl.where(l_i > 0.0, m_i + tl.log2(l_safe), float("-inf"))
        tl.store(LSE_PART + split * stride_ls + qh, lse, mask=row_ok)
        if FUSE_MERGE:
            # The last split to finish this (sequence, KV head, m-block) tile merges all splits:
            # no second launch. Barrier: every thread's partial stores precede the release.
            tl.debug_barrier()
            ticket = SEM + (b * num_kv_heads + kvh) * tl.num_programs(0) + pid_m
            arrived = tl.atomic_add(ticket, 1, sem="acq_rel", scope="gpu")
            if arrived == num_splits - 1:
                tl.atomic_xchg(ticket, 0)  # leave the counter at zero for the next call
                # weights first (one load of every split's LSE), then the partials: the loads
                # of the loop carry no dependency, so they can be in flight together
                s_idx = tl.arange(0, BLOCK_S)
                lse_all = tl.load(
                    LSE_PART + s_idx[:, None] * stride_ls + qh[None, :],
                    mask=(s_idx[:, None] < num_splits) & row_ok[None, :],
                    other=float("-inf"), cache_modifier=".cg",
                )  # fmt: skip
                m = tl.max(lse_all, 0)
                m_ref = tl.where(m == float("-inf"), 0.0, m)
                w_sum = tl.sum(tl.exp2(lse_all - m_ref[None, :]), 0)
                merged = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
                for s in tl.range(0, num_splits, num_stages=3):
                    lse_s = tl.load(
                        LSE_PART + s * stride_ls + qh, mask=row_ok, other=float("-inf"),
                        cache_modifier=".cg",
                    )  # fmt: skip
                    o_s = tl.load(
                        O_PART + s * stride_ps + qh[:, None] * BLOCK_D + d[None, :],
                        mask=out_mask, other=0.0, cache_modifier=".cg",
                    )  # fmt: skip
                    merged += o_s.to(tl.float32) * tl.exp2(lse_s - m_ref)[:, None]
                merged = merged / tl.where(w_sum > 0.0, w_sum, 1.0)[:, None]
                o_ptrs = OUT + q_rows[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
                tl.store(o_ptrs, merged.to(OUT.dtype.element_ty), mask=out_mask)
    if STAMP:
        tl.store(stamp + 4, tl.extra.cuda.globaltimer())


@triton.jit
def _merge_splits_kernel(
    O_PART, LSE_PART, OUT, STAMPS, num_splits, num_q_heads, stride_ps, stride_ls, stride_ot,
    stride_oh, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr,
    PDL: tl.constexpr, STAMP: tl.constexpr,
):  # fmt: skip
    """One program per (tree token, query head): out = sum_s w_s o_s / sum_s w_s, w_s = 2^lse_s.
    (Several rows per program as one [S, rows, D] load measured ~2x slower on an H200.)"""
    if STAMP:  # timeline probe: entry, after the wait, end (ns) and the SM id
        stamp = STAMPS + tl.program_id(0) * 8
        tl.store(stamp, tl.extra.cuda.globaltimer())
        tl.store(stamp + 7, tl.extra.cuda.smid().to(tl.int64))
    if PDL:  # launched early (programmatic dependent launch): let a PDL successor (the fused
        # o projection) launch and pull its weights into L2 now, then wait for the partials
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    if STAMP:
        tl.store(stamp + 1, tl.extra.cuda.globaltimer())
    qh = tl.program_id(0).to(tl.int64)
    t = qh // num_q_heads
    h = qh % num_q_heads
    s = tl.arange(0, BLOCK_S)
    s_ok = s < num_splits
    d = tl.arange(0, BLOCK_D)
    lse = tl.load(LSE_PART + s * stride_ls + qh, mask=s_ok, other=float("-inf"))
    o = tl.load(
        O_PART + s[:, None] * stride_ps + qh * BLOCK_D + d[None, :],
        mask=s_ok[:, None] & (d[None, :] < HEAD_DIM),
        other=0.0,
    )
    m = tl.max(lse, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m)
    w_sum = tl.sum(w, 0)
    out = tl.sum(o.to(tl.float32) * w[:, None], 0) / tl.where(w_sum > 0.0, w_sum, 1.0)
    tl.store(
        OUT + t * stride_ot + h * stride_oh + d, out.to(OUT.dtype.element_ty), mask=d < HEAD_DIM
    )
    if STAMP:
        tl.store(stamp + 2, tl.extra.cuda.globaltimer())


def _check_layouts(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_lens, tree_mask) -> None:
    if q.dim() != 3 or k_cache.dim() != 3 or v_cache.dim() != 3:
        raise ValueError("q, k_cache, v_cache must be [rows, heads, head_dim]")
    if k_cache.shape != v_cache.shape:
        raise ValueError(
            f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ"
        )
    if q.shape[2] != k_cache.shape[2]:
        raise ValueError(f"head_dim of q ({q.shape[2]}) and the cache ({k_cache.shape[2]}) differ")
    if q.shape[1] % k_cache.shape[1]:
        raise ValueError(
            f"{q.shape[1]} query heads are not a multiple of {k_cache.shape[1]} KV heads"
        )
    if q.dtype != k_cache.dtype or q.dtype != v_cache.dtype:
        raise ValueError(f"q, k, v dtypes differ: {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if t.stride(2) != 1:
            raise ValueError(f"{name} needs a contiguous last (head_dim) dimension")
    for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr), ("kv_lens", kv_lens)):
        if t.dtype != torch.int32 or t.dim() != 1:
            raise ValueError(f"{name} must be a 1-D int32 tensor, got {t.dtype} {tuple(t.shape)}")
    batch = qo_indptr.numel() - 1
    if kv_indptr.numel() != batch + 1 or kv_lens.numel() != batch:
        raise ValueError("qo_indptr, kv_indptr need B+1 entries and kv_lens B entries")
    if tree_mask.dtype != torch.int64 or tree_mask.dim() != 2 or tree_mask.shape[0] != q.shape[0]:
        raise ValueError(
            f"tree_mask must be int64[total_q={q.shape[0]}, W], got {tree_mask.dtype} {tuple(tree_mask.shape)}"
        )
    if tree_mask.stride(1) != 1:
        raise ValueError("tree_mask needs contiguous rows")
    devices = {t.device for t in (q, k_cache, v_cache, qo_indptr, kv_indptr, kv_lens, tree_mask)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {devices}")


_TICKETS: dict[torch.device, torch.Tensor] = {}


def _tickets(device: torch.device, n: int) -> torch.Tensor:
    """int32 arrival counters for the fused merge, one per (sequence, KV head, m-block) tile.

    Cached per device and left at zero by every call (the merging program resets its counter),
    so a call costs no memset. Calls must not run concurrently on two streams (they would share
    counters); the first call of a size must not happen during CUDA-graph capture."""
    buf = _TICKETS.get(device)
    if buf is None or buf.numel() < n:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise RuntimeError(
                "tree_attention: run one call of this size before CUDA-graph capture "
                "(the fused merge's counter buffer must grow outside the capture)"
            )
        buf = torch.zeros(max(n, 1 << 16), dtype=torch.int32, device=device)
        _TICKETS[device] = buf
    return buf


@lru_cache(maxsize=8)
def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: a CUDA device of compute capability 9.0+ and a Triton
    with griddepcontrol (not the interpreter)."""
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if not hasattr(tl.extra.cuda, "gdc_wait"):
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9


def tree_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    qo_indptr: torch.Tensor,
    kv_indptr: torch.Tensor,
    tree_mask: torch.Tensor,
    kv_lens: torch.Tensor | None = None,
    *,
    sm_scale: float | None = None,
    max_q_len: int | None = None,
    max_kv_len: int | None = None,
    num_splits: int | None = None,
    config: TreeAttentionConfig | None = None,
    out: torch.Tensor | None = None,
    split_batch: int | None = None,
    stamps: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    """Attention of every tree token over its sequence's prefix and its tree ancestors.

    q:         [total_q, num_q_heads, head_dim]         tree tokens, flat (qo_indptr rows)
    k_cache:   [kv_slots, num_kv_heads, head_dim]       one layer; last dim contiguous
    v_cache:   [kv_slots, num_kv_heads, head_dim]
    qo_indptr: int32[B+1]; kv_indptr: int32[B+1] (start slot of each sequence)
    tree_mask: int64[total_q, W] ancestor bitmask rows (layout.py)
    kv_lens:   int32[B] used slots (prefix + N_b; tree K/V last); default diff(kv_indptr)
    max_q_len / max_kv_len: host-side bounds of N_b and kv_lens (pass them to avoid a device
        sync, e.g. under CUDA-graph capture)
    config, num_splits: the tile config and prefix splits (default: tree_attention_config.
        plan_launch's choice); where tree_split_fits, the tree keys get one more program per
        (sequence, KV head, m-block)
    split_batch: sequences the split count is chosen for (default: all B); a caller whose
        last sequence only holds padding rows passes B - 1, so the padding does not halve the
        splits of a batch-1 call
    stamps:    a timeline probe (benchmarks/probe_batch1.py): when a list is given, the call
        appends int64 [programs, 8] tensors of globaltimer readings (ns; column 7 the SM id) for
        the attention kernel and, with splits, the merge kernel
    returns    [total_q, num_q_heads, head_dim] in q's dtype (written into `out` if given)
    """
    if kv_lens is None:
        kv_lens = (kv_indptr[1:] - kv_indptr[:-1]).to(torch.int32)
    _check_layouts(q, k_cache, v_cache, qo_indptr, kv_indptr, kv_lens, tree_mask)
    total_q, hq, dim = q.shape
    hkv = k_cache.shape[1]
    group = hq // hkv
    batch = qo_indptr.numel() - 1
    if max_q_len is None:
        max_q_len = int((qo_indptr[1:] - qo_indptr[:-1]).max().item()) if batch else 0
    if max_kv_len is None:
        max_kv_len = int(kv_lens.max().item()) if batch else 0
    if tree_mask.shape[1] * 64 < max_q_len:
        raise ValueError(f"tree_mask has {tree_mask.shape[1]} words, too few for {max_q_len} nodes")
    if out is None:
        out = torch.empty_like(q)
    if total_q == 0 or batch == 0:
        return out
    launch = plan_launch(
        batch=batch, q_heads=hq, kv_heads=hkv, head_dim=dim, elem_bytes=q.element_size(),
        total_q=total_q, max_q_len=max_q_len, max_kv_len=max_kv_len, device=q.device,
        config=config, num_splits=num_splits, split_batch=split_batch,
    )  # fmt: skip
    cfg, m_blocks = launch.config, launch.m_blocks
    prefix_splits, splits = launch.prefix_splits, launch.splits
    block_d = triton.next_power_of_2(max(dim, 16))
    scale = (1.0 / math.sqrt(dim)) if sm_scale is None else sm_scale
    direct = splits == 1
    if direct:
        o_part = lse_part = out  # unused
        stride_ps = stride_ls = 0
    else:
        part_dtype = q.dtype if cfg.half_partials else torch.float32
        o_part = torch.empty((splits, total_q * hq, block_d), device=q.device, dtype=part_dtype)
        lse_part = torch.empty((splits, total_q * hq), device=q.device, dtype=torch.float32)
        stride_ps, stride_ls = o_part.stride(0), lse_part.stride(0)
    fuse = cfg.fuse_merge and not direct
    pdl = cfg.pdl and pdl_supported(q.device)
    pdl_kw = {"launch_pdl": True} if pdl else {}
    sem = _tickets(q.device, batch * hkv * m_blocks) if fuse else qo_indptr
    grid = (m_blocks, splits * hkv, batch)
    stamp = stamps is not None
    if stamps is not None:
        stamps.append(torch.zeros((math.prod(grid), 8), dtype=torch.int64, device=q.device))
        if not direct and not fuse:
            stamps.append(torch.zeros((total_q * hq, 8), dtype=torch.int64, device=q.device))
    _tree_attention_kernel[grid](
        q, k_cache, v_cache, tree_mask, qo_indptr, kv_indptr, kv_lens, out, o_part, lse_part, sem,
        stamps[-1 if direct or fuse else -2] if stamps is not None else sem,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1), tree_mask.stride(0),
        stride_ps, stride_ls, hkv, hq, splits, prefix_splits, scale * LOG2E,
        G=group, HEAD_DIM=dim, BLOCK_D=block_d, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n,
        TREE_BLOCK=cfg.tree_block, DIRECT=direct, EVEN_D=block_d == dim, FUSE_MERGE=fuse,
        BLOCK_S=triton.next_power_of_2(splits),
        DOT_PREC="ieee" if q.dtype == torch.float32 else "tf32", PDL=pdl,
        STAMP=stamp, num_warps=cfg.num_warps, num_stages=cfg.num_stages, **pdl_kw,
    )  # fmt: skip
    if not direct and not fuse:
        block_s = triton.next_power_of_2(splits)
        warps = cfg.merge_warps or 1
        _merge_splits_kernel[(total_q * hq,)](
            o_part, lse_part, out, stamps[-1] if stamps is not None else lse_part, splits, hq,
            stride_ps, stride_ls, out.stride(0), out.stride(1), HEAD_DIM=dim, BLOCK_D=block_d,
            BLOCK_S=block_s, PDL=pdl, STAMP=stamp, num_warps=warps, **pdl_kw,
        )  # fmt: skip
    return out
