"""Transformer shape description (dense, GQA, MoE, MLA, EAGLE-3 draft heads) and presets.

Parameter and KV-byte helpers live here because the cost model, the simulator's KV admission and
the executor's real-shape runner all need the same counts. Counts ignore norms and biases
(under 0.01% of parameters for every preset).

A model used as a drafter is one of the drafter kinds acceptance is keyed on
(`drafter_kind`): a draft head (EAGLE, EAGLE-3, Medusa, an MTP module) or a full model (a draft
model). `family` names the tokenizer family, which draft models must share with their target
(specs.compat checks pairs). `load_model` also reads a Hugging Face config.json (specs.hf_config).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from spectune.specs.errors import SpecError
from spectune.specs.hf_config import hf_config_fields, hf_config_path
from spectune.specs.io import from_mapping, help_field, load_spec, preset
from spectune.specs.quant import WEIGHT_FORMATS, check_format, linear_weight_bytes

ARCHS = ("decoder", "eagle3-head")
#: how a model drafts: '' is a full model (a draft model when used as a drafter); the others are
#: heads that read the target's hidden states
DRAFT_METHODS = ("", "eagle", "eagle3", "medusa", "mtp")


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer, or an EAGLE-3 draft head (arch='eagle3-head')."""

    name: str = help_field(help="short identifier, e.g. llama-3.1-8b")
    layers: int = help_field(help="decoder layers")
    hidden: int = help_field(help="model width (d_model)")
    heads: int = help_field(help="query heads")
    kv_heads: int = help_field(help="key/value heads (GQA groups); equal to heads for MHA")
    head_dim: int = help_field(help="width of one attention head")
    ffn: int = help_field(help="intermediate width of a dense (SwiGLU) MLP")
    vocab: int = help_field(help="vocabulary size (embedding rows)")
    arch: str = help_field("decoder", help="'decoder' or 'eagle3-head' (one layer on 3x hidden)")
    draft_vocab: int = help_field(0, help="reduced LM-head vocabulary of a draft head (0: vocab)")
    tie_embeddings: bool = help_field(False, help="LM head shares the embedding matrix")
    experts: int = help_field(0, help="routed experts per MoE layer (0: dense model)")
    experts_topk: int = help_field(0, help="routed experts each token uses")
    expert_ffn: int = help_field(0, help="intermediate width of one expert")
    shared_experts: int = help_field(0, help="always-on shared experts per MoE layer")
    dense_layers: int = help_field(0, help="leading layers with a dense MLP in an MoE model")
    q_lora_rank: int = help_field(0, help="MLA query compression rank (0: no MLA)")
    kv_lora_rank: int = help_field(0, help="MLA latent KV width (0: no MLA)")
    qk_rope_head_dim: int = help_field(0, help="MLA decoupled RoPE key width")
    qk_nope_head_dim: int = help_field(0, help="MLA non-RoPE query/key width per head")
    v_head_dim: int = help_field(0, help="MLA value width per head")
    dtype_bytes: int = help_field(2, help="bytes per weight element (2: bf16, 1: fp8)")
    kv_dtype_bytes: int = help_field(2, help="bytes per KV-cache element")
    family: str = help_field(
        "", help="tokenizer family, e.g. llama-3, qwen3 (draft models must share it; '' unknown)"
    )
    draft_method: str = help_field(
        "", help="'' (full model: a draft model as drafter), or head kind eagle/eagle3/medusa/mtp"
    )
    base_model: str = help_field(
        "", help="target a draft head or MTP module was trained for (a model name; '' none)"
    )
    weight_dtype: str = help_field(
        "", help="checkpoint dtype as published (HF torch_dtype, e.g. bfloat16); '' unknown"
    )
    quantization: str = help_field(
        "", help="weight quantization as published (HF quantization_config, e.g. fp8); '' none"
    )
    weight_format: str = help_field(
        "",
        help=f"format the decoder's linear layers are priced in, one of {WEIGHT_FORMATS} "
        "(specs.quant); '' dense at dtype_bytes. Embeddings and LM head stay at dtype_bytes",
    )
    quant_group_size: int = help_field(
        0,
        help="weights of K sharing one scale in a quantized weight_format (w4a16: 32/64/128; "
        "nvfp4 16, mxfp4 32); 0: one scale per output channel",
    )
    hf_repo: str = help_field(
        "",
        help="Hugging Face repo id of the checkpoint these figures describe (what engines load "
        "by default); empty: none known",
    )
    source: str = help_field("user-provided", help="where these figures come from")

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("field 'name' must be a non-empty string")
        if self.arch not in ARCHS:
            raise SpecError(f"field 'arch' must be one of {ARCHS}, got {self.arch!r}")
        for f in (
            "layers",
            "hidden",
            "heads",
            "kv_heads",
            "head_dim",
            "vocab",
            "dtype_bytes",
            "kv_dtype_bytes",
        ):
            if getattr(self, f) <= 0:
                raise SpecError(f"field {f!r} must be > 0, got {getattr(self, f)!r}")
        for fld in dataclasses.fields(self):
            v = getattr(self, fld.name)
            if isinstance(v, int) and not isinstance(v, bool) and v < 0:
                raise SpecError(f"field {fld.name!r} must be >= 0, got {v!r}")
        if self.heads % self.kv_heads:
            raise SpecError(
                f"field 'heads' ({self.heads}) must be a multiple of 'kv_heads' ({self.kv_heads})"
            )
        if self.experts:
            if not 0 < self.experts_topk <= self.experts:
                raise SpecError("field 'experts_topk' must be in 1..experts for an MoE model")
            if self.expert_ffn <= 0:
                raise SpecError("field 'expert_ffn' must be > 0 for an MoE model")
            if self.dense_layers > self.layers:
                raise SpecError("field 'dense_layers' cannot exceed 'layers'")
        if (self.dense_layers or not self.experts) and self.ffn <= 0:
            raise SpecError("field 'ffn' must be > 0 when any layer has a dense MLP")
        if self.is_mla and min(self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim) <= 0:
            raise SpecError("MLA needs qk_rope_head_dim, qk_nope_head_dim and v_head_dim > 0")
        if self.draft_vocab > self.vocab:
            raise SpecError("field 'draft_vocab' cannot exceed 'vocab'")
        if self.draft_method not in DRAFT_METHODS:
            raise SpecError(
                f"field 'draft_method' must be one of {DRAFT_METHODS}, got {self.draft_method!r}"
            )
        if self.is_draft_head and self.draft_method not in ("", "eagle3"):
            raise SpecError("an arch 'eagle3-head' model has draft_method 'eagle3' (or '')")
        check_format(self.weight_format, self.quant_group_size, f"model {self.name!r}")

    @classmethod
    def from_hf_config(cls, path: str | os.PathLike[str], name: str = "") -> ModelSpec:
        """The model a Hugging Face config.json describes (specs.hf_config reads it)."""
        fields, where = hf_config_fields(path, name)
        return from_mapping(cls, fields, where)

    # ---- shape facts ------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def is_draft_head(self) -> bool:
        return self.arch == "eagle3-head"

    @property
    def is_head(self) -> bool:
        """A draft head (EAGLE, EAGLE-3, Medusa, an MTP module): it drafts only for a target."""
        return self.is_draft_head or bool(self.draft_method)

    @property
    def drafter_kind(self) -> str:
        """The kind acceptance presets key on when this model drafts: eagle, eagle3, medusa,
        mtp, or draft-model (a full model)."""
        if self.draft_method:
            return self.draft_method
        return "eagle3" if self.is_draft_head else "draft-model"

    @property
    def lm_vocab(self) -> int:
        """Rows of the LM head (the reduced draft vocabulary for a draft head)."""
        return self.draft_vocab or self.vocab

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.is_moe else 0

    @property
    def q_width(self) -> int:
        """Query width per token: heads x per-head query/key width."""
        if self.is_mla:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return self.heads * self.head_dim

    @property
    def attn_out_width(self) -> int:
        """Width entering the output projection: heads x value width."""
        return self.heads * (self.v_head_dim if self.is_mla else self.head_dim)

    @property
    def attn_in_width(self) -> int:
        """Input width of q/k/v projections (an EAGLE-3 head feeds [embedding; fused hidden])."""
        return 2 * self.hidden if self.is_draft_head else self.hidden

    # ---- parameter counts (elements) ---------------------------------------------------------
    def attn_params_per_layer(self) -> int:
        h, d = self.attn_in_width, self.hidden
        if self.is_mla:
            q = (
                (h * self.q_lora_rank + self.q_lora_rank * self.q_width)
                if self.q_lora_rank
                else h * self.q_width
            )
            kv_a = h * (self.kv_lora_rank + self.qk_rope_head_dim)
            kv_b = self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv_a + kv_b + self.attn_out_width * d
        kv = 2 * h * self.kv_heads * self.head_dim
        return h * self.q_width + kv + self.attn_out_width * d

    def dense_mlp_params(self) -> int:
        """One SwiGLU MLP: gate, up (hidden x ffn) and down (ffn x hidden)."""
        return 3 * self.hidden * self.ffn

    def expert_params(self) -> int:
        """One expert's SwiGLU weights."""
        return 3 * self.hidden * self.expert_ffn

    def router_params(self) -> int:
        return self.hidden * self.experts

    def embedding_params(self) -> int:
        """Input embedding; an EAGLE-3 head reuses the target's, so it owns none."""
        return 0 if self.is_draft_head else self.vocab * self.hidden

    def lm_head_params(self) -> int:
        if self.tie_embeddings and not self.is_draft_head:
            return 0
        return self.lm_vocab * self.hidden

    def fc_params(self) -> int:
        """EAGLE-3's fusion of three target hidden states (3*hidden -> hidden)."""
        return 3 * self.hidden * self.hidden if self.is_draft_head else 0

    def total_params(self) -> int:
        dense = (self.layers - self.moe_layers) * self.dense_mlp_params()
        moe = self.moe_layers * (
            (self.experts + self.shared_experts) * self.expert_params() + self.router_params()
        )
        return (
            self.layers * self.attn_params_per_layer()
            + dense
            + moe
            + self.embedding_params()
            + self.lm_head_params()
            + self.fc_params()
        )

    def active_params_per_token(self) -> int:
        """Parameters one token multiplies through (the routed top-k experts only)."""
        dense = (self.layers - self.moe_layers) * self.dense_mlp_params()
        moe = self.moe_layers * (
            (self.experts_topk + self.shared_experts) * self.expert_params() + self.router_params()
        )
        lm = self.lm_vocab * self.hidden
        return self.layers * self.attn_params_per_layer() + dense + moe + lm + self.fc_params()

    @property
    def is_quantized(self) -> bool:
        """Whether the linear layers use a quantized weight_format (specs.quant)."""
        return bool(self.weight_format)

    def linear_weight_bytes(self) -> float:
        """Bytes per weight element of the decoder's linear layers (scales included):
        specs.quant.linear_weight_bytes of weight_format, or dtype_bytes when dense."""
        return linear_weight_bytes(self.weight_format, self.quant_group_size, self.dtype_bytes)

    def weight_bytes(self) -> float:
        """Bytes of all weights: the linear layers at linear_weight_bytes, the embedding and
        LM head at dtype_bytes."""
        dense = self.embedding_params() + self.lm_head_params()
        linear = self.total_params() - dense
        return float(linear * self.linear_weight_bytes() + dense * self.dtype_bytes)

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies over all layers (MLA caches the latent + RoPE key)."""
        if self.is_mla:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.kv_heads * self.head_dim
        return float(self.layers * per_layer * self.kv_dtype_bytes)


def _hf(repo: str) -> str:
    return f"config.json of {repo} on its Hugging Face model card"


_LLAMA_31_70B = ModelSpec(
    name="llama-3.1-70b",
    layers=80,
    hidden=8192,
    heads=64,
    kv_heads=8,
    head_dim=128,
    ffn=28672,
    vocab=128256,
    family="llama-3",
    hf_repo="meta-llama/Llama-3.1-70B-Instruct",
    source=_hf("meta-llama/Llama-3.1-70B-Instruct"),
)

MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        ModelSpec(
            name="llama-3.1-8b",
            layers=32,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=14336,
            vocab=128256,
            family="llama-3",
            hf_repo="meta-llama/Llama-3.1-8B-Instruct",
            source=_hf("meta-llama/Llama-3.1-8B-Instruct"),
        ),
        _LLAMA_31_70B,
        dataclasses.replace(  # Llama-3.1-70B's shape (same values: oumi-ai/oumi configs/
            # recipes/llama3_3/README.md "Model Info", commit bd18cd6), post-trained again
            _LLAMA_31_70B,
            name="llama-3.3-70b",
            hf_repo="meta-llama/Llama-3.3-70B-Instruct",
            source=_hf("meta-llama/Llama-3.3-70B-Instruct")
            + " (hidden 8192, 80 layers, 64 heads, 8 KV heads, ffn 28672, vocab 128256: "
            "Llama-3.1-70B's values, as oumi-ai/oumi configs/recipes/llama3_3/README.md lists "
            "them; Meta's model card, meta-llama/llama-models models/llama3_3/MODEL_CARD.md, "
            "gives 70B parameters with GQA)",
        ),
        ModelSpec(
            name="llama-3.2-1b",
            layers=16,
            hidden=2048,
            heads=32,
            kv_heads=8,
            head_dim=64,
            ffn=8192,
            vocab=128256,
            tie_embeddings=True,
            family="llama-3",
            hf_repo="meta-llama/Llama-3.2-1B-Instruct",
            source=_hf("meta-llama/Llama-3.2-1B-Instruct"),
        ),
        ModelSpec(
            name="qwen3-8b",
            layers=36,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=12288,
            vocab=151936,
            family="qwen3",
            hf_repo="Qwen/Qwen3-8B",
            source=_hf("Qwen/Qwen3-8B"),
        ),
        ModelSpec(  # a draft model that shares the Qwen3 vocabulary (0.60B with tied embeddings)
            name="qwen3-0.6b",
            layers=28,
            hidden=1024,
            heads=16,
            kv_heads=8,
            head_dim=128,
            ffn=3072,
            vocab=151936,
            tie_embeddings=True,
            family="qwen3",
            hf_repo="Qwen/Qwen3-0.6B",
            source=_hf("Qwen/Qwen3-0.6B"),
        ),
        ModelSpec(
            name="qwen3-30b-a3b",
            layers=48,
            hidden=2048,
            heads=32,
            kv_heads=4,
            head_dim=128,
            ffn=6144,
            vocab=151936,
            experts=128,
            experts_topk=8,
            expert_ffn=768,
            family="qwen3",
            hf_repo="Qwen/Qwen3-30B-A3B",
            source=_hf("Qwen/Qwen3-30B-A3B"),
        ),
        ModelSpec(
            name="qwen3-235b-a22b",
            layers=94,
            hidden=4096,
            heads=64,
            kv_heads=4,
            head_dim=128,
            ffn=12288,
            vocab=151936,
            experts=128,
            experts_topk=8,
            expert_ffn=1536,
            family="qwen3",
            hf_repo="Qwen/Qwen3-235B-A22B",
            source=_hf("Qwen/Qwen3-235B-A22B"),
        ),
        ModelSpec(
            name="deepseek-v3",
            layers=61,
            hidden=7168,
            heads=128,
            kv_heads=128,
            head_dim=128,
            ffn=18432,
            vocab=129280,
            experts=256,
            experts_topk=8,
            expert_ffn=2048,
            shared_experts=1,
            dense_layers=3,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            dtype_bytes=1,  # released as fp8 (block-scaled) weights
            family="deepseek-v3",
            hf_repo="deepseek-ai/DeepSeek-V3",
            source=_hf("deepseek-ai/DeepSeek-V3") + " (fp8 weights; MTP module not counted)",
        ),
        ModelSpec(
            name="smollm2-135m",
            layers=30,
            hidden=576,
            heads=9,
            kv_heads=3,
            head_dim=64,
            ffn=1536,
            vocab=49152,
            tie_embeddings=True,
            family="smollm2",
            hf_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
            source=_hf("HuggingFaceTB/SmolLM2-135M-Instruct"),
        ),
        # EAGLE-3 heads: one decoder layer whose q/k/v read [embedding; fc(3 target states)].
        ModelSpec(
            name="eagle3-llama-3.1-8b",
            arch="eagle3-head",
            layers=1,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=14336,
            vocab=128256,
            draft_vocab=32000,
            family="llama-3",
            base_model="llama-3.1-8b",
            hf_repo="yuhuili/EAGLE3-LLaMA3.1-Instruct-8B",
            source=_hf("yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
        ),
        ModelSpec(
            name="eagle3-llama-3.1-70b",
            arch="eagle3-head",
            layers=1,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            ffn=28672,
            vocab=128256,
            draft_vocab=32000,
            family="llama-3",
            base_model="llama-3.1-70b",
            hf_repo="yuhuili/EAGLE3-LLaMA3.3-Instruct-70B",
            source=_hf("yuhuili/EAGLE3-LLaMA3.3-Instruct-70B")
            + " (trained for Llama-3.3-70B, the same shape as 3.1-70B)",
        ),
        ModelSpec(
            name="eagle3-qwen3-8b",
            arch="eagle3-head",
            layers=1,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=12288,
            vocab=151936,
            draft_vocab=32000,
            family="qwen3",
            base_model="qwen3-8b",
            hf_repo="AngelSlim/Qwen3-8B_eagle3",
            source=_hf("AngelSlim/Qwen3-8B_eagle3"),
        ),
        # An EAGLE(-1/-2) head: one decoder layer over [embedding; target top-layer feature]
        # (fc 2*hidden -> hidden, 33M params, not counted) using the target's embedding and LM
        # head; priced here as a one-layer decoder with its own LM head (the same matmul).
        ModelSpec(
            name="eagle-llama-3.1-8b",
            layers=1,
            hidden=4096,
            heads=32,
            kv_heads=8,
            head_dim=128,
            ffn=14336,
            vocab=128256,
            family="llama-3",
            draft_method="eagle",
            base_model="llama-3.1-8b",
            hf_repo="yuhuili/EAGLE-LLaMA3.1-Instruct-8B",
            source=_hf("yuhuili/EAGLE-LLaMA3.1-Instruct-8B")
            + " (0.25B head; embedding and LM head are the target's)",
        ),
        ModelSpec(  # the EAGLE(-1/-2) head of Llama-3-70B-Instruct, priced as eagle-llama-3.1-8b
            name="eagle-llama-3-70b",
            layers=1,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            ffn=28672,
            vocab=128256,
            family="llama-3",
            draft_method="eagle",
            base_model="llama-3.1-70b",
            hf_repo="yuhuili/EAGLE-LLaMA3-Instruct-70B",
            source=_hf("yuhuili/EAGLE-LLaMA3-Instruct-70B")
            + " (trained for Llama-3-70B-Instruct, the same shape as 3.1-70B; embedding and LM "
            "head are the target's)",
        ),
        # DeepSeek-V3's multi-token-prediction module: one more MoE decoder layer (MLA, 256
        # routed experts + 1 shared) after a 2*hidden -> hidden projection, sharing the target's
        # embedding and LM head; SGLang and vLLM run it as the drafter of its own target only.
        ModelSpec(
            name="deepseek-v3-mtp",
            layers=1,
            hidden=7168,
            heads=128,
            kv_heads=128,
            head_dim=128,
            ffn=0,
            vocab=129280,
            experts=256,
            experts_topk=8,
            expert_ffn=2048,
            shared_experts=1,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            qk_nope_head_dim=128,
            v_head_dim=128,
            dtype_bytes=1,
            family="deepseek-v3",
            draft_method="mtp",
            base_model="deepseek-v3",
            hf_repo="deepseek-ai/DeepSeek-V3",  # the MTP layer ships in the target's checkpoint
            source=_hf("deepseek-ai/DeepSeek-V3")
            + " (num_nextn_predict_layers 1: the MTP module; embedding and LM head shared)",
        ),
    )
}


def _quantized(
    base: str, name: str, weight_format: str, group: int, quantization: str, repo: str
) -> ModelSpec:
    """A published quantized checkpoint of the preset `base`: same shape, linear layers in
    `weight_format` (embedding and LM head stay 16-bit, as in these checkpoints)."""
    return dataclasses.replace(
        MODEL_PRESETS[base],
        name=name,
        weight_format=weight_format,
        quant_group_size=group,
        quantization=quantization,
        weight_dtype="float16",
        hf_repo=repo,
        source=_hf(repo) + f" (quantization_config: {quantization})",
    )


# Quantized Llama-3.1 checkpoints: AutoAWQ (GEMM, zero points) and AutoGPTQ (symmetric) 4-bit
# with groups of 128 (hugging-quants, whose config.json names quant_method, bits, group_size),
# and SmoothQuant-style W8A8 int8 (Neural Magic, llm-compressor; per-channel weight scales,
# dynamic per-token activation scales).
for _m in (
    _quantized(
        "llama-3.1-8b",
        "llama-3.1-8b-awq",
        "w4a16",
        128,
        "awq bits 4 group_size 128",
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
    ),
    _quantized(
        "llama-3.1-70b",
        "llama-3.1-70b-awq",
        "w4a16",
        128,
        "awq bits 4 group_size 128",
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4",
    ),
    _quantized(
        "llama-3.1-8b",
        "llama-3.1-8b-gptq",
        "w4a16",
        128,
        "gptq bits 4 group_size 128",
        "hugging-quants/Meta-Llama-3.1-8B-Instruct-GPTQ-INT4",
    ),
    _quantized(
        "llama-3.1-70b",
        "llama-3.1-70b-gptq",
        "w4a16",
        128,
        "gptq bits 4 group_size 128",
        "hugging-quants/Meta-Llama-3.1-70B-Instruct-GPTQ-INT4",
    ),
    _quantized(
        "llama-3.1-70b",
        "llama-3.1-70b-w8a8",
        "w8a8-int8",
        0,
        "compressed-tensors int8 w8a8",
        "neuralmagic/Meta-Llama-3.1-70B-Instruct-quantized.w8a8",
    ),
):
    MODEL_PRESETS[_m.name] = _m


def model_preset(name: str) -> ModelSpec:
    """The preset called `name` (case-insensitive); unknown names list the closest presets."""
    return preset(MODEL_PRESETS, name, "model")


def load_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A preset name, the path of a JSON/TOML file with ModelSpec's fields, or a Hugging Face
    config.json (the file, a folder holding one, or any .json with a Hugging Face config's
    keys). A bare preset name is the preset even where a folder of that name exists."""
    s = str(name_or_path)
    hf = None if s.lower() in MODEL_PRESETS and os.sep not in s else hf_config_path(s)
    if hf is not None:
        return ModelSpec.from_hf_config(hf)
    return load_spec(ModelSpec, name_or_path, MODEL_PRESETS, "model")
