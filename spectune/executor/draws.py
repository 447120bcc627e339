"""Common random numbers: acceptance draws that depend on the node, not on the policy.

Comparing two policies at one batch is only fair if both see the same luck. Every random value
that decides acceptance (the candidate-bank row a drafted node draws, the uniform that picks
which child the target takes after a node, a grafting request's match length) is therefore a
hash of (seed, step, request, node id, stream) instead of a draw from a stateful generator:

- a node id is a hash of its rank path from the root (root: ROOT_ID; the rank-r child of node
  p: child_id(p, r)), so the node "the 2nd child of the 1st child of the root" has one id in
  a dynamic tree, a static tree, a pruned one or an ECHO super-tree, and draws the same bank
  row and target uniform in each; grafted chain nodes hash the leaf they hang from with
  GRAFT_RANK + position;
- the step counter is a device scalar the loop advances once per step and resets before the
  timed steps, so step s of every policy at one batch sees the same draws; `seed` selects an
  independent stream (one per repeat of a measurement).

Arithmetic stays in int64 without overflow: each round is h = (h * a + v) mod (2^31 - 1)
followed by an xorshift, with a < 2^31, so every product is < 2^62. Nothing syncs with the
host, and the counters are tensors, so the draws replay inside CUDA graphs.
"""

from __future__ import annotations

import torch

MOD = 2**31 - 1  # a Mersenne prime: the rounds' modulus
ROOT_ID = 1
GRAFT_RANK = 1 << 20  # ranks of grafted chain positions start here (model ranks are < 64)
_A = (1_103_515_245, 48_271, 69_621, 16_807, 1_664_525, 22_695_477, 1_140_671_485, 214_013)
# streams: independent draws of one node
ROW, TARGET, MATCH = 1, 2, 3


def _round(h: torch.Tensor, v: torch.Tensor | int, a: int) -> torch.Tensor:
    """One mixing round: int64 in [0, 2^31) -> int64 in [0, 2^31)."""
    h = (h * a + v) % MOD
    return h ^ (h >> 15)


def child_id(parent: torch.Tensor, rank: torch.Tensor | int) -> torch.Tensor:
    """int64 ids of the rank-`rank` children of nodes with ids `parent` (broadcasting)."""
    return _round(_round(parent, rank + 1, _A[5]), 7, _A[6])


class CommonDraws:
    """Counter-based uniforms for B requests: uniform(ids [B, ...], stream) -> float32 in
    [0, 1), a function of (seed, step, request, id, stream) only."""

    def __init__(self, batch: int, device: torch.device | str, seed: int = 0):
        self.device = torch.device(device)
        self.seed = torch.full((), int(seed) % MOD, dtype=torch.int64, device=self.device)
        self.step = torch.zeros((), dtype=torch.int64, device=self.device)
        self.request = torch.arange(batch, dtype=torch.int64, device=self.device)

    def reset(self, seed: int | None = None) -> None:
        """Step 0 of stream `seed` (kept if None); device fills, no reallocation."""
        if seed is not None:
            self.seed.fill_(int(seed) % MOD)
        self.step.zero_()

    def advance(self) -> None:
        """The next step (a device op: recorded in the draft phase's graph)."""
        self.step.add_(1)

    def uniform(self, ids: torch.Tensor, stream: int) -> torch.Tensor:
        """float32[B, ...] uniforms in [0, 1) for node ids int64[B, ...] (row b: request b)."""
        shape = (-1,) + (1,) * (ids.dim() - 1)
        h = _round(self.seed + 12345, self.step, _A[0])
        h = _round(h, self.request.view(shape), _A[1])
        h = _round(h, ids % MOD, _A[2])
        h = _round(h, stream, _A[3])
        h = _round(h, 0, _A[4])
        h = _round(h, 0, _A[7])
        return (h >> 7).to(torch.float32) * (1.0 / (1 << 24))

    def integers(self, ids: torch.Tensor, stream: int, high: int) -> torch.Tensor:
        """int64[B, ...] in [0, high), from uniform(ids, stream)."""
        u = self.uniform(ids, stream)
        return torch.clamp((u * high).to(torch.int64), max=high - 1)
