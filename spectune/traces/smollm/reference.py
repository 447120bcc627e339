"""A plain reference forward of the same weights: no cache, no tree, full recompute.

Written independently of model.py (explicit per-head loops over the GQA groups, RoPE through
complex multiplication, an explicit causal softmax) so that agreement between the two checks
the cached/tree path: greedy decoding with the cache must equal `reference_greedy` token for
token.
"""

from __future__ import annotations

import torch

from spectune.traces.smollm.model import SmolWeights


def _rope_complex(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x: [T, hd] rotated at positions 0..T-1, adjacent pairs as complex numbers."""
    t, hd = x.shape
    freqs = theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = torch.arange(t, dtype=torch.float64)[:, None] * freqs[None, :]
    rot = torch.polar(torch.ones_like(ang), ang)  # [T, hd/2] complex128
    xc = torch.view_as_complex(x.double().reshape(t, hd // 2, 2).contiguous())
    return torch.view_as_real(xc * rot).reshape(t, hd).float()


@torch.inference_mode()
def reference_logits(w: SmolWeights, tokens: list[int]) -> torch.Tensor:
    """float32[T, V]: logits at every position of `tokens`, computed from scratch."""
    c = w.config
    x = w.embed[torch.as_tensor(tokens, dtype=torch.long)]
    t = x.shape[0]
    causal = torch.full((t, t), float("-inf")).triu(1)
    group = c.heads // c.kv_heads
    for lw in w.layers:
        h = x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_eps) * lw.attn_norm
        q, k, v = h @ lw.wq.T, h @ lw.wk.T, h @ lw.wv.T
        heads_out = []
        for head in range(c.heads):
            kv = head // group
            qh = _rope_complex(q[:, head * c.head_dim : (head + 1) * c.head_dim], c.rope_theta)
            kh = _rope_complex(k[:, kv * c.head_dim : (kv + 1) * c.head_dim], c.rope_theta)
            vh = v[:, kv * c.head_dim : (kv + 1) * c.head_dim]
            scores = (qh @ kh.T) / c.head_dim**0.5 + causal
            heads_out.append(torch.softmax(scores, dim=-1) @ vh)
        x = x + torch.cat(heads_out, dim=1) @ lw.wo.T
        h = x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_eps) * lw.ffn_norm
        gate = h @ lw.w_gate.T
        x = x + ((gate * torch.sigmoid(gate)) * (h @ lw.w_up.T)) @ lw.w_down.T
    x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + c.rms_eps) * w.final_norm
    return x @ w.embed.T


def reference_greedy(
    w: SmolWeights, prompt: list[int], new_tokens: int, eos: int | None = None
) -> list[int]:
    """Greedy continuation of `prompt`, recomputing the whole sequence for every token."""
    seq = list(prompt)
    out: list[int] = []
    for _ in range(new_tokens):
        nxt = int(reference_logits(w, seq)[-1].argmax())
        out.append(nxt)
        seq.append(nxt)
        if eos is not None and nxt == eos:
            break
    return out
