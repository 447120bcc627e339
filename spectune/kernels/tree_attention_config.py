"""How one tree-attention call is launched: tile config, split count, programs in flight.

The kernel (tree_attention.py) cuts each sequence's prefix into S splits (flash-decoding) so that
small batches fill the GPU. Too few splits leave SMs idle; too many cost partial traffic and a
merge launch. `plan_launch` picks the config and the split count for one call shape from a small
cost model in "key" units (the time one program takes per prefix key at full occupancy):

    cost(S) = rounds(S) * (chunk(S) + tree keys + PROGRAM_OVERHEAD_KEYS)
              + [S > 1] * (MERGE_OVERHEAD_KEYS + partial_keys_per_split * S)

where rounds = ceil(programs / resident slots) and the partial cost counts the bytes each split
writes and the merge reads, in units of one program's K/V bytes per key. Where the tree keys get
programs of their own (tree_split_fits) they leave the critical path.

A caller that runs the same shape every step plans once (spectune.kernels.tree_attention_plan);
the wrapper plans per call otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch
import triton

MIN_CHUNK = 64  # fewest prefix keys per split
SM_SMEM_BYTES = 233472  # Hopper: shared memory per SM (228 KiB); 1 KiB of it is reserved per CTA
PROGRAM_OVERHEAD_KEYS = 48  # Q load, pipeline fill, epilogue of one program
MERGE_OVERHEAD_KEYS = 64  # the merge launch
# What one split's partials cost beyond their bytes (writes, the merge's reads, its programs),
# fitted to the batch-1 ctx 4096 split sweep of `probe_batch1.py --timeline` on an H200 (one
# warp per merge row, tree keys in programs of their own): 13 splits measured best at N = 16
# (13.4 us; 8 splits 14.2-14.4), 7-8 at N = 64, which this scale picks.
PARTIAL_COST_SCALE = 4.0


@dataclass(frozen=True)
class TreeAttentionConfig:
    """Tile sizes and launch shape (block_n must be a multiple of tree_block; tree_block | 64)."""

    block_m: int = 64  # packed (token, head) rows per program
    block_n: int = 64  # prefix keys per inner iteration
    tree_block: int = 64  # tree keys per inner iteration (shares one mask word)
    num_warps: int = 4
    num_stages: int = 3
    ctas_per_sm: int | None = None  # resident programs per SM for the split chooser (None: guess)
    # Fused merge: the last split of a tile to finish merges all of them (atomic ticket) instead of
    # a second launch. Off by default: slower at high split counts on an H200 (the merging
    # program walks S partials serially: B=1 ctx 4096 N 16 32 us fused vs 16 us).
    fuse_merge: bool = False
    min_chunk: int = MIN_CHUNK
    # Programmatic dependent launch (Hopper+, CUDA only): the merge kernel is launched while the
    # attention kernel still runs and waits on it in-kernel (griddepcontrol), and the attention
    # kernel itself may start while the kernel before it drains (it waits before its first
    # read). Saves launch gaps on short, latency-bound calls (batch 1). Ignored where unsupported.
    pdl: bool = False
    # Partial outputs of the splits stored in q's dtype instead of float32 (the LSE stays
    # float32): halves the partial traffic, which grows with splits x rows (at batch 1, N = 64
    # each split writes as many bytes as 1/8 of the KV it read). Adds one rounding per split.
    half_partials: bool = False
    # Warps per merge program (one program per (tree token, query head) row). One warp was the
    # fastest at every batch-1 split count measured (H200, probe_batch1.py --timeline: 12 splits
    # at N = 16 13.6 us on 1 warp vs 15.2 / 16.2 on 2 / 4; N = 64, 8 splits 19.9 vs 24.5 / 28.6).
    merge_warps: int = 1
    # With more than one split, the tree keys get a program of their own (one more partial per
    # row) where it fits in the last round's free slots (tree_split_fits): in the last prefix
    # split the masked tree step runs serially after a full prefix chunk and ended 2.3-2.8 us
    # after every other split (H200, batch 1, probe_batch1.py --timeline), on the critical
    # path of the call.
    tree_split: bool = True


@dataclass(frozen=True)
class TreeAttentionLaunch:
    """A planned call: the config, m-blocks per (sequence, KV head), prefix splits and the
    programs per tile in all (prefix splits + 1 where the tree keys get their own)."""

    config: TreeAttentionConfig
    m_blocks: int
    prefix_splits: int
    splits: int


@lru_cache(maxsize=8)
def _num_sms(device_index: int) -> int:
    return int(torch.cuda.get_device_properties(device_index).multi_processor_count)


def default_config(
    rows_per_group: int, device: torch.device, groups: int | None = None
) -> TreeAttentionConfig:
    """A config for G*N packed rows over `groups` (sequence, KV head) pairs; GPU configs were
    swept in benchmarks/bench_kernels.py and probe_batch1.py on an H200
    (benchmarks/KERNELS_NOTES.md)."""
    if device.type != "cuda":  # the interpreter: small tiles keep numpy work small
        bm = 16 if rows_per_group <= 16 else 32
        return TreeAttentionConfig(block_m=bm, block_n=32, tree_block=32, num_warps=4, min_chunk=32)
    # memory-bound rows <= 64 like 64-key blocks, compute-bound rows >= 128 like 128 x 128
    # tiles on 8 warps; pdl (programmatic dependent launch of the merge) saves 0.5-1 us at
    # split launches
    if rows_per_group <= 16:
        return TreeAttentionConfig(block_m=16, block_n=64, num_warps=4, num_stages=4, pdl=True)
    if rows_per_group <= 32:
        return TreeAttentionConfig(block_m=32, block_n=64, num_warps=4, num_stages=4, pdl=True)
    if rows_per_group <= 64:
        return TreeAttentionConfig(block_m=64, block_n=64, num_warps=4, num_stages=4, pdl=True)
    # half partials: at batch 1, N = 64 they take the best split launch from 21.2 to 19.6 us;
    # direct launches (one split) have no partials.
    # Few (sequence, KV head) groups (batch 1: 8): 64-row tiles give the splits more programs;
    # best at B=1 x N=64 for ctx 4096 (21.9 vs 23.2 us) and 32768 (77.6 vs 78.4), while B >= 8
    # prefers 128 x 128 on 8 warps (benchmarks/results kernels_h200.json)
    if groups is not None and groups <= 16:
        return TreeAttentionConfig(
            block_m=64, block_n=64, num_warps=4, num_stages=3, pdl=True, half_partials=True
        )
    return TreeAttentionConfig(
        block_m=128, block_n=128, num_warps=8, num_stages=3, pdl=True, half_partials=True
    )


def resident_programs(cfg: TreeAttentionConfig, head_dim: int, elem_bytes: int) -> int:
    """Programs of this config that fit on one SM at once (shared memory and a register budget
    of ~128 per thread), unless cfg.ctas_per_sm says."""
    if cfg.ctas_per_sm:
        return cfg.ctas_per_sm
    smem = (cfg.num_stages * 2 * cfg.block_n + cfg.block_m) * head_dim * elem_bytes + 1024
    by_smem = max(1, SM_SMEM_BYTES // smem)
    by_regs = max(1, 65536 // (cfg.num_warps * 32 * 128))
    return min(by_smem, by_regs, 4)


@lru_cache(maxsize=4096)
def choose_splits(
    batch: int,
    kv_heads: int,
    m_blocks: int,
    max_prefix: int,
    tree_len: int,
    cfg: TreeAttentionConfig,
    slots: int,
    partial_keys_per_split: float = 0.0,
) -> tuple[int, int]:
    """(prefix splits, chunk) minimising the module's cost model over `slots` concurrent
    programs. Where tree_split_fits, the tree keys of a split launch get programs of their own
    (on top of the returned count), so they drop out of the prefix programs' time.

    Only split counts that end a round exactly (k * slots / programs per split, k = 1..8) and
    their neighbours are tried, and results are cached: the wrapper calls this on every
    unplanned call, where an exhaustive Python search would cost 0.3-2 ms of host time."""
    per_split = batch * kv_heads * m_blocks
    prefix = max(max_prefix, 1)
    max_splits = max(1, min(512, prefix // cfg.min_chunk))
    candidates = {1, max_splits}
    for k in (0.25, 0.5, 1, 2, 3, 4, 5, 6, 7, 8):  # fractions: fewer programs than slots
        full = int(k * slots) // per_split
        candidates.update((full - 1, full, full + 1))
    best: tuple[float, int, int] | None = None
    for want in sorted(c for c in candidates if 1 <= c <= max_splits):
        chunk = triton.cdiv(triton.cdiv(prefix, want), cfg.block_n) * cfg.block_n
        splits = triton.cdiv(prefix, chunk)
        rounds = triton.cdiv(per_split * splits, slots)
        cost = rounds * (chunk + tree_len + PROGRAM_OVERHEAD_KEYS)
        if splits > 1:
            cost += MERGE_OVERHEAD_KEYS + partial_keys_per_split * splits
            if tree_split_fits(per_split, splits, slots, cfg):
                # the tree programs run beside the prefix programs: the tree keys leave the
                # critical path, one more partial per row joins the merge
                cost += partial_keys_per_split - rounds * tree_len
        if best is None or cost < best[0]:
            best = (cost, splits, chunk)
    assert best is not None
    return best[1], best[2]


def tree_split_fits(
    programs_per_split: int, splits: int, slots: int, cfg: TreeAttentionConfig
) -> bool:
    """Whether a split launch gives the tree keys programs of their own: cfg.tree_split, more
    than one split, and the extra programs fit in the free slots of the last round (they then
    run beside the prefix programs instead of adding a round)."""
    used = programs_per_split * splits
    return (
        cfg.tree_split
        and splits > 1
        and used + programs_per_split <= triton.cdiv(used, slots) * slots
    )


def resident_slots(
    cfg: TreeAttentionConfig, device: torch.device, head_dim: int, elem_bytes: int
) -> int:
    """Programs of this config in flight on the whole device (4 'SMs' off the GPU)."""
    sms = _num_sms(device.index or 0) if device.type == "cuda" else 4
    return sms * resident_programs(cfg, head_dim, elem_bytes)


def plan_launch(
    *,
    batch: int,
    q_heads: int,
    kv_heads: int,
    head_dim: int,
    elem_bytes: int,
    total_q: int,
    max_q_len: int,
    max_kv_len: int,
    device: torch.device,
    config: TreeAttentionConfig | None = None,
    num_splits: int | None = None,
    split_batch: int | None = None,
) -> TreeAttentionLaunch:
    """The launch of one call shape: `batch` sequences of at most max_q_len tree tokens
    (total_q rows in all) and at most max_kv_len used slots. config / num_splits: fixed by the
    caller, else default_config / choose_splits. split_batch: the sequences the split count is
    chosen for (a trailing padding-only sequence left out)."""
    group = q_heads // kv_heads
    seqs = split_batch or batch
    cfg = config or default_config(group * max_q_len, device, seqs * kv_heads)
    if cfg.block_n % cfg.tree_block or 64 % cfg.tree_block:
        raise ValueError("tree_block must divide 64 and block_n")
    m_blocks = triton.cdiv(group * max_q_len, cfg.block_m)
    slots = resident_slots(cfg, device, head_dim, elem_bytes)
    if num_splits is None:
        # the split count is chosen for a typical prefix; each program cuts its own sequence's
        # prefix into that many chunks (a host-side chunk from the bound max_kv_len - 1 would
        # leave splits empty: 13 of 16 used at batch 1, ctx 4096, N 16)
        typical_prefix = max(max_kv_len - max_q_len, 1)
        # partials: write + read of each split's rows, in units of one program's K/V bytes per key
        part_bytes = 2 if cfg.half_partials else 4
        partial = (
            PARTIAL_COST_SCALE * 2 * part_bytes * total_q * q_heads * head_dim
            / (2 * head_dim * elem_bytes * slots)
        )  # fmt: skip
        prefix_splits = choose_splits(
            seqs, kv_heads, m_blocks, typical_prefix, max_q_len, cfg, slots, partial
        )[0]
    else:
        prefix_splits = max(1, num_splits)
    splits = prefix_splits
    if tree_split_fits(seqs * kv_heads * m_blocks, prefix_splits, slots, cfg):
        splits += 1  # the tree keys' own programs (TreeAttentionConfig.tree_split)
    return TreeAttentionLaunch(cfg, m_blocks, prefix_splits, splits)
