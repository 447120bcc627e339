"""Drafters at real shape: an EAGLE-3 head and a separate small draft model.

Both answer the same two calls the loop makes each speculative step:
- `draft_step(tokens [B, W], hidden [B, W, h], pos, context, slot, mask)`: one forward over W
  frontier tokens per sequence (W = 1 for the first step, top-k afterwards); its K/V go to the
  drafter's cache at [context + slot, + W), and it attends the prefix plus earlier draft slots.
- `draft_extend(tokens [B, A], hidden3 [B, A, 3*h_target], pos, context, mask)`: one forward
  over the accepted tokens (padded to depth + 1, as graph-captured engines do), which updates
  the drafter's cache and gives the hidden state the next step's first draft starts from.
`logits(hidden [B, W, h])` is the LM head (EAGLE-3: the reduced draft vocabulary).

EAGLE-3 head (SafeAILab/EAGLE): fc(3 target hidden states -> h) is the residual stream; q/k/v
read [norm(embed(token)); norm(stream)] (2h wide); one decoder layer; reduced-vocab LM head.
Bytes per head forward: ~0.4B params * 2 B (fc, the layer, the LM head) + the prefix K/V of one
layer; it reuses the target's embedding table (only W rows read).
"""

from __future__ import annotations

from typing import Protocol

import torch

from spectune.executor.model import (
    ROPE_THETA,
    Decoder,
    KVCache,
    LayerWeights,
    _fill,
    layer_forward,
)
from spectune.kernels.elementwise import add_rmsnorm
from spectune.kernels.gemm import linear
from spectune.kernels.rope import rope_tables
from spectune.specs import ModelSpec, SpecError


class Drafter(Protocol):
    spec: ModelSpec
    vocab: int

    def new_cache(self, max_batch: int, capacity: int) -> KVCache: ...

    def draft_step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        slot: int,
        mask: torch.Tensor,
    ) -> torch.Tensor: ...

    def draft_extend(
        self,
        tokens: torch.Tensor,
        hidden3: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        mask: torch.Tensor,
    ) -> torch.Tensor: ...

    def logits(self, hidden: torch.Tensor) -> torch.Tensor: ...


class Eagle3Head:
    """An EAGLE-3 draft head at the shape of `spec` (arch 'eagle3-head') for `target`."""

    def __init__(self, spec: ModelSpec, target: Decoder, seed: int = 1):
        if not spec.is_draft_head:
            raise SpecError(f"{spec.name} is not an EAGLE-3 head (arch {spec.arch!r})")
        if spec.hidden != target.spec.hidden:
            raise SpecError(f"{spec.name}: hidden {spec.hidden} != target's {target.spec.hidden}")
        self.spec = spec
        self.vocab = spec.lm_vocab
        self.target = target
        dev, dt = target.device, target.dtype
        gen = torch.Generator(device=dev).manual_seed(seed)
        h = spec.hidden
        self.fc = _fill((h, 3 * h), dev, dt, gen)
        self.layer = LayerWeights.random(spec, dev, dt, gen)
        self.norm_hidden = torch.ones(h, device=dev, dtype=dt)
        self.norm_final = torch.ones(h, device=dev, dtype=dt)
        self.lm = _fill((spec.lm_vocab, h), dev, dt, gen)
        self.rope = (
            target.rope
            if target.spec.head_dim == spec.head_dim
            else rope_tables(target.rope[0].shape[0], spec.head_dim, ROPE_THETA, dev)
        )

    def new_cache(self, max_batch: int, capacity: int) -> KVCache:
        return KVCache(self.spec, max_batch, capacity, self.target.device, self.target.dtype)

    def _forward(
        self,
        tokens: torch.Tensor,
        stream: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        slot: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """stream: [B, W, h] the fused hidden (consumed: updated in place). Returns the new
        pre-norm stream [B, W, h]."""
        b = tokens.shape[0]
        emb = torch.nn.functional.embedding(tokens, self.target.embed)
        x = torch.cat(
            (
                add_rmsnorm(emb, None, self.layer.norm_attn),
                add_rmsnorm(stream, None, self.norm_hidden),
            ),
            dim=-1,
        )
        mlp, stream = layer_forward(
            x,
            stream,
            self.layer,
            self.spec,
            cache.layer(0, b),
            pos,
            context,
            slot,
            mask.shape[-1],
            mask,
            self.rope,
        )
        stream.add_(mlp)
        return stream

    def draft_step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        slot: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        return self._forward(tokens, hidden.clone(), pos, cache, context, slot, mask)

    def draft_extend(
        self,
        tokens: torch.Tensor,
        hidden3: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        b, a, _ = hidden3.shape
        stream = linear(hidden3.reshape(b * a, -1), self.fc).view(b, a, -1)
        return self._forward(tokens, stream, pos, cache, context, 0, mask)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[B, W, h] -> [B, W, draft_vocab]."""
        return linear(add_rmsnorm(hidden, None, self.norm_final), self.lm)


class ModelDrafter:
    """A separate small draft model (e.g. the llama-3.2-1b shape) sharing the target's vocabulary.
    The target's hidden states are not used; `hidden` arguments pass through untouched."""

    def __init__(self, spec: ModelSpec, target: Decoder, seed: int = 2):
        if spec.vocab != target.spec.vocab:
            raise SpecError(
                f"draft model {spec.name} has vocab {spec.vocab}, target {target.spec.vocab}"
            )
        self.spec = spec
        self.vocab = spec.vocab
        self.model = Decoder(
            spec, target.device, target.dtype, seed=seed, max_pos=target.rope[0].shape[0]
        )

    def new_cache(self, max_batch: int, capacity: int) -> KVCache:
        return self.model.new_cache(max_batch, capacity)

    def draft_step(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        slot: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        out, _ = self.model.forward(tokens, pos, cache, context, mask, slot=slot)
        return out

    def draft_extend(
        self,
        tokens: torch.Tensor,
        hidden3: torch.Tensor,
        pos: torch.Tensor,
        cache: KVCache,
        context: int,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        out, _ = self.model.forward(tokens, pos, cache, context, mask)
        return out

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.lm_head(hidden)


def make_drafter(spec: ModelSpec, target: Decoder) -> Drafter:
    """An EAGLE-3 head for an 'eagle3-head' spec, else a separate draft model."""
    if spec.is_draft_head:
        return Eagle3Head(spec, target)
    return ModelDrafter(spec, target)
