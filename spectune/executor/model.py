"""A real-shape Llama-family dense decoder with a KV cache, driven by a ModelSpec.

Weights are random (latency does not depend on their values) and filled on the device, so the
8B target costs no host time or host memory. Per layer a forward is: fused q|k|v GEMM, RoPE
fused with the K/V store into the cache, attention, output GEMM, add+RMSNorm, fused gate|up
GEMM, silu*up, down GEMM, add+RMSNorm: nine kernels plus attention's few (spectune.kernels),
which keeps a CUDA-graph replay near the weight-streaming floor. With `Decoder.fused` set (a
LayerGemmPlan), a dense layer is four GEMMs that carry the norms, residual adds and SwiGLU
(fused_layer_forward; spectune.kernels.gemm_fused) plus RoPE + store and attention.

Attention is planned by the caller: a verify passes a TreeAttentionPlan (B x N tree tokens) or a
RaggedBucket (packed pruned trees) and each layer calls its `run`; without a plan (drafting,
or verifying without the tree kernel) the new tokens attend through span_attention with a bool
mask over the span of new keys.

Bytes one forward must move (the roofline floor): every layer weight and the LM head once
(ModelSpec.weight_bytes() minus the untied embedding, of which only B*N rows are read), plus the
K/V prefix of every sequence once per layer: B * C * kv_bytes_per_token.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from spectune.kernels.elementwise import add_rmsnorm
from spectune.kernels.gemm import linear, linear_gated
from spectune.kernels.gemm_fused import RopeStore, fused_linear
from spectune.kernels.gemm_fused_config import LayerGemmPlan
from spectune.kernels.ragged_plan import RaggedBucket
from spectune.kernels.rope import rope_store_, rope_tables
from spectune.kernels.span_attention import span_attention
from spectune.kernels.tree_attention_plan import HeadShape, TreeAttentionPlan
from spectune.specs import ModelSpec, SpecError

#: what a verify hands each layer's attention: the dense plan or one bucket of a ragged plan
AttentionPlan = TreeAttentionPlan | RaggedBucket

ROPE_THETA = 500000.0  # Llama 3 rope_theta (config.json); latency does not depend on it
INIT_RANGE = 0.02  # uniform(-a, a) fill: keeps activations finite through random layers


def floor_bytes(spec: ModelSpec, batch: int, context: int) -> float:
    """Fewest bytes one target forward must read: weights actually multiplied (all layers, the
    LM head; not the untied embedding table) plus every sequence's cached K/V once."""
    weights = spec.weight_bytes()
    if not spec.tie_embeddings:
        weights -= spec.embedding_params() * spec.dtype_bytes
    return float(weights + batch * context * spec.kv_bytes_per_token())


def _fill(
    shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, gen: torch.Generator | None
) -> torch.Tensor:
    t = torch.empty(shape, device=device, dtype=dtype)
    return t.uniform_(-INIT_RANGE, INIT_RANGE, generator=gen)


@dataclass
class LayerWeights:
    """One decoder layer. Linear weights are [out, in] (x @ W.T).

    wqkv: [(H + 2*KVH) * D, in_width]  q, k, v stacked (q heads first)
    wo: [hidden, H * D];  w_gate_up: [2 * ffn, hidden] (gate first);  w_down: [hidden, ffn]
    norm_attn, norm_mlp: [hidden]
    reduce: the sum over tensor-parallel ranks of a row-parallel output [.., hidden], applied to
    the o and down projections' outputs (spectune.executor.tp); None on one GPU
    """

    wqkv: torch.Tensor
    wo: torch.Tensor
    w_gate_up: torch.Tensor
    w_down: torch.Tensor
    norm_attn: torch.Tensor
    norm_mlp: torch.Tensor
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = field(default=None, kw_only=True)

    @classmethod
    def random(
        cls, spec: ModelSpec, device: torch.device, dtype: torch.dtype, gen: torch.Generator | None
    ) -> LayerWeights:
        h, d = spec.hidden, spec.head_dim
        qkv_out = (spec.heads + 2 * spec.kv_heads) * d
        return cls(
            wqkv=_fill((qkv_out, spec.attn_in_width), device, dtype, gen),
            wo=_fill((h, spec.heads * d), device, dtype, gen),
            w_gate_up=_fill((2 * spec.ffn, h), device, dtype, gen),
            w_down=_fill((h, spec.ffn), device, dtype, gen),
            norm_attn=torch.ones(spec.hidden, device=device, dtype=dtype),
            norm_mlp=torch.ones(h, device=device, dtype=dtype),
        )


class KVCache:
    """kv: [layers, 2, max_batch, capacity, KVH, D] (the kernels' fixed-capacity layout: one
    layer's K viewed as [B * capacity, KVH, D]). A forward over N new tokens of each sequence
    writes their K/V at positions [context + slot, context + slot + N)."""

    def __init__(
        self,
        spec: ModelSpec,
        max_batch: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
    ):
        self.capacity = capacity
        self.kv = torch.empty(
            (spec.layers, 2, max_batch, capacity, spec.kv_heads, spec.head_dim),
            device=device,
            dtype=dtype,
        )
        self.kv.uniform_(-1.0, 1.0)  # prefix contents are arbitrary but finite

    def layer(self, i: int, batch: int) -> torch.Tensor:
        """[2, batch, capacity, KVH, D] view of layer i."""
        return self.kv[i, :, :batch]

    def layers(self, batch: int) -> torch.Tensor:
        """[layers, 2, batch, capacity, KVH, D] view of every layer (what tune_tree_attention
        rotates over)."""
        return self.kv[:, :, :batch]


# layer_forward's / attention_block's arguments after (h, residual, w): spec, kv, pos, context,
# slot, span, mask, rope
LayerArgs = tuple[
    ModelSpec, torch.Tensor, torch.Tensor, int, int, int, torch.Tensor | None,
    tuple[torch.Tensor, torch.Tensor],
]  # fmt: skip


def _attend(
    qkv: torch.Tensor,
    b: int,
    n: int,
    spec: ModelSpec,
    kv: torch.Tensor,
    pos: torch.Tensor,
    context: int,
    slot: int,
    span: int,
    mask: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor],
    plan: AttentionPlan | None,
    pdl: bool = False,
    stored: bool = False,
) -> torch.Tensor:
    """RoPE + K/V store of qkv: [B*N, (Hq+2Hk)*D], then attention of its q heads (arguments as
    attention_block's) -> [B, N, Hq, D]. pdl: the store as a programmatic dependent launch;
    stored: qkv is the rotated q [B*N, Hq*D] alone, its K/V already in the cache."""
    hq, hk, d = spec.heads, spec.kv_heads, spec.head_dim
    if stored:
        pass
    elif isinstance(plan, RaggedBucket):
        plan.store(qkv, hq, hk, pos.reshape(-1), rope, kv)
    else:
        rope_store_(qkv, hq, hk, pos.reshape(-1), *rope, kv, context + slot, pdl=pdl)
    q = qkv[:, : hq * d].view(b, n, hq, d)
    if plan is not None:
        return plan.run(q, kv)
    assert mask is not None, "span attention needs the mask over the new keys"
    return span_attention(
        q,
        kv[0, :, :context].transpose(1, 2),
        kv[1, :, :context].transpose(1, 2),
        kv[0, :, context : context + span].transpose(1, 2),
        kv[1, :, context : context + span].transpose(1, 2),
        mask,
    )


def attention_block(
    h: torch.Tensor,
    residual: torch.Tensor,
    w: LayerWeights,
    spec: ModelSpec,
    kv: torch.Tensor,
    pos: torch.Tensor,
    context: int,
    slot: int,
    span: int,
    mask: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor],
    plan: AttentionPlan | None = None,
) -> torch.Tensor:
    """The attention half of a pre-norm decoder layer (dense and MoE layers share it). h: [B, N,
    in_width] its normed input; residual: [B, N, hidden] the residual stream (updated in place:
    += attention output). Returns the MLP's normed input [B, N, hidden].

    kv: [2, B, cap, KVH, D] this layer's cache; the N new K/V go to [context+slot, +N); attention
    sees the prefix [0, context) fully and keys [context, context+span) through mask: bool[B, N, span].
    plan: when given (verify passes, slot 0, span N), its tree attention runs instead; a
    RaggedBucket (packed pruned trees: h is [1, T, .], kv holds the B sequences) also places
    each token's K/V in its own sequence's slot.
    """
    b, n, _ = h.shape
    qkv = linear(h.view(b * n, -1), w.wqkv)  # [B*N, (Hq+2Hk)*D]
    attn = _attend(qkv, b, n, spec, kv, pos, context, slot, span, mask, rope, plan)
    o = linear(attn.reshape(b * n, -1), w.wo).view(b, n, -1)
    if w.reduce is not None:
        o = w.reduce(o)
    return add_rmsnorm(o, residual, w.norm_mlp)


def layer_forward(
    h: torch.Tensor,
    residual: torch.Tensor,
    w: LayerWeights,
    spec: ModelSpec,
    kv: torch.Tensor,
    pos: torch.Tensor,
    context: int,
    slot: int,
    span: int,
    mask: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor],
    plan: AttentionPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One pre-norm dense decoder layer: attention_block (same arguments), then the SwiGLU MLP.
    Returns (the MLP output [B, N, hidden], to be added to the residual by the caller's fused
    add+norm, and the residual stream)."""
    h2 = attention_block(h, residual, w, spec, kv, pos, context, slot, span, mask, rope, plan)
    b, n, _ = h2.shape
    gu = linear(h2.view(b * n, -1), w.w_gate_up)
    mlp = linear_gated(gu, w.w_down).view(b, n, -1)
    if w.reduce is not None:
        mlp = w.reduce(mlp)
    return mlp, residual


def fused_layer_forward(
    residual: torch.Tensor,
    w: LayerWeights,
    spec: ModelSpec,
    kv: torch.Tensor,
    pos: torch.Tensor,
    context: int,
    slot: int,
    span: int,
    mask: torch.Tensor | None,
    rope: tuple[torch.Tensor, torch.Tensor],
    plan: AttentionPlan | None,
    gemm: LayerGemmPlan,
) -> None:
    """One dense layer as four fused GEMMs (spectune.kernels.gemm_fused) around attention, on
    the residual stream residual: [B, N, hidden] (updated in place; the other arguments as
    layer_forward's). Launches: q|k|v with the attention RMSNorm in its prologue, RoPE + K/V
    store (in the q|k|v epilogue when gemm.rope_in_qkv, except for ragged buckets), attention, o with residual += in its epilogue, gate|up with the MLP RMSNorm and
    silu * up, down with residual +=; no add+norm or SwiGLU kernel and no split-K reduce
    kernel in between. Equal to layer_forward + the caller's add_rmsnorm up to rounding."""
    b, n, hid = residual.shape
    r2 = residual.view(b * n, hid)
    pdl = gemm.pdl
    store = None
    if gemm.rope_in_qkv and not isinstance(plan, RaggedBucket):  # RoPE + K/V store fused too
        hq, hk = spec.heads, spec.kv_heads
        store = RopeStore(pos.reshape(-1), *rope, kv, context + slot, n, hq, hk)
    qkv = fused_linear(r2, w.wqkv, norm_weight=w.norm_attn, config=gemm.qkv, pdl=pdl, rope=store)
    args = (spec, kv, pos, context, slot, span, mask, rope, plan, pdl, store is not None)
    attn = _attend(qkv, b, n, *args)
    fused_linear(attn.reshape(b * n, -1), w.wo, residual=r2, config=gemm.o, pdl=pdl)
    act = fused_linear(r2, w.w_gate_up, norm_weight=w.norm_mlp, gated=True,
                       config=gemm.gate_up, pdl=pdl)  # fmt: skip
    fused_linear(act, w.w_down, residual=r2, config=gemm.down, pdl=pdl)


class Decoder:
    """A dense Llama-family decoder at the shape of `spec` with random weights.

    forward(tokens [B, N], pos [B, N], ...) -> final normed hidden [B, N, hidden];
    lm_head(hidden [B, N, hidden]) -> logits [B, N, vocab].
    """

    def __init__(
        self,
        spec: ModelSpec,
        device: torch.device | str,
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        max_pos: int = 1 << 17,
    ):
        if spec.is_moe or spec.is_mla or spec.is_draft_head:
            raise SpecError(
                f"{spec.name}: the executor runs dense decoders only (no MoE/MLA/heads)"
            )
        self.spec = spec
        self.shard = spec  # the per-rank shape the layers run (spectune.executor.tp narrows it)
        self.device = torch.device(device)
        self.dtype = dtype
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.embed = _fill((spec.vocab, spec.hidden), self.device, dtype, gen)
        self.layers = [
            LayerWeights.random(spec, self.device, dtype, gen) for _ in range(spec.layers)
        ]
        self.norm_final = torch.ones(spec.hidden, device=self.device, dtype=dtype)
        self.lm = (
            self.embed
            if spec.tie_embeddings
            else _fill((spec.vocab, spec.hidden), self.device, dtype, gen)
        )
        self.rope = rope_tables(max_pos, spec.head_dim, ROPE_THETA, self.device)
        # set to run each layer as fused_layer_forward (dense layers on one GPU); None: the
        # unfused kernels (layer_forward + add_rmsnorm)
        self.fused: LayerGemmPlan | None = None

    def new_cache(self, max_batch: int, capacity: int) -> KVCache:
        return KVCache(self.shard, max_batch, capacity, self.device, self.dtype)

    @property
    def heads(self) -> HeadShape:
        """The attention heads an attention plan for this model is made for."""
        s = self.shard
        return HeadShape(s.heads, s.kv_heads, s.head_dim, self.dtype)

    def forward(
        self,
        tokens: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        mask: torch.Tensor,
        slot: int = 0,
        capture: tuple[int, ...] = (),
        plan: TreeAttentionPlan | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """tokens, pos: int64[B, N]; mask: bool[B, N, slot + N] over the new keys
        [context, context + slot + N). Returns (final normed hidden [B, N, hidden], the residual
        stream after each layer index in `capture`, each [B, N, hidden] (EAGLE-3's inputs))."""
        b = tokens.shape[0]
        span = mask.shape[-1]
        if context + span > cache.capacity:
            raise SpecError(
                f"cache capacity {cache.capacity} < context {context} + {span} new keys"
            )
        return self._layers(tokens, pos, cache, b, context, slot, span, mask, capture, plan)

    def forward_ragged(
        self,
        tokens: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        ragged: RaggedBucket,
        capture: tuple[int, ...] = (),
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """A verify over packed trees: tokens, pos int64[T] (T = ragged.tokens, the sequences'
        kept nodes then padding), K/V to the slots ragged's plan names, attention by the
        kernels' ragged tree attention. Returns (hidden [T, hidden], captured [T, hidden] each)."""
        lay = ragged.layout
        if lay.context + lay.nodes > cache.capacity:
            raise SpecError(
                f"cache capacity {cache.capacity} < context {lay.context} + {lay.nodes} new keys"
            )
        x, cap = self._layers(
            tokens[None], pos[None], cache, ragged.batch, lay.context, 0, 0, None, capture, ragged
        )
        return x[0], [c[0] for c in cap]

    def _layers(
        self,
        tokens: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        rows: int,
        context: int,
        slot: int,
        span: int,
        mask: torch.Tensor | None,
        capture: tuple[int, ...],
        plan: AttentionPlan | None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Every layer over tokens [B', N'] (cache rows 0..rows-1) -> (hidden, captured)."""
        residual = torch.nn.functional.embedding(tokens, self.embed)  # fresh tensor: the stream
        captured: dict[int, torch.Tensor] = {}
        fused = self._fused_plan()
        if fused is not None:
            for i, w in enumerate(self.layers):
                args = (self.shard, cache.layer(i, rows), pos, context, slot, span, mask, self.rope)
                fused_layer_forward(residual, w, *args, plan, fused)
                if i in capture:
                    captured[i] = residual.clone()
            x = add_rmsnorm(residual, None, self.norm_final)
            return x, [captured[i] for i in capture]
        x = add_rmsnorm(residual, None, self.layers[0].norm_attn)
        for i, w in enumerate(self.layers):
            nxt = self.layers[i + 1].norm_attn if i + 1 < len(self.layers) else self.norm_final
            args = (self.shard, cache.layer(i, rows), pos, context, slot, span, mask, self.rope)
            x = self._layer(x, residual, w, args, plan, nxt)
            if i in capture:
                captured[i] = residual.clone()
        return x, [captured[i] for i in capture]

    def _fused_plan(self) -> LayerGemmPlan | None:
        """The fused-layer plan where it applies: set, dense layers (a subclass that overrides
        _layer keeps its own), and no tensor-parallel reduction between the GEMMs."""
        if type(self)._layer is not Decoder._layer or self.fused is None:
            return None
        return self.fused if all(w.reduce is None for w in self.layers) else None

    def _layer(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        w: LayerWeights,
        args: LayerArgs,
        plan: AttentionPlan | None,
        nxt: torch.Tensor,
    ) -> torch.Tensor:
        """One layer: x [B, N, .] its normed input, residual updated in place, args as
        layer_forward's (spec .. rope); returns the next layer's normed input (norm weight nxt).
        The hook an MoE decoder overrides for its MLP."""
        mlp, residual = layer_forward(x, residual, w, *args, plan)
        return add_rmsnorm(mlp, residual, nxt)  # residual += mlp; x = norm(residual)

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, N, hidden] -> logits [B, N, vocab] (bytes: vocab * hidden * 2 weight + logits)."""
        return linear(hidden, self.lm)

    def eagle_capture_layers(self) -> tuple[int, int, int]:
        """The three layers whose outputs EAGLE-3 fuses (low, middle, high), as EAGLE-3 picks them."""
        n = self.spec.layers
        return (min(2, n - 1), n // 2, max(n - 3, 0))
