"""Tree attention planned once per shape and run per step (flashinfer's plan()/run() split).

A decoding loop verifies the same shape every step: B sequences of N tree tokens over C cached
tokens in a fixed-capacity cache. What depends only on that shape is built once here: the index
arrays (qo_indptr, kv_indptr, kv_lens), the bitmask buffer the step's tree is written into, and
the launch (tile config, prefix splits: tree_attention_config.plan_launch). A step then costs one
`set_mask` (the tree's ancestor matrix as bitmask words, on the device) and one `run` per layer
(the wrapper's shape checks and the launch; no split search, no host sync), so both can be
captured in a CUDA graph.

Tuning: `tune_tree_attention` times candidate configs for one shape (CUDA-graph replays) and
records the fastest; a plan of that shape made afterwards without an explicit config uses it.
Packed (ragged) batches of pruned trees are planned in ragged_plan.py.

Cache layout (one layer): kv [2, B, capacity, KVH, D], sequence b's K at kv[0, b], viewed flat as
[B * capacity, KVH, D] with kv_indptr = b * capacity and kv_lens = C + N (tree K/V at slots
C .. C+N-1 of each row, in node order).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from spectune.kernels.layout import mask_words, word_bits
from spectune.kernels.timing import graph_time
from spectune.kernels.tree_attention import pdl_supported, tree_attention
from spectune.kernels.tree_attention_config import (
    TreeAttentionConfig,
    TreeAttentionLaunch,
    plan_launch,
)

# (batch, tree tokens, context) -> the fastest (config, prefix splits or None) measured
_TUNED: dict[tuple[int, int, int], tuple[TreeAttentionConfig, int | None]] = {}
# (block_m, block_n, num_warps, num_stages, prefix splits per KV group and m-block: None = the
# plan_launch's own choice), tried by tune_tree_attention with programmatic dependent launch
# where the device has it (it took the batch-1 N = 64 call from 21.2 to 19.6 us on an H200 with
# half partials: KERNELS_NOTES v6); the shape's default_config (PDL, and half partials at batch 1
# N >= 32) is tried first. The tiles get no half-partial twins: every candidate is a Triton
# compile per split count, and the twins took `spectune calibrate` on an H100 past its 435 s
# limit (343 s without them; benchmarks/results/new_gpu_h100_tuner)
CANDIDATES = (
    (64, 128, 4, 3, None),
    (64, 128, 4, 3, 32),
    (128, 64, 8, 3, None),
    (128, 64, 8, 3, 32),
    (32, 128, 4, 3, None),
    (16, 128, 4, 3, None),
    (64, 64, 4, 4, None),
    (128, 128, 8, 2, None),
)
# K/V bytes one timed replay reads at least: the tuner's graph calls the attention over this
# many bytes of distinct layers' caches (at most TUNE_CALLS calls), so that L2 (50 MB on an H100,
# 60 MB on an H200) does not hold them, as in a forward where each layer reads its own cache,
# and a small call is timed back to back with the next instead of beside its graph's launch
# (one call per replay timed the launch: batch 1 N = 64 on an H100 measured 26-36 us per
# config where the same launch took 19.7 us inside the verify forward)
TUNE_BYTES = 256 << 20
TUNE_CALLS = 16


@dataclass(frozen=True)
class HeadShape:
    """The attention's heads: q [.., q_heads, head_dim] over K/V [.., kv_heads, head_dim]."""

    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype


def tuned_launch(
    batch: int, tokens: int, context: int
) -> tuple[TreeAttentionConfig | None, int | None]:
    """The (config, prefix splits) tune_tree_attention recorded for this shape, else (None, None)."""
    return _TUNED.get((batch, tokens, context), (None, None))


class TreeAttentionPlan:
    """Tree attention of B sequences x N tree tokens over `context` cached tokens, planned once.

    heads: the attention's heads (q [B, N, q_heads, head_dim]); config / num_splits: a fixed launch (default: the tuned one for this shape, else
    plan_launch's choice). Per step: set_mask(ancestor matrix), then run(q, kv) per layer.
    """

    def __init__(
        self,
        batch: int,
        tokens: int,
        context: int,
        capacity: int,
        heads: HeadShape,
        device: torch.device,
        *,
        config: TreeAttentionConfig | None = None,
        num_splits: int | None = None,
    ):
        i32 = torch.int32
        self.batch, self.tokens, self.context, self.capacity = batch, tokens, context, capacity
        self.qo_indptr = torch.arange(batch + 1, dtype=i32, device=device) * tokens
        self.kv_indptr = torch.arange(batch + 1, dtype=i32, device=device) * capacity
        self.kv_lens = torch.full((batch,), context + tokens, dtype=i32, device=device)
        words = (tokens + 63) // 64
        self.bitmask = torch.zeros((batch * tokens, words), dtype=torch.int64, device=device)
        self._bits = word_bits(words, device)
        if config is None and num_splits is None:
            config, num_splits = tuned_launch(batch, tokens, context)
        self.launch: TreeAttentionLaunch = plan_launch(
            batch=batch, q_heads=heads.q_heads, kv_heads=heads.kv_heads,
            head_dim=heads.head_dim, elem_bytes=heads.dtype.itemsize, total_q=batch * tokens,
            max_q_len=tokens, max_kv_len=context + tokens, device=torch.device(device),
            config=config, num_splits=num_splits,
        )  # fmt: skip

    def set_mask(self, mask: torch.Tensor) -> None:
        """mask: bool[B, N, N] ancestor matrix ([b, i, j]: j is i or an ancestor of i) -> the
        bitmask rows."""
        b, n, _ = mask.shape
        self.bitmask.copy_(mask_words(mask.reshape(b * n, n), self._bits))

    def run(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q: [B, N, Hq, D]; kv: [2, B, capacity, KVH, D] (this layer) -> [B, N, Hq, D]."""
        b, n, hq, d = q.shape
        kvh = kv.shape[3]
        out = tree_attention(
            q.reshape(b * n, hq, d),
            kv[0].reshape(b * self.capacity, kvh, d),
            kv[1].reshape(b * self.capacity, kvh, d),
            self.qo_indptr,
            self.kv_indptr,
            self.bitmask,
            self.kv_lens,
            max_q_len=n,
            max_kv_len=self.context + n,
            config=self.launch.config,
            num_splits=self.launch.prefix_splits,
        )
        return out.view(b, n, hq, d)


def _tune_configs(
    group_rows: int, device: torch.device
) -> list[tuple[TreeAttentionConfig | None, int | None, list[object]]]:
    """(config or None for the shape's default, prefix splits or None, row label) per candidate."""
    pdl = pdl_supported(device)
    out: list[tuple[TreeAttentionConfig | None, int | None, list[object]]] = [
        (None, None, ["default"])
    ]
    for bm, bn, warps, stages, splits in CANDIDATES:
        if bm > 2 * max(16, group_rows):
            continue
        cfg = TreeAttentionConfig(
            block_m=bm, block_n=bn, num_warps=warps, num_stages=stages, pdl=pdl
        )
        out.append((cfg, splits, [bm, bn, warps, stages, splits, pdl]))
    return out


def tune_tree_attention(
    batch: int, tokens: int, context: int, kv: torch.Tensor, heads: int
) -> list[dict[str, object]]:
    """Time tree attention under each candidate config for one shape (CUDA-graph replays of a
    causal tree) and record the fastest for later plans of this shape.

    kv: [2, B, capacity, KVH, D] one layer's cache, or [L, 2, B, capacity, KVH, D] a whole
    cache: each replay then calls the attention over up to TUNE_CALLS layers (until TUNE_BYTES
    of K/V are read), as a forward does. heads: query heads. Returns the timing rows (config
    [block_m, block_n, warps, stages, splits, pdl] or ["default"], seconds per
    call; [] when the shape was tuned before)."""
    key = (batch, tokens, context)
    if key in _TUNED:
        return []
    layers = kv if kv.dim() == 6 else kv[None]
    dev = layers.device
    kvh, dim = layers.shape[4], layers.shape[-1]
    used = batch * (context + tokens) * 2 * kvh * dim * layers.element_size()
    calls = max(1, min(layers.shape[0], TUNE_CALLS, -(-TUNE_BYTES // max(used, 1))))
    causal = torch.ones((tokens, tokens), dtype=torch.bool, device=dev).tril()
    q = torch.randn((batch, tokens, heads, dim), device=dev, dtype=layers.dtype)
    rows: list[dict[str, object]] = []
    best, best_t = None, float("inf")
    group = heads // kvh
    shape = HeadShape(heads, kvh, dim, layers.dtype)
    for cfg, splits, label in _tune_configs(group * tokens, dev):
        sp = None if splits is None else max(1, min(splits, context // 256))
        try:
            plan = TreeAttentionPlan(
                batch, tokens, context, layers.shape[3], shape, dev, config=cfg, num_splits=sp
            )
            plan.set_mask(causal.expand(batch, tokens, tokens))

            def call(plan: TreeAttentionPlan = plan) -> None:
                for i in range(calls):
                    plan.run(q, layers[i])

            t = graph_time(call, dev, 10) / calls
        except Exception as e:  # a config that does not compile is skipped
            rows.append({"config": label, "error": repr(e)[:160]})
            continue
        rows.append({"config": label, "seconds": t, "calls": calls})
        if t < best_t:
            best, best_t = (plan.launch.config, sp), t
    if best is not None:
        _TUNED[key] = best
    return rows
