"""Span attention's plain-torch reference and seeded input builder (the kernels and the host
wrapper are in span_attention.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def reference_span_attention(
    q: torch.Tensor,
    k_prefix: torch.Tensor | None,
    v_prefix: torch.Tensor | None,
    k_new: torch.Tensor,
    v_new: torch.Tensor,
    mask: torch.Tensor,
) -> torch.Tensor:
    """span_attention by one masked softmax over [prefix; span] in float64, in q's dtype."""
    b, n, h, d = q.shape
    kvh = k_new.shape[1]
    g = h // kvh
    if k_prefix is None or v_prefix is None:
        k_prefix = k_new[:, :, :0]
        v_prefix = v_new[:, :, :0]
    c = k_prefix.shape[2]
    k = torch.cat((k_prefix, k_new), dim=2).double().repeat_interleave(g, dim=1)  # [B, H, C+S, D]
    v = torch.cat((v_prefix, v_new), dim=2).double().repeat_interleave(g, dim=1)
    full = torch.cat((torch.ones(b, n, c, dtype=torch.bool, device=mask.device), mask), dim=2)
    s = torch.einsum("bnhd,bhsd->bhns", q.double(), k) / math.sqrt(d)
    s = s.masked_fill(~full[:, None], float("-inf"))
    return torch.einsum("bhns,bhsd->bnhd", torch.softmax(s, dim=-1), v).to(q.dtype)


@dataclass
class SpanAttentionInputs:
    """Arguments of one span_attention call (field order = the wrapper's): q [B, N, H, D],
    k_prefix / v_prefix [B, KVH, C, D] (strided views of a [B, cap, KVH, D] cache, as the
    executor passes them), k_new / v_new [B, KVH, S, D], mask bool[B, N, S]."""

    q: torch.Tensor
    k_prefix: torch.Tensor | None
    v_prefix: torch.Tensor | None
    k_new: torch.Tensor
    v_new: torch.Tensor
    mask: torch.Tensor

    def args(
        self,
    ) -> tuple[
        torch.Tensor,
        torch.Tensor | None,
        torch.Tensor | None,
        torch.Tensor,
        torch.Tensor,
        torch.Tensor,
    ]:
        return (self.q, self.k_prefix, self.v_prefix, self.k_new, self.v_new, self.mask)


def make_span_attention_inputs(
    batch: int,
    tokens: int,
    span: int,
    context: int,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 16,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    causal: bool = False,
) -> SpanAttentionInputs:
    """Seeded random inputs: the prefix as transposed views of a [B, C, KVH, D] cache (no
    prefix when context is 0), a random mask over the span that always lets query n see span
    key span - tokens + n (its own key), or the causal mask of the last `tokens` span keys."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen).to(dtype).to(device)

    q = randn(batch, tokens, heads, head_dim)
    cache_k, cache_v = (
        randn(batch, context, kv_heads, head_dim),
        randn(batch, context, kv_heads, head_dim),
    )
    k_new, v_new = randn(batch, kv_heads, span, head_dim), randn(batch, kv_heads, span, head_dim)
    own = span - tokens + torch.arange(tokens)
    if causal:
        mask = torch.arange(span)[None, :] <= own[:, None]
        mask = mask.expand(batch, tokens, span)
    else:
        mask = torch.rand((batch, tokens, span), generator=gen) < 0.5
        mask[:, torch.arange(tokens), own] = True
    k_prefix = cache_k.transpose(1, 2) if context else None
    v_prefix = cache_v.transpose(1, 2) if context else None
    return SpanAttentionInputs(q, k_prefix, v_prefix, k_new, v_new, mask.to(device))
