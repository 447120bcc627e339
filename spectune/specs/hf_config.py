"""Reading a Hugging Face config.json into ModelSpec fields.

Why this exists: the model a user serves comes with the config.json its authors published; asking
them to retype it as a ModelSpec invites slips (a wrong kv_heads doubles the KV bytes). This
module maps the keys of the published configs of Llama, Mistral/Mixtral, Qwen2/2.5, Qwen3,
Qwen3-MoE, DeepSeek-V2/V3 (MLA, shared experts, leading dense layers), gpt-oss, Gemma 1-3 and
EAGLE-3 draft heads onto ModelSpec's fields; `ModelSpec.from_hf_config` builds the spec.

Rules:
- unknown keys are ignored (configs carry dozens of keys the cost model does not need); a
  missing required key is a SpecError naming the key and the file;
- reading is bounded: at most MAX_CONFIG_BYTES per file and MAX_NESTING levels of nesting;
- torch_dtype (or its newer spelling dtype) and quantization_config are recorded on the spec
  (weight_dtype, quantization). dtype_bytes follows them where the cost model can price the
  format (bf16/fp16: 2 bytes, fp8: 1 byte); 4-bit AWQ and GPTQ set weight_format 'w4a16' and
  quant_group_size (specs.quant); a format it cannot read (mxfp4, whose gpt-oss checkpoints
  quantize the experts only, compressed-tensors, ...) is priced at the checkpoint's unquantized
  dtype and raises an HFConfigWarning saying so;
- `family` (the tokenizer family draft models must share) comes from model_type and the
  vocabulary size, per FAMILIES.

This module does not import ModelSpec (model.py imports it): it returns plain field mappings.
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

from spectune.specs.errors import SpecError

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # published configs are a few kB; gpt-oss's is ~2 kB
MAX_NESTING = 8  # deepest in published configs: quantization_config / rope_scaling, depth 3

#: keys only a Hugging Face config has (ModelSpec files use layers/hidden/heads/...)
HF_MARKERS = ("model_type", "architectures", "num_hidden_layers", "hidden_size")

#: (model_type, vocab size or None for any) -> tokenizer family; first match wins
FAMILIES: tuple[tuple[str, int | None, str], ...] = (
    ("llama", 128256, "llama-3"),  # Llama 3 / 3.1 / 3.2 / 3.3 and their EAGLE heads
    ("llama", 32000, "llama-2"),  # Llama 2, Vicuna and their EAGLE heads
    ("llama", 49152, "smollm2"),
    ("mistral", None, "mistral"),
    ("mixtral", None, "mistral"),
    ("qwen2", None, "qwen2"),  # Qwen2 and Qwen2.5 (151936 or 152064 embedding rows)
    ("qwen2_moe", None, "qwen2"),
    ("qwen3", None, "qwen3"),
    ("qwen3_moe", None, "qwen3"),
    ("deepseek_v3", None, "deepseek-v3"),
    ("deepseek_v2", None, "deepseek-v2"),
    ("gpt_oss", None, "gpt-oss"),
    ("gemma", None, "gemma"),
    ("gemma2", None, "gemma"),  # Gemma 1 and 2 share the 256000-entry tokenizer
    ("gemma3", None, "gemma3"),
    ("gemma3_text", None, "gemma3"),
)

#: model types whose config class ties the LM head to the embedding unless told otherwise
TIED_BY_DEFAULT = ("gemma", "gemma2", "gemma3", "gemma3_text")

#: torch dtype -> bytes per weight element the cost model prices
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


class HFConfigWarning(UserWarning):
    """Something in a Hugging Face config that spectune records but cannot price exactly."""


def hf_config_path(name_or_path: str | os.PathLike[str]) -> Path | None:
    """The config.json to read when `name_or_path` is a Hugging Face config (a folder holding
    config.json, or a .json file whose keys are a Hugging Face config's); None otherwise."""
    p = Path(name_or_path)
    try:
        if p.is_dir():
            return p / "config.json" if (p / "config.json").is_file() else None
        if p.suffix.lower() != ".json" or not p.is_file():
            return None
        if p.name == "config.json":
            return p
        data = _read_json(p)
    except OSError:
        return None
    return p if any(k in data for k in HF_MARKERS) and "layers" not in data else None


def read_hf_config(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The config's mapping, bounded in size and nesting; a multimodal config's text_config
    supplies the keys the top level lacks."""
    p = Path(path)
    data = _read_json(p)
    text = data.get("text_config")
    if isinstance(text, dict) and "hidden_size" not in data:
        data = {**data, **text}
    return data


def hf_config_fields(path: str | os.PathLike[str], name: str = "") -> tuple[dict[str, Any], str]:
    """(ModelSpec fields, where) for the Hugging Face config at `path` (a config.json or a folder
    holding one). `name` defaults to the folder name for config.json, else the file's stem."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    cfg = _Config(read_hf_config(p), str(p))
    model_type = str(cfg.get("model_type", "") or "")
    archs = cfg.get("architectures") or []
    archs = [a for a in archs if isinstance(a, str)] if isinstance(archs, list) else []
    spec_name = (name or (p.parent.name if p.name == "config.json" else p.stem)).lower()

    heads = cfg.int("num_attention_heads", "query heads")
    hidden = cfg.int("hidden_size", "model width")
    fields: dict[str, Any] = {
        "name": spec_name or "hf-model",
        "layers": cfg.int("num_hidden_layers", "decoder layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": cfg.int("num_key_value_heads", "key/value heads", default=heads),
        "vocab": cfg.int("vocab_size", "vocabulary size"),
        "tie_embeddings": cfg.bool("tie_word_embeddings", model_type in TIED_BY_DEFAULT),
    }
    fields.update(_moe_fields(cfg, model_type))
    fields.update(_attention_fields(cfg, hidden, heads))
    dense = fields.get("dense_layers", 0) or not fields.get("experts")
    if dense:
        fields["ffn"] = cfg.int("intermediate_size", "dense MLP width")
    else:  # every layer routed: the dense width is unused (kept when published)
        fields["ffn"] = cfg.int("intermediate_size", "dense MLP width", default=0)
    if "draft_vocab_size" in cfg.data or any("eagle3" in a.lower() for a in archs):
        fields["arch"] = "eagle3-head"
        fields["draft_method"] = "eagle3"
        fields["draft_vocab"] = cfg.int("draft_vocab_size", "draft vocabulary", default=0)
    fields["family"] = _family(model_type, fields["vocab"])
    fields.update(_dtype_fields(cfg, str(p)))
    what = ", ".join(archs) or model_type or "unknown architecture"
    fields["source"] = f"{p} (Hugging Face config.json: {what})"
    return fields, str(p)


# ---- pieces ------------------------------------------------------------------------------------
class _Config:
    """Typed, key-naming access to one config mapping."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def int(self, key: str, what: str, default: int | None = None) -> int:
        v = self.data.get(key)
        if v is None:
            if default is None:
                raise SpecError(f"{self.where}: missing key {key!r} ({what})")
            return default
        if isinstance(v, bool) or not isinstance(v, int | float) or int(v) != v:
            raise SpecError(f"{self.where}: key {key!r} ({what}) must be an integer, got {v!r}")
        return int(v)

    def bool(self, key: str, default: bool) -> bool:
        v = self.data.get(key, default)
        if not isinstance(v, bool):
            raise SpecError(f"{self.where}: key {key!r} must be true or false, got {v!r}")
        return v


def _moe_fields(cfg: _Config, model_type: str) -> dict[str, Any]:
    """Routed experts, their width, shared experts and leading dense layers, by family."""
    if model_type.startswith("deepseek"):
        experts = cfg.int("n_routed_experts", "routed experts", default=0)
        if not experts:
            return {}
        if cfg.int("moe_layer_freq", "MoE layer period", default=1) != 1:
            warnings.warn(
                f"{cfg.where}: moe_layer_freq != 1 is priced as if every layer after "
                "first_k_dense_replace were MoE",
                HFConfigWarning,
                stacklevel=3,
            )
        return {
            "experts": experts,
            "experts_topk": cfg.int("num_experts_per_tok", "experts per token"),
            "expert_ffn": cfg.int("moe_intermediate_size", "expert MLP width"),
            "shared_experts": cfg.int("n_shared_experts", "shared experts", default=0),
            "dense_layers": cfg.int("first_k_dense_replace", "leading dense layers", default=0),
        }
    experts = cfg.int("num_experts", "routed experts", default=0) or cfg.int(
        "num_local_experts", "routed experts", default=0
    )
    if not experts:
        return {}
    topk_key = "experts_per_token" if "num_experts_per_tok" not in cfg.data else ""
    topk_key = topk_key if topk_key in cfg.data else "num_experts_per_tok"  # gpt-oss has both
    topk = cfg.int(topk_key, "experts per token")
    if "moe_intermediate_size" in cfg.data:  # Qwen-MoE: its own expert width
        width = cfg.int("moe_intermediate_size", "expert MLP width")
    else:  # Mixtral, gpt-oss: intermediate_size is one expert's width
        width = cfg.int("intermediate_size", "expert MLP width")
    out = {"experts": experts, "experts_topk": topk, "expert_ffn": width}
    shared = cfg.int("shared_expert_intermediate_size", "shared expert width", default=0)
    if shared:  # Qwen2-MoE: one shared expert of its own width, as whole expert widths
        out["shared_experts"] = max(1, round(shared / width))
    dense_only = cfg.get("mlp_only_layers") or []
    if isinstance(dense_only, list) and dense_only:
        out["dense_layers"] = len(dense_only)
    return out


def _attention_fields(cfg: _Config, hidden: int, heads: int) -> dict[str, Any]:
    """Per-head width, and MLA's compressed widths (DeepSeek-V2/V3)."""
    kv_rank = cfg.int("kv_lora_rank", "MLA latent KV width", default=0)
    if kv_rank:
        v = cfg.int("v_head_dim", "MLA value width per head")
        return {
            "head_dim": cfg.int("head_dim", "head width", default=v),
            "q_lora_rank": cfg.int("q_lora_rank", "MLA query rank", default=0),
            "kv_lora_rank": kv_rank,
            "qk_rope_head_dim": cfg.int("qk_rope_head_dim", "MLA RoPE key width"),
            "qk_nope_head_dim": cfg.int("qk_nope_head_dim", "MLA non-RoPE width"),
            "v_head_dim": v,
        }
    if heads > 0 and hidden % heads and "head_dim" not in cfg.data:
        raise SpecError(
            f"{cfg.where}: hidden_size {hidden} is not a multiple of num_attention_heads "
            f"{heads}; the config needs key 'head_dim'"
        )
    return {"head_dim": cfg.int("head_dim", "head width", default=hidden // max(heads, 1))}


def _family(model_type: str, vocab: int) -> str:
    for mt, v, fam in FAMILIES:
        if model_type == mt and (v is None or v == vocab):
            return fam
    return ""


def _dtype_fields(cfg: _Config, where: str) -> dict[str, Any]:
    """weight_dtype, quantization and the dtype_bytes the cost model prices them at."""
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or ""
    dtype = dtype if isinstance(dtype, str) else ""
    out: dict[str, Any] = {"weight_dtype": dtype}
    nbytes = DTYPE_BYTES.get(dtype)
    if dtype == "float32":
        nbytes = 2
        warnings.warn(
            f"{where}: torch_dtype float32 checkpoint priced as 16-bit weights (serving engines "
            "load float32 checkpoints as bf16/fp16 by default); set dtype_bytes in a spec file "
            "to price 4-byte weights",
            HFConfigWarning,
            stacklevel=3,
        )
    q = cfg.get("quantization_config")
    if isinstance(q, dict):
        method = str(q.get("quant_method", "") or "unknown")
        out["quantization"] = _describe_quant(method, q)
        bits, group = q.get("bits"), q.get("group_size", q.get("q_group_size", 0))
        if method == "fp8":
            nbytes = 1
        elif method in ("awq", "gptq") and bits == 4 and _is_int(group) and group >= -1:
            # 4-bit weight-only (AutoAWQ, AutoGPTQ): priced as w4a16 (specs.quant); group -1
            # (one scale per channel) is group 0 here; ModelSpec bounds the rest
            out["weight_format"] = "w4a16"
            out["quant_group_size"] = max(0, group)
        else:
            warnings.warn(
                f"{where}: the cost model cannot price {out['quantization']!r} weights; they are "
                f"priced as {dtype or 'bf16'} (dtype_bytes {nbytes or 2}) and the quantization "
                "is recorded on the spec (field 'quantization')",
                HFConfigWarning,
                stacklevel=3,
            )
    out["dtype_bytes"] = nbytes or 2
    return out


def _is_int(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool)


def _describe_quant(method: str, q: Mapping[str, Any]) -> str:
    parts = [method]
    for key in ("fmt", "bits", "group_size"):
        if key in q and isinstance(q[key], str | int) and not isinstance(q[key], bool):
            parts.append(f"{key} {q[key]}")
    block = q.get("weight_block_size")
    if isinstance(block, list) and all(isinstance(b, int) for b in block):
        parts.append("block " + "x".join(str(b) for b in block))
    return " ".join(parts)


def _read_json(p: Path) -> dict[str, Any]:
    size = p.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise SpecError(f"{p}: {size} bytes is larger than a config.json ({MAX_CONFIG_BYTES} max)")
    try:
        data = json.loads(p.read_bytes())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SpecError(f"{p}: not valid JSON: {e}") from e
    except RecursionError:
        raise SpecError(f"{p}: nested deeper than {MAX_NESTING} levels") from None
    if not isinstance(data, dict):
        raise SpecError(f"{p}: expected an object at the top level")
    if _depth(data) > MAX_NESTING:
        raise SpecError(f"{p}: nested deeper than {MAX_NESTING} levels")
    return data


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (a scalar is 0), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        v, d = stack.pop()
        deepest = max(deepest, d)
        if d > MAX_NESTING:
            break
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return deepest
