"""What every verifier shares: the verify phase's outputs and the interface the loop calls.

A verifier runs one target forward over this step's trees (the source's persistent TreeBatch
[B, N]), the LM head and argmax on every node (the real compute; with random weights its values
decide nothing), draws the target token after each node from the acceptance model
(synthetic.draw_target_tokens: what decides acceptance) and keeps the EAGLE-3 features of every
node (the residual stream at three layers) for the draft extend. It also owns the attention plan
the forward runs with, loaded with the step's trees in the tree phase (`load`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from spectune.executor.draws import TARGET, CommonDraws
from spectune.executor.model import Decoder, KVCache
from spectune.executor.synthetic import draw_target_tokens
from spectune.executor.tree_build import TreeBatch


class Verifier(ABC):
    """Verify of `tree` (B x N slots) at `context` on the target's cache.

    Outputs (persistent, [B, N] layout): target_tok int64[B, N] (the drawn target token after
    each node), argmax_tok int64[B, N], hidden3 [B, N, 3 * hidden] (EAGLE-3 features; width 1
    without capture layers). The flat buffers hold one more row: the sink that packed padding
    rows scatter into.
    """

    #: warm-up steps the verify needs before timing (the loop takes the larger of its own)
    min_warmup = 0
    #: whether the verify phase stays eager (outside the phase graphs: it syncs with the host)
    eager = False
    #: common random draws for the target tokens (set by the loop; None: torch.rand)
    draws: CommonDraws | None = None

    def __init__(
        self,
        target: Decoder,
        cache: KVCache,
        tree: TreeBatch,
        context: int,
        capture_layers: tuple[int, ...],
        other: int,
    ):
        self.target, self.cache, self.tree, self.context = target, cache, tree, context
        self.capture_layers, self.other = capture_layers, other
        b, n = tree.tokens.shape
        self.batch, self.nodes = b, n
        dev = target.device
        i64: dict[str, Any] = {"dtype": torch.int64, "device": dev}
        self.target_tok = torch.zeros((b, n), **i64)
        self.argmax_flat = torch.zeros((b * n + 1,), **i64)
        self.argmax_tok = self.argmax_flat[: b * n].view(b, n)
        h3 = 3 * target.spec.hidden if capture_layers else 1
        self.hidden3_flat = torch.zeros((b * n + 1, h3), dtype=target.dtype, device=dev)
        self.hidden3 = self.hidden3_flat[: b * n].view(b, n, h3)

    @abstractmethod
    def load(self) -> None:
        """Tree phase: hand this step's trees to the attention plan."""

    @abstractmethod
    def verify(self) -> None:
        """Verify phase: forward, argmax, target tokens, features."""

    def draw_targets(self) -> None:
        """The target token after each node, drawn from the tree's synthetic acceptances (each
        node's uniform a common random number of its id, when the loop gives draws)."""
        t = self.tree
        u = None
        if self.draws is not None and t.ids is not None:
            u = self.draws.uniform(t.ids, TARGET)
        self.target_tok.copy_(
            draw_target_tokens(t.parents, t.tokens, t.accept, t.lo, self.other, u)
        )

    def graphs_captured(self, pool: Any) -> None:  # noqa: B027 (an optional hook)
        """The phase graphs were captured into memory pool `pool` (nothing to do by default)."""

    def before_timing(self) -> None:  # noqa: B027 (an optional hook)
        """After warm-up, before the timed steps (nothing to do by default)."""
