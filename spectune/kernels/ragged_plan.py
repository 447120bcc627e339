"""Tree attention over packed pruned trees, planned per token bucket (plan once, run per step).

After dynamic-depth pruning, sequence b keeps counts[b] of its N tree nodes. Verifying only the
kept nodes means a ragged batch of T = sum(counts) rows whose T changes every step, while a CUDA
graph needs fixed shapes. So:

- `RaggedTreePlan` owns buffers for the B*N worst case and packs each step's kept nodes into
  them on the device (`set_trees`, fixed shapes, no host sync): per row its token, position
  (context + depth), cache slot (b * capacity + context + local index: the kernels' "tree K/V
  in the last N_b slots") and ancestor bitmask row. Rows past T are padding.
- a step runs at a token bucket T_b >= T (multiples of TOKEN_BUCKET up to B*N); each bucket is
  planned once (`bucket_plan`, a `RaggedBucket`: its index arrays and launch) and gets a CUDA
  graph of its own in the caller. The T_b - T padding rows form a scratch sequence B with no
  prefix, so they attend to nothing real and write nothing (their K/V slot is -1).

Cache layout (one layer): kv [2, B, capacity, KVH, D], as tree_attention_plan.py's.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from spectune.kernels.layout import mask_words, word_bits
from spectune.kernels.rope import rope_scatter_
from spectune.kernels.tree_attention import tree_attention
from spectune.kernels.tree_attention_config import TreeAttentionLaunch, plan_launch
from spectune.kernels.tree_attention_plan import HeadShape, tuned_launch
from spectune.kernels.tree_attention_reference import reference_tree_attention

#: a pruned batch's T verify tokens are padded up to a multiple of this (one CUDA graph per
#: bucket). The cost model charges weight GEMMs at B x (mean tree tokens) with no token
#: rounding, so the rounding is kept fine; 16 also keeps every bucket's integer arguments
#: divisible by 16 (one Triton specialisation for all buckets but the top one, B x N).
TOKEN_BUCKET = 16


def token_bucket(total: int, cap: int) -> int:
    """Verify tokens a step of `total` kept tokens runs at: the next multiple of TOKEN_BUCKET,
    at most `cap` (the plan's B x N rows; padding rows < TOKEN_BUCKET either way)."""
    return min(-(-max(total, 1) // TOKEN_BUCKET) * TOKEN_BUCKET, cap)


class RaggedTreePlan:
    """Packed verify of B pruned trees of at most N nodes over `context` cached tokens.

    Buffers (B*N + 1 rows: the last is a sink that dropped slots scatter into):
        tokens, pos int64[B*N+1]; dst int64[B*N+1] (cache slot, -1: not stored); dest
        int64[B*N+1] (the row's [B, N] slot b * N + i, padding -> B * N) for scattering
        outputs back to the padded layout; bitmask int64[B*N+1, W]; qo int32[B+1];
        kv_lens int32[B]; total int64[] (T of the step, on the device).
    heads: the attention's heads, for planning each bucket.
    """

    def __init__(
        self,
        batch: int,
        nodes: int,
        context: int,
        capacity: int,
        heads: HeadShape,
        device: torch.device,
    ) -> None:
        self.batch, self.nodes, self.context, self.capacity = batch, nodes, context, capacity
        self.device = device
        self.heads = heads
        # the top bucket is B x N itself (not rounded up): a step that keeps every node runs at
        # the dense verify's M (library GEMMs pick kernels per M: on an H200 M = 704 cost 1.3 ms
        # more per Llama-3.1-8B verify than M = 696, B = 8 x 87 nodes)
        self.max_tokens = batch * nodes
        size = self.max_tokens + 1  # + the sink row that dropped slots scatter into
        self.sink = self.max_tokens
        i64: dict[str, Any] = {"dtype": torch.int64, "device": device}
        self.tokens = torch.zeros(size, **i64)
        self.pos = torch.full((size,), context, **i64)
        self.dst = torch.full((size,), -1, **i64)
        self.dest = torch.full((size,), batch * nodes, **i64)
        self.max_q_len = max(nodes, TOKEN_BUCKET)  # a scratch sequence holds < TOKEN_BUCKET rows
        words = (self.max_q_len + 63) // 64
        self.bitmask = torch.zeros((size, words), **i64)
        self.qo = torch.zeros(batch + 1, dtype=torch.int32, device=device)
        self.kv_lens = torch.zeros(batch, dtype=torch.int32, device=device)
        self.total = torch.zeros((), **i64)
        self._bits = word_bits(words, device)
        ar = torch.arange(nodes, device=device)
        self._local = ar.expand(batch, nodes)
        self._slot = torch.arange(batch, device=device)[:, None] * capacity + context + ar
        self._bn = torch.arange(batch * nodes, device=device).view(batch, nodes)
        self._buckets: dict[int, RaggedBucket] = {}

    def set_trees(
        self, tokens: torch.Tensor, depth: torch.Tensor, mask: torch.Tensor, counts: torch.Tensor
    ) -> None:
        """Pack the first counts[b] nodes of each row (no host sync; fixed shapes).

        tokens, depth: int64[B, N]; mask: bool[B, N, N] ancestor matrix; counts: int64[B] >= 1."""
        b, n = tokens.shape
        words = self.bitmask.shape[1]
        ends = torch.cumsum(counts, 0)
        self.qo[1:].copy_(ends)
        self.total.copy_(ends[-1])
        self.kv_lens.copy_(self.context + counts)
        live = self._local < counts[:, None]
        row = torch.where(live, (ends - counts)[:, None] + self._local, self.sink).view(-1)
        for buf, fill in ((self.tokens, 0), (self.pos, self.context), (self.dst, -1)):
            buf.fill_(fill)
        self.dest.fill_(b * n)
        self.bitmask.zero_()
        self.tokens.scatter_(0, row, tokens.reshape(-1))
        self.pos.scatter_(0, row, (self.context + depth).reshape(-1))
        self.dst.scatter_(0, row, self._slot.reshape(-1))
        self.dest.scatter_(0, row, self._bn.reshape(-1))
        bits = mask_words(mask.reshape(b * n, n), self._bits)
        self.bitmask.scatter_(0, row[:, None].expand(b * n, words), bits)
        # the sink row took every dropped slot's values: reset it to padding
        # (slice fills, not `buf[i] = x`: a Python scalar assignment copies from the host,
        # which CUDA-graph capture forbids)
        s = slice(self.sink, self.sink + 1)
        self.tokens[s].fill_(0)
        self.pos[s].fill_(self.context)
        self.dst[s].fill_(-1)
        self.bitmask[s].zero_()

    def bucket(self, total: int) -> int:
        """The token bucket a step of `total` kept tokens runs at (token_bucket)."""
        return token_bucket(total, self.max_tokens)

    def bucket_plan(self, tokens: int) -> RaggedBucket:
        """The plan of a verify over the first `tokens` rows (a bucket); made once per bucket,
        outside any CUDA-graph capture."""
        plan = self._buckets.get(tokens)
        if plan is None:
            plan = RaggedBucket(self, tokens)
            self._buckets[tokens] = plan
        return plan


class RaggedBucket:
    """One token bucket T_b of a RaggedTreePlan: qo_indptr int32[B+2] (the B sequences, then the
    scratch sequence of the T_b - T padding rows), kv_indptr int32[B+2] (sequence b at slot
    b * capacity; the scratch at 0 with kv_len = its own rows and no prefix: its rows see only
    their own, all-zero, mask words, so they read nothing and output 0), kv_lens int32[B+1],
    and the launch planned for T_b rows (the split count chosen for the B real sequences)."""

    def __init__(self, layout: RaggedTreePlan, tokens: int) -> None:
        b, dev = layout.batch, layout.device
        self.layout, self.tokens, self.batch = layout, tokens, b
        self.qo = torch.full((b + 2,), tokens, dtype=torch.int32, device=dev)
        self.kv_indptr = torch.zeros(b + 2, dtype=torch.int32, device=dev)
        self.kv_indptr[: b + 1] = torch.arange(b + 1, dtype=torch.int32, device=dev) * (
            layout.capacity
        )
        self.kv_indptr[b] = 0
        self.kv_lens = torch.zeros(b + 1, dtype=torch.int32, device=dev)
        # no sequence holds more rows than the bucket (at batch 1 a pruned tree is the whole
        # bucket): fewer m-blocks and the split choice of the tree actually kept
        self.max_q_len = min(layout.max_q_len, tokens)
        self.max_kv_len = layout.context + layout.nodes
        h = layout.heads
        config, splits = tuned_launch(b, layout.nodes, layout.context)
        self.launch: TreeAttentionLaunch = plan_launch(
            batch=b + 1, q_heads=h.q_heads, kv_heads=h.kv_heads, head_dim=h.head_dim,
            elem_bytes=h.dtype.itemsize,
            total_q=tokens, max_q_len=self.max_q_len, max_kv_len=self.max_kv_len,
            device=torch.device(dev), config=config, num_splits=splits, split_batch=b,
        )  # fmt: skip

    def prepare(self) -> None:
        """Copy this step's offsets in (device ops: part of the bucket's graph)."""
        lay, b = self.layout, self.batch
        self.qo[: b + 1].copy_(lay.qo)
        self.kv_lens[:b].copy_(lay.kv_lens)
        self.kv_lens[b:].copy_(self.tokens - lay.qo[b:])

    def store(
        self,
        qkv: torch.Tensor,
        hq: int,
        hk: int,
        pos: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        kv: torch.Tensor,
    ) -> None:
        """RoPE + K/V store of the T_b rows into their cache slots (padding: none)."""
        rope_scatter_(qkv, hq, hk, pos, self.layout.dst[: self.tokens], *rope, kv)

    def run(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        """q: [1, T_b, Hq, D]; kv: [2, B, capacity, KVH, D] -> [1, T_b, Hq, D]."""
        lay = self.layout
        t, hq, d = q.shape[1], q.shape[2], q.shape[3]
        kvh = kv.shape[3]
        args = (
            q.reshape(t, hq, d),
            kv[0].reshape(self.batch * lay.capacity, kvh, d),
            kv[1].reshape(self.batch * lay.capacity, kvh, d),
            self.qo,
            self.kv_indptr,
            lay.bitmask[:t],
            self.kv_lens,
        )
        if q.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
            out = tree_attention(
                *args,
                max_q_len=self.max_q_len,
                max_kv_len=self.max_kv_len,
                config=self.launch.config,
                num_splits=self.launch.prefix_splits,
                split_batch=self.batch,  # the scratch (padding) sequence does not count
            )
        else:  # CPU without the interpreter: the torch reference (host syncs)
            out = reference_tree_attention(*args).to(q.dtype)
        return out.view(1, t, hq, d)
