"""A real-shape mixture-of-experts decoder (Qwen3-MoE family) for verify-step timing.

Same forward as model.Decoder (same signature, attention path and kernels unchanged), but the
MLP of every MoE layer is: router GEMM [T, h] x [h, E], softmax top-k (spectune.kernels.
fused_moe.route_topk), on-GPU grouping of the T*k (token, expert) pairs by expert (moe_align),
grouped gate_up+SiLU and down GEMMs over the touched experts only, and the weighted sum of each
token's k rows fused with the residual add and the next RMSNorm (moe_combine). All shapes are
static and nothing syncs with the host, so a whole verify step replays from one CUDA graph.

Weights are random bf16 (uniform, like model.py); routing is therefore softmax top-k over
logits of random router weights times real (normed) hidden states: near-uniform and independent
across tokens, which is what the cost model assumes (expert union E * (1 - (1 - k/E)^T)). Real
traffic is skewed and tree tokens share prefixes, so real unions are somewhat smaller.

Roofline of one MoE FFN over T tokens (bf16, `moe_ffn_roofline`): D = E * (1 - (1 - k/E)^T)
experts touched; bytes = D * 3 * h * I * 2 (touched experts' weights) + E * h * 2 (router)
+ T * k * (2h + 3I) * 2 (activations through both GEMMs); FLOPs = 2 * T * k * 3 * h * I
+ 2 * T * h * E. Qwen3-30B-A3B (h 2048, I 768, E 128, k 8): 75.5 MB of experts per layer at
T = 1, all 1.21 GB from T ~ 600; 58 GB of the 61 GB of weights are experts.

MoE layers share model.attention_block and override Decoder._layer for their MLP.
Not modelled: Qwen3's per-head q/k RMSNorm (two small elementwise kernels per layer in engines
that do not fuse them into RoPE), shared experts (none in Qwen3; SpecError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from spectune.executor.model import (
    INIT_RANGE,
    ROPE_THETA,
    AttentionPlan,
    Decoder,
    KVCache,
    LayerArgs,
    LayerWeights,
    attention_block,
)
from spectune.kernels.fused_moe import (
    MoEConfig,
    default_config,
    moe_align,
    moe_combine,
    moe_expert_rows,
    route_topk,
)
from spectune.kernels.gemm import linear
from spectune.kernels.rope import rope_tables
from spectune.kernels.timing import graph_time
from spectune.planner.operators import expected_experts
from spectune.specs import ModelSpec, SpecError


def moe_ffn_roofline(spec: ModelSpec, tokens: float) -> dict[str, float]:
    """Expected bytes and FLOPs of one MoE FFN (router + routed experts) over `tokens` tokens
    routed uniformly: {"experts", "weight_bytes", "act_bytes", "bytes", "flops"}."""
    h, f, e, k = spec.hidden, spec.expert_ffn, spec.experts, spec.experts_topk
    wb = spec.dtype_bytes
    d = float(expected_experts(tokens, e, k))
    weights = d * 3 * h * f * wb + e * h * wb
    act = tokens * k * (2 * h + 3 * f) * 2
    flops = 2 * tokens * k * 3 * h * f + 2 * tokens * h * e
    return {
        "experts": d,
        "weight_bytes": weights,
        "act_bytes": act,
        "bytes": weights + act,
        "flops": flops,
    }


def moe_floor_bytes(spec: ModelSpec, batch: int, tokens: int, context: int) -> float:
    """Fewest bytes one verify forward of an MoE model reads: attention weights, router and the
    touched experts of every MoE layer (dense MLPs of dense layers), LM head, cached K/V once."""
    t = batch * tokens
    wb = spec.dtype_bytes
    dense = (spec.layers - spec.moe_layers) * spec.dense_mlp_params() * wb
    moe = spec.moe_layers * moe_ffn_roofline(spec, t)["weight_bytes"]
    attn = spec.layers * spec.attn_params_per_layer() * wb
    lm = spec.lm_vocab * spec.hidden * wb
    return float(attn + dense + moe + lm + batch * context * spec.kv_bytes_per_token())


def moe_weight_shapes(spec: ModelSpec) -> list[tuple[int, int]]:
    """(N, K) of the dense weight GEMMs (q|k|v, o, router, LM head; dense MLPs if any): the
    shapes gemm.autotune should time for this model."""
    d, h = spec.head_dim, spec.hidden
    shapes = [
        ((spec.heads + 2 * spec.kv_heads) * d, h),
        (h, spec.heads * d),
        (spec.experts, h),
        (spec.lm_vocab, h),
    ]
    if spec.moe_layers < spec.layers:
        shapes += [(2 * spec.ffn, h), (h, spec.ffn)]
    return shapes


def _fill(
    shape: tuple[int, ...], device: torch.device, dtype: torch.dtype, gen: torch.Generator | None
) -> torch.Tensor:
    return torch.empty(shape, device=device, dtype=dtype).uniform_(
        -INIT_RANGE, INIT_RANGE, generator=gen
    )


@dataclass
class MoELayerWeights(LayerWeights):
    """A decoder layer with a routed-expert MLP: w_gate_up [E, 2I, h] (gate rows first),
    w_down [E, h, I], router [E, h]; attention weights and norms as in LayerWeights."""

    router: torch.Tensor

    @classmethod
    def random(
        cls, spec: ModelSpec, device: torch.device, dtype: torch.dtype, gen: torch.Generator | None
    ) -> MoELayerWeights:
        h, d, e, f = spec.hidden, spec.head_dim, spec.experts, spec.expert_ffn
        return cls(
            wqkv=_fill(((spec.heads + 2 * spec.kv_heads) * d, h), device, dtype, gen),
            wo=_fill((h, spec.heads * d), device, dtype, gen),
            w_gate_up=_fill((e, 2 * f, h), device, dtype, gen),
            w_down=_fill((e, h, f), device, dtype, gen),
            norm_attn=torch.ones(h, device=device, dtype=dtype),
            norm_mlp=torch.ones(h, device=device, dtype=dtype),
            router=_fill((e, h), device, dtype, gen),
        )


class AliasedKVCache(KVCache):
    """A KV cache with fewer physical layers than the model: layer i uses physical layer
    i % physical. Timing-neutral where one layer's K/V read (B * C * 2 * KVH * D * 2 bytes) plus
    the weights streamed between two uses of the same slice far exceed L2 (Qwen3-30B-A3B streams
    >= 113 MB of weights per layer), and lets batch 64 x 4096 tokens fit beside 61 GB of weights."""

    def __init__(
        self,
        spec: ModelSpec,
        max_batch: int,
        capacity: int,
        device: torch.device,
        dtype: torch.dtype,
        physical_layers: int,
    ):
        p = max(1, min(physical_layers, spec.layers))
        small = dataclasses.replace(spec, layers=p, dense_layers=min(spec.dense_layers, p))
        super().__init__(small, max_batch, capacity, device, dtype)
        self.physical_layers = p

    def layer(self, i: int, batch: int) -> torch.Tensor:
        return self.kv[i % self.physical_layers, :, :batch]


# tokens per step -> MoEConfig chosen by tune_moe on this GPU (else default_config)
_TUNED: dict[int, MoEConfig] = {}


def moe_config(spec: ModelSpec, tokens: int) -> MoEConfig:
    return _TUNED.get(tokens) or default_config(tokens, spec.experts, spec.experts_topk)


ROUTINGS = ("hidden", "independent")


def moe_rows(
    x: torch.Tensor,
    w: MoELayerWeights,
    spec: ModelSpec,
    use_triton: bool | None = None,
    routing: str = "hidden",
) -> torch.Tensor:
    """x: [T, h] (the post-attention normed hidden) -> the weighted expert outputs [T, k, h]:
    router GEMM, route_topk, moe_align and the two grouped GEMMs (5 launches on the GPU).

    routing "hidden": top-k of the router GEMM over the hidden states (random weights make the
    tokens of one step route alike, so fewer experts are touched than real text touches);
    "independent": the router GEMM still runs, but its logits are replaced by fresh Gaussian
    logits per token (CUDA-graph safe), so each token picks k experts independently and
    uniformly: the expert union the cost model assumes."""
    t, k = x.shape[0], spec.experts_topk
    cfg = moe_config(spec, t)
    logits = linear(x, w.router)
    if routing == "independent":
        logits = torch.randn_like(logits)
    elif routing != "hidden":
        raise SpecError(f"routing {routing!r} is not one of {ROUTINGS}")
    ids, weights = route_topk(logits, k, use_triton=use_triton)
    align = None
    if x.is_cuda if use_triton is None else use_triton:
        align = moe_align(ids, spec.experts, cfg.block_m, use_triton=True)
    rows = moe_expert_rows(
        x, w.w_gate_up, w.w_down, ids, weights, align, cfg, use_triton=use_triton
    )
    return rows.view(t, k, -1)


class MoEDecoder(Decoder):
    """An MoE decoder at the shape of `spec` with random weights (dense layers, if the spec has
    leading ones, run model.layer_forward). forward / forward_ragged / lm_head as model.Decoder's.
    use_triton: the fused MoE kernels (default: on CUDA tensors; the interpreter on CPU).
    routing: "hidden" (router over the hidden states) or "independent" (moe_rows)."""

    def __init__(
        self,
        spec: ModelSpec,
        device: torch.device | str,
        dtype: torch.dtype = torch.bfloat16,
        seed: int = 0,
        max_pos: int = 1 << 17,
        use_triton: bool | None = None,
        routing: str = "hidden",
    ):
        if routing not in ROUTINGS:
            raise SpecError(f"routing {routing!r} is not one of {ROUTINGS}")
        self.routing = routing
        if not spec.is_moe or spec.is_mla or spec.is_draft_head or spec.shared_experts:
            raise SpecError(f"{spec.name}: MoEDecoder runs GQA MoE decoders without shared experts")
        self.spec = spec
        self.shard = spec
        self.device = torch.device(device)
        self.dtype = dtype
        self.use_triton = use_triton
        gen = torch.Generator(device=self.device).manual_seed(seed)
        self.embed = _fill((spec.vocab, spec.hidden), self.device, dtype, gen)
        self.layers: list[LayerWeights] = [
            LayerWeights.random(spec, self.device, dtype, gen)
            if i < spec.dense_layers
            else MoELayerWeights.random(spec, self.device, dtype, gen)
            for i in range(spec.layers)
        ]
        self.norm_final = torch.ones(spec.hidden, device=self.device, dtype=dtype)
        self.lm = (
            self.embed
            if spec.tie_embeddings
            else _fill((spec.vocab, spec.hidden), self.device, dtype, gen)
        )
        self.rope = rope_tables(max_pos, spec.head_dim, ROPE_THETA, self.device)

    def new_cache(self, max_batch: int, capacity: int, kv_layers: int | None = None) -> KVCache:
        """A cache for every layer, or (kv_layers < layers) an AliasedKVCache of that many."""
        if kv_layers is None or kv_layers >= self.spec.layers:
            return KVCache(self.spec, max_batch, capacity, self.device, self.dtype)
        return AliasedKVCache(self.spec, max_batch, capacity, self.device, self.dtype, kv_layers)

    def _layer(
        self,
        x: torch.Tensor,
        residual: torch.Tensor,
        w: LayerWeights,
        args: LayerArgs,
        plan: AttentionPlan | None,
        nxt: torch.Tensor,
    ) -> torch.Tensor:
        """Decoder._layer with the MoE MLP on MoE layers (forward and forward_ragged both)."""
        if not isinstance(w, MoELayerWeights):
            return super()._layer(x, residual, w, args, plan, nxt)
        b, n, _ = x.shape
        h2 = attention_block(x, residual, w, *args, plan)
        mlp_rows = moe_rows(h2.view(b * n, -1), w, self.spec, self.use_triton, self.routing)
        # residual += sum of the k weighted rows; x = norm(residual) (one kernel)
        return moe_combine(mlp_rows, residual, nxt, use_triton=self.use_triton).view(b, n, -1)


# (block_m, block_n, block_n_down, block_k, warps, stages) tried by tune_moe
CANDIDATES = (
    MoEConfig(16, 32, 64, 128, 4, 4),
    MoEConfig(16, 64, 64, 128, 4, 3),
    MoEConfig(16, 32, 32, 256, 4, 3),
    MoEConfig(32, 64, 64, 64, 4, 4),
    MoEConfig(64, 64, 128, 64, 4, 3),
    MoEConfig(64, 128, 128, 64, 8, 3),
    MoEConfig(128, 128, 128, 64, 8, 3),
)


def tune_moe(
    decoder: MoEDecoder,
    tokens: Sequence[int],
    candidates: Sequence[MoEConfig] = CANDIDATES,
    layers: int = 4,
) -> list[dict[str, object]]:
    """Time the MoE FFN (router to combine) of `layers` layers in turn (their experts do not fit
    in L2 together) under each candidate per step size T, CUDA-graph replays, and keep the
    fastest for moe_rows. Returns the timing rows (seconds per layer, GB/s of the roofline)."""
    spec, dev = decoder.spec, decoder.device
    moe_layers = [w for w in decoder.layers if isinstance(w, MoELayerWeights)][:layers]
    out: list[dict[str, object]] = []
    for t in tokens:
        gen = torch.Generator(device=dev).manual_seed(t)
        x = torch.randn((t, spec.hidden), device=dev, generator=gen).to(decoder.dtype)
        res = torch.zeros_like(x)
        mean_rows = (
            t * spec.experts_topk / float(expected_experts(t, spec.experts, spec.experts_topk))
        )
        roof = moe_ffn_roofline(spec, t)
        best, best_t = None, float("inf")
        for cfg in candidates:
            if cfg.block_m > 2 * max(16.0, mean_rows):
                continue
            _TUNED[t] = cfg

            def ffn(x: torch.Tensor = x, res: torch.Tensor = res) -> None:
                for w in moe_layers:
                    moe_combine(moe_rows(x, w, spec), res, w.norm_mlp)

            try:
                sec = graph_time(ffn, dev, 10) / len(moe_layers)
            except Exception as e:  # a config that does not compile or fit is skipped
                out.append(
                    {"tokens": t, "config": dataclasses.astuple(cfg), "error": repr(e)[:160]}
                )
                continue
            out.append(
                {
                    "tokens": t,
                    "config": dataclasses.astuple(cfg),
                    "seconds": sec,
                    "gb_s": roof["bytes"] / sec / 1e9,
                    "tflop_s": roof["flops"] / sec / 1e12,
                }
            )
            if sec < best_t:
                best, best_t = cfg, sec
        if best is None:
            _TUNED.pop(t, None)
        else:
            _TUNED[t] = best
    return out
