"""Transformer shape description (dense, GQA, MoE, MLA, EAGLE-3 draft heads) and presets.

Parameter and KV-byte helpers live here because the cost model, the simulator's KV admission and
the executor's real-shape runner all need the same counts. Counts ignore norms and biases
(under 0.01% of parameters for every preset).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from spectune.specs.errors import SpecError
from spectune.specs.io import help_field, load_spec, preset

ARCHS = ("decoder", "eagle3-head")


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

    def weight_bytes(self) -> float:
        return float(self.total_params() * self.dtype_bytes)

    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies over all layers (MLA caches the latent + RoPE key)."""
        if self.is_mla:
            per_layer = self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_layer = 2 * self.kv_heads * self.head_dim
        return float(self.layers * per_layer * self.kv_dtype_bytes)


def _hf(repo: str) -> str:
    return f"config.json of {repo} on its Hugging Face model card"


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
            hf_repo="meta-llama/Llama-3.1-8B-Instruct",
            source=_hf("meta-llama/Llama-3.1-8B-Instruct"),
        ),
        ModelSpec(
            name="llama-3.1-70b",
            layers=80,
            hidden=8192,
            heads=64,
            kv_heads=8,
            head_dim=128,
            ffn=28672,
            vocab=128256,
            hf_repo="meta-llama/Llama-3.1-70B-Instruct",
            source=_hf("meta-llama/Llama-3.1-70B-Instruct"),
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
            hf_repo="AngelSlim/Qwen3-8B_eagle3",
            source=_hf("AngelSlim/Qwen3-8B_eagle3"),
        ),
    )
}


def model_preset(name: str) -> ModelSpec:
    """The preset called `name` (case-insensitive); unknown names list the closest presets."""
    return preset(MODEL_PRESETS, name, "model")


def load_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """A preset name, or the path of a JSON/TOML file with ModelSpec's fields."""
    return load_spec(ModelSpec, name_or_path, MODEL_PRESETS, "model")
