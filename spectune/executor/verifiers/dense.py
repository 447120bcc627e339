"""Dense verify: the target forward over all B x N tree slots (one fixed shape, one CUDA graph).

Attention runs through a TreeAttentionPlan planned once for (B, N, context): the tree phase
writes the step's ancestor matrix into its bitmask, every layer calls its run. Without the plan
(use_kernels off) the tree tokens attend through span_attention with the bool mask.
"""

from __future__ import annotations

import torch

from spectune.executor.model import Decoder, KVCache
from spectune.executor.tree_build import TreeBatch
from spectune.executor.verifiers.base import Verifier
from spectune.kernels.tree_attention_plan import TreeAttentionPlan


class DenseVerifier(Verifier):
    """Verify of every slot of `tree`; plan: the tree-attention plan, or None (span attention)."""

    def __init__(
        self,
        target: Decoder,
        cache: KVCache,
        tree: TreeBatch,
        context: int,
        capture_layers: tuple[int, ...],
        other: int,
        plan: TreeAttentionPlan | None,
    ):
        super().__init__(target, cache, tree, context, capture_layers, other)
        self.plan = plan

    def load(self) -> None:
        if self.plan is not None:
            self.plan.set_mask(self.tree.mask)

    def verify(self) -> None:
        t = self.tree
        hidden, captured = self.target.forward(
            t.tokens,
            self.context + t.depth,
            self.cache,
            self.context,
            t.mask,
            capture=self.capture_layers,
            plan=self.plan,
        )
        logits = self.target.lm_head(hidden)  # [B, N, vocab]
        self.argmax_tok.copy_(logits.argmax(dim=-1))
        self.draw_targets()
        if captured:
            self.hidden3.copy_(torch.cat(captured, dim=-1))
