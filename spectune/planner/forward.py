"""One forward pass of one model (target, EAGLE-3 head or draft model), priced operator by operator.

The layer is written out kernel by kernel as an inference engine runs it (SGLang/vLLM on Hopper):
each kernel's roofline time goes to its operator class, and each kernel counts one launch. Shapes
are per tensor-parallel rank: attention heads, MLP/expert widths and the vocabulary split by tp;
MLA's down-projections and MoE routers are replicated.

A batch enters as a `BatchShape`: totals over its sequences, so one code path prices both a
uniform batch (B sequences x n new tokens over c cached, arrays broadcast) and a ragged one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectune.planner.operators import (
    ACT_BYTES,
    F64,
    INDEX_BYTES,
    LOGIT_BYTES,
    Rates,
    allgather_time,
    allreduce_time,
    attention_row_tile,
    attention_splits,
    attention_time,
    elementwise_time,
    gemm_time,
    moe_experts_time,
    pad_up,
    spread_padded_rows,
)
from spectune.specs.calibration import tp_gemm_scale_at
from spectune.specs.errors import SpecError
from spectune.specs.model import ModelSpec

# Operator classes of the breakdown, in display order.
QKV_O = "qkv_o"  # attention projections (q/k/v, o; MLA's q/kv down and up projections)
ATTENTION = "attention"  # score + softmax + value over cached and new keys
MLP = "mlp"  # dense SwiGLU MLP, or router + routed and shared experts; EAGLE-3's fc
LM_HEAD = "lm_head"  # LM head GEMM over every token that needs logits
ELEMENTWISE = "elementwise"  # embedding, norms, RoPE + KV write, activation, logits pass
# tensor-parallel all-reduces (2 per layer), the logits all-gather and its layout copy, each
# with its kernel's launch: all a split forward spends on its collectives, what a split verify
# grid measures as seconds - seconds_nocomm (validate.fit.fit_inforward_offset)
COMM = "comm"
LAUNCH = "launch"  # one launch per kernel outside the collectives (graph replay or eager)
CLASSES = (QKV_O, ATTENTION, MLP, LM_HEAD, ELEMENTWISE, COMM, LAUNCH)


@dataclass(frozen=True)
class BatchShape:
    """What one forward pass works on. Arrays broadcast against each other.

    tokens:      real new tokens summed over sequences (attention queries, KV writes)
    gemm_tokens: rows the weight GEMMs see (tokens padded to the CUDA-graph batch)
    kv_tokens:   sum over sequences of (cached + new) tokens = keys attention reads
    lm_tokens:   tokens whose logits are needed
    graph:       True where the pass replays a CUDA graph
    """

    tokens: F64
    gemm_tokens: F64
    kv_tokens: F64
    lm_tokens: F64
    graph: np.ndarray
    new: F64  # [B] new tokens per sequence (ragged) or n (uniform)
    cached: F64  # [B] cached tokens per sequence (ragged) or c (uniform)
    seqs: F64  # B (uniform; multiplies the per-sequence sums) or 1 (ragged; sums over [B])
    ragged: bool
    # Uniform shapes only: a verify of trees of unequal size per request, `new` their mean.
    # new_cv: coefficient of variation of the per-request sizes (0: equal trees); new_max:
    # the most tokens a request holds; ragged_tile: the attention tile each request's rows are
    # padded to (0: the caller's tile). See rows_x_keys.
    new_cv: F64 | float = 0.0
    new_max: F64 | float = np.inf
    ragged_tile: float = 0.0

    def rows_x_keys(self, rows_per_token: int, tile: F64 | int) -> F64:
        """sum_i pad(rows_per_token * n_i, tile) * (c_i + n_i): query rows of one KV-head
        group, padded to the attention tile, times the keys they score. With a ragged_tile,
        the tile is the smaller of it and the padded rows of the largest request (new_max: a
        launch planned for that row), and the expectation over per-request sizes of mean `new`
        and spread new_cv (operators.spread_padded_rows) replaces pad(G * n, tile)."""
        if self.ragged_tile:
            t = np.minimum(self.ragged_tile, pad_up(rows_per_token * self.new_max, tile))
            rows = spread_padded_rows(self.new, self.new_cv, rows_per_token, t, self.new_max)
            return self.seqs * rows * (self.cached + self.new)
        per_seq = pad_up(rows_per_token * self.new, tile) * (self.cached + self.new)
        if self.ragged:
            return np.asarray(per_seq.sum(), dtype=np.float64)
        return self.seqs * per_seq


class ForwardPricer:
    """Prices forward passes of one model on one GPU at tensor-parallel degree `tp`."""

    def __init__(self, model: ModelSpec, rates: Rates, tp: int, *, drafting: bool = False) -> None:
        if model.heads % tp:
            raise SpecError(
                f"tp={tp} must divide the attention heads of {model.name} ({model.heads})"
            )
        if not model.is_mla and model.kv_heads % tp and tp % model.kv_heads:
            raise SpecError(
                f"tp={tp} and the {model.kv_heads} KV heads of {model.name} must divide one "
                "another (KV heads are split, or replicated when tp exceeds them)"
            )
        for name, width in (("ffn", model.ffn), ("expert_ffn", model.expert_ffn)):
            if width % tp:
                raise SpecError(f"tp={tp} must divide {name}={width} of {model.name}")
        self.model = model
        self.r = rates
        # a drafter's passes attend through span_attention, which runs every prefix in splits
        # and merges them with the span in a second launch (kernels/span_attention.py)
        self.drafting = drafting
        self.tp = tp
        self.heads = model.heads // tp  # query heads per rank
        self.kv_heads = 1 if model.is_mla else max(1, model.kv_heads // tp)
        self.kvb = float(model.kv_dtype_bytes)
        # decoder linear layers in the model's weight format (specs.quant); the LM head stays
        # dense at dtype_bytes. fp8/int8/fp4 GEMMs first quantize their bf16 input per token
        # (SGLang/vLLM block-fp8 linear), one more kernel per GEMM
        self.fmt = rates.gemm_format(model.weight_format, model.quant_group_size, model.dtype_bytes)
        self.head_fmt = rates.dense_format(model.dtype_bytes)
        self.wb = self.fmt.weight_bytes
        self.kpg = self.fmt.kernels  # kernels per linear-layer GEMM
        # the weight GEMMs' factors by row count at this tp and hidden size
        # (Calibration.tp_gemm_scale, fitted on a split grid of a target of that size): a
        # model of the same hidden size runs layers of the same shard shapes (an EAGLE-3 head
        # and its target), so it takes the same factors; none: no scaling
        self.gemm_scale_rows = tuple(
            r for r in rates.tp_gemm_scale if int(r[0]) == tp and int(r[1]) == model.hidden
        )

    # ---- weight bytes --------------------------------------------------------------------------
    def min_weight_bytes(self) -> float:
        """Weights one token streams per rank (routed top-k experts only; no embedding table):
        the memory floor of any forward pass."""
        m = self.model
        replicated = m.router_params() * m.moe_layers
        if m.is_mla:
            replicated += (
                m.layers * m.hidden * (m.q_lora_rank + m.kv_lora_rank + m.qk_rope_head_dim)
            )
        lm = m.lm_vocab * m.hidden
        split = m.active_params_per_token() - replicated - lm
        return (replicated + split / self.tp) * self.wb + lm / self.tp * self.head_fmt.weight_bytes

    # ---- the pass ------------------------------------------------------------------------------
    def forward(self, b: BatchShape, *, from_target: bool = False) -> dict[str, F64]:
        """Seconds per operator class for one pass. `from_target`: an EAGLE-3 head fed the
        target's three hidden states runs its fc (3*hidden -> hidden) first."""
        m = self.model
        out = {k: np.zeros(()) for k in CLASSES}
        launches = 0.0
        comm_launches = 0.0  # kernels of the collectives: COMM carries their launches
        tg = b.gemm_tokens

        def add(cls: str, time: F64, kernels: int = 1) -> None:
            nonlocal launches, comm_launches
            out[cls] = out[cls] + time
            if cls == COMM:
                comm_launches += kernels
            else:
                launches += kernels

        # embedding lookup: read T rows of [vocab, hidden], write [T, hidden]
        add(ELEMENTWISE, elementwise_time(self.r, 2 * tg * m.hidden * ACT_BYTES))
        if m.is_draft_head and from_target:
            # fc: [T, 3*hidden] x [3*hidden, hidden]; FLOPs 2*T*3h*h; bytes 3h*h*wb + T*4h*2
            add(MLP, self._linear(tg, m.hidden, 3 * m.hidden), self.kpg)
        if m.is_draft_head:
            # second input norm (embedding and fused hidden are normed separately)
            add(ELEMENTWISE, elementwise_time(self.r, 2 * tg * m.hidden * ACT_BYTES))

        layer = self._attention_layer(b) if not m.is_mla else self._mla_layer(b)
        dense = self._dense_mlp(tg)
        moe = self._moe_mlp(tg) if m.is_moe else None
        n_dense = m.layers - m.moe_layers
        for cls, (time, kernels) in layer.items():
            add(cls, time * m.layers, kernels * m.layers)
        for cls, (time, kernels) in dense.items():
            add(cls, time * n_dense, kernels * n_dense)
        if moe is not None:
            for cls, (time, kernels) in moe.items():
                add(cls, time * m.moe_layers, kernels * m.moe_layers)

        # final norm: read + write [T, hidden]
        add(ELEMENTWISE, elementwise_time(self.r, 2 * tg * m.hidden * ACT_BYTES))
        lm = b.lm_tokens
        vocab = m.lm_vocab / self.tp
        # LM head: [L, hidden] x [hidden, vocab/tp]; FLOPs 2*L*h*V/tp; bytes h*V/tp*wb + L*(h+V/tp)*2
        add(LM_HEAD, self._linear(lm, vocab, m.hidden, head=True), self.head_fmt.kernels)
        if self.tp > 1:
            # all-gather the vocabulary shards: L*V bf16 logits in total
            add(COMM, allgather_time(self.r, lm * m.lm_vocab * ACT_BYTES, self.tp))
            # the gathered [tp, L, V/tp] is rank-major; one copy lays it out as [L, V]: read +
            # write L*V*2 bytes (executor.collectives.all_gather_last; vLLM's
            # GroupCoordinator.all_gather, vllm/distributed/parallel_state.py, movedim + reshape)
            add(COMM, elementwise_time(self.r, 2 * lm * m.lm_vocab * ACT_BYTES))
        # logits pass (fp32 upcast + softmax/argmax/top-k) over the whole vocabulary, on every
        # rank after the gather (SGLang's and vLLM's LogitsProcessor gather, then sample): write
        # and read L*V fp32 values
        add(LM_HEAD, elementwise_time(self.r, 2 * lm * m.lm_vocab * LOGIT_BYTES))

        launch_s = np.where(b.graph, self.r.launch_s, self.r.eager_launch_s)
        out[LAUNCH] = out[LAUNCH] + launches * launch_s
        out[COMM] = out[COMM] + comm_launches * launch_s
        shape = np.broadcast_shapes(*(np.shape(v) for v in out.values()))
        return {
            k: np.asarray(v, dtype=np.float64)
            if np.shape(v) == shape
            else np.broadcast_to(v, shape).astype(np.float64)
            for k, v in out.items()
        }

    def _linear(self, m: F64, n: float, k: float, *, head: bool = False) -> F64:
        """A weight GEMM [m, k] x [k, n] in the linear layers' format (the LM head's, dense,
        with `head`): operators.gemm_time, plus, for formats that quantize activations, the
        input quantization kernel: read m*k bf16, write m*k * act_bytes."""
        fmt = self.head_fmt if head else self.fmt
        t = gemm_time(self.r, m, n, k, fmt)
        if fmt.act_bytes:
            t = t + elementwise_time(self.r, m * k * (ACT_BYTES + fmt.act_bytes))
        if self.gemm_scale_rows:
            t = t * tp_gemm_scale_at(self.gemm_scale_rows, self.tp, self.model.hidden, m)
        return t

    # ---- layer pieces: {class: (seconds, kernels)} per layer -----------------------------------
    def _attention_layer(self, b: BatchShape) -> dict[str, tuple[F64, int]]:
        """GQA/MHA attention block (norm, qkv, RoPE + KV write, attention, o, all-reduce)."""
        m, r, tg = self.model, self.r, b.gemm_tokens
        q_w = self.heads * m.head_dim  # query width per rank
        kv_w = self.kv_heads * m.head_dim  # K (and V) width per rank
        group = self.heads // self.kv_heads
        norm = elementwise_time(
            r, 4 * tg * m.hidden * ACT_BYTES
        )  # fused add+RMSNorm: 2 reads, 2 writes
        # qkv: [T, in] x [in, q_w + 2 kv_w]; FLOPs 2*T*in*(q_w+2kv_w)
        qkv = self._linear(tg, q_w + 2 * kv_w, m.attn_in_width)
        # RoPE + KV store: read q,k,v; write rotated q,k; write K,V into the cache
        rope = elementwise_time(r, tg * ((2 * q_w + 3 * kv_w) * ACT_BYTES + 2 * kv_w * self.kvb))
        # attention: each sequence's K and V read once per KV-head group:
        #   bytes = sum_i (c_i + n_i) * 2 * kv_w * kv_bytes; Q read + O write = 2 * T * q_w * 2
        #   FLOPs = 4 * head_dim * kv_heads * sum_i pad(group*n_i) * (c_i + n_i)   (QK^T and PV)
        # the tree part (n_i x n_i, masked) is computed densely inside the same tiles.
        tile = self._attention_tile(b, group)
        attn = attention_time(
            r,
            b.kv_tokens * 2 * kv_w * self.kvb,
            4 * m.head_dim * self.kv_heads * b.rows_x_keys(group, tile),
            2 * b.tokens * q_w * ACT_BYTES,
        ) + np.where(self._attention_split(b, group, tile), r.attention_split_s, 0.0)
        o = self._linear(tg, m.hidden, q_w)  # [T, q_w] x [q_w, hidden]
        parts: dict[str, tuple[F64, int]] = {
            QKV_O: (qkv + o, 2 * self.kpg),
            ATTENTION: (attn, 1),
            ELEMENTWISE: (norm + rope, 2),
        }
        if self.tp > 1:
            parts[COMM] = (allreduce_time(r, tg * m.hidden * ACT_BYTES, self.tp), 1)
        return parts

    def _attention_tile(self, b: BatchShape, group: int) -> F64 | int:
        """The row tile one GQA tree attention launch pads each (sequence, KV head) group's
        G x n query rows to (operators.attention_row_tile; a ragged batch's launch is planned
        for its largest sequence). A verify of unequal trees (b.ragged_tile: ECHO's or pruned
        trees) pads per request inside BatchShape.rows_x_keys, from the smallest tile."""
        if b.ragged_tile:
            return self.r.attention_tile_m
        if b.ragged:
            return attention_row_tile(self.r, group * np.max(b.new), b.new.size * self.kv_heads)
        return attention_row_tile(self.r, group * b.new, b.seqs * self.kv_heads)

    def _attention_split(self, b: BatchShape, group: int, tile: F64 | int) -> np.ndarray:
        """Whether the layer's attention launch splits each prefix: a drafter's always, over
        any prefix (span_attention); the target's tree attention where operators.
        attention_splits says, its programs being (sequence, KV head, row tile) triples, each
        request's G x n rows cut into tiles of its own where the verify pads per request
        (b.ragged_tile), over the longest prefix of a ragged batch."""
        if self.drafting:
            return np.asarray(b.cached) > 0
        t = b.ragged_tile or tile
        rows = group * b.new
        blocks = np.ceil(rows / t)
        prefix: F64 = b.cached
        if b.ragged:
            blocks = np.asarray(np.sum(blocks), dtype=np.float64)
            prefix = np.asarray(np.max(prefix), dtype=np.float64)
            rows = np.asarray(np.max(rows), dtype=np.float64)
        programs = b.seqs * self.kv_heads * blocks
        return attention_splits(self.r, programs, prefix, t, rows, self.model.head_dim, self.kvb)

    def _mla_layer(self, b: BatchShape) -> dict[str, tuple[F64, int]]:
        """Multi-head latent attention, weight-absorbed (decode/verify form, as SGLang runs it).

        The cache holds per token one latent (kv_lora) + one RoPE key (rope), shared by all heads.
        q' = q_nope W_UK (absorbed), scores over [latent; rope], output latent x W_UV, then o.
        """
        m, r, tg = self.model, self.r, b.gemm_tokens
        h, hr = m.hidden, self.heads
        lat, rope_w = m.kv_lora_rank, m.qk_rope_head_dim
        norm = elementwise_time(r, 4 * tg * h * ACT_BYTES)
        if m.q_lora_rank:
            # fused q_a + kv_a (replicated): [T, h] x [h, q_lora + lat + rope]
            down = self._linear(tg, m.q_lora_rank + lat + rope_w, h)
            # q_b: [T, q_lora] x [q_lora, hr * (nope + rope)]
            q_up = self._linear(tg, hr * (m.qk_nope_head_dim + rope_w), m.q_lora_rank)
            lora_norm = elementwise_time(r, 2 * tg * (m.q_lora_rank + lat) * ACT_BYTES)
        else:
            down = self._linear(tg, lat + rope_w, h)
            q_up = self._linear(tg, hr * (m.qk_nope_head_dim + rope_w), h)
            lora_norm = elementwise_time(r, 2 * tg * lat * ACT_BYTES)
        # absorb W_UK per head: FLOPs 2*T*hr*nope*lat; weights hr*nope*lat*wb
        absorb_k = self._linear(tg, hr * lat, m.qk_nope_head_dim)
        # RoPE on q and k; latent + rope key written to the cache
        rope = elementwise_time(
            r, tg * (2 * hr * rope_w + 2 * rope_w) * ACT_BYTES + tg * (lat + rope_w) * self.kvb
        )
        # attention: every rank reads the whole latent cache once (one KV group of hr heads):
        #   bytes = sum_i (c_i + n_i) * (lat + rope) * kv_bytes
        #   FLOPs = 2*(lat + rope) [scores] + 2*lat [values] per (query row, key); rows = hr * n_i
        attn = attention_time(
            r,
            b.kv_tokens * (lat + rope_w) * self.kvb,
            2 * (2 * lat + rope_w) * b.rows_x_keys(hr, r.attention_tile_m),
            b.tokens * hr * (2 * lat + rope_w) * ACT_BYTES,
        )
        # W_UV per head: latent out -> v: FLOPs 2*T*hr*lat*v; then o: [T, hr*v] x [hr*v, h]
        absorb_v = self._linear(tg, hr * m.v_head_dim, lat)
        o = self._linear(tg, h, hr * m.v_head_dim)
        parts: dict[str, tuple[F64, int]] = {
            QKV_O: (down + q_up + absorb_k + absorb_v + o, 5 * self.kpg),
            ATTENTION: (attn, 1),
            ELEMENTWISE: (norm + lora_norm + rope, 3),
        }
        if self.tp > 1:
            parts[COMM] = (allreduce_time(r, tg * h * ACT_BYTES, self.tp), 1)
        return parts

    def _dense_mlp(self, tg: F64) -> dict[str, tuple[F64, int]]:
        """Post-attention norm, SwiGLU MLP (gate+up, SiLU*mul, down), all-reduce."""
        m, r = self.model, self.r
        f = m.ffn / self.tp
        norm = elementwise_time(r, 4 * tg * m.hidden * ACT_BYTES)
        gate_up = self._linear(tg, 2 * f, m.hidden)  # [T, h] x [h, 2f]
        act = elementwise_time(r, 3 * tg * f * ACT_BYTES)  # read [T, 2f], write [T, f]
        down = self._linear(tg, m.hidden, f)  # [T, f] x [f, h]
        parts: dict[str, tuple[F64, int]] = {
            MLP: (gate_up + down, 2 * self.kpg),
            ELEMENTWISE: (norm + act, 2),
        }
        if self.tp > 1:
            parts[COMM] = (allreduce_time(r, tg * m.hidden * ACT_BYTES, self.tp), 1)
        return parts

    def _moe_mlp(self, tg: F64) -> dict[str, tuple[F64, int]]:
        """Post-attention norm, router, top-k, permute, routed experts, shared experts, combine."""
        m, r = self.model, self.r
        h, e, k = m.hidden, m.experts, m.experts_topk
        f = m.expert_ffn / self.tp
        norm = elementwise_time(r, 4 * tg * h * ACT_BYTES)
        router = self._linear(tg, e, h)  # replicated [h, E]
        # top-k softmax over fp32 router logits; sort (token, expert) pairs by expert (int32 ids
        # read + written; the grouped GEMM gathers rows itself); combine: read k outputs, write 1
        topk = elementwise_time(r, tg * e * LOGIT_BYTES)
        permute = elementwise_time(r, 2 * tg * k * INDEX_BYTES)
        combine = elementwise_time(r, tg * (k + 1) * h * ACT_BYTES)
        experts = moe_experts_time(r, tg, e, k, h, f, self.fmt)
        act = elementwise_time(r, 3 * tg * k * f * ACT_BYTES)
        mlp, ew = router + experts, norm + topk + permute + combine + act
        n_mlp, n_ew = 3 * self.kpg, 5
        if m.shared_experts:
            fs = m.shared_experts * f
            mlp = mlp + self._linear(tg, 2 * fs, h) + self._linear(tg, h, fs)
            ew = ew + elementwise_time(r, 3 * tg * fs * ACT_BYTES)
            n_mlp, n_ew = n_mlp + 2 * self.kpg, n_ew + 1
        parts: dict[str, tuple[F64, int]] = {MLP: (mlp, n_mlp), ELEMENTWISE: (ew, n_ew)}
        if self.tp > 1:
            parts[COMM] = (allreduce_time(r, tg * h * ACT_BYTES, self.tp), 1)
        return parts
