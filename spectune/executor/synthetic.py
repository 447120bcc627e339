"""Synthetic acceptance on the GPU: draft confidences and target tokens from an acceptance model.

With random weights the drafter's probabilities and the target's argmax carry no information,
so, like vLLM's synthetic acceptance mode, the executor keeps all the real compute (draft
logits + top-k, target logits + argmax) and overrides the values that decide acceptance:
- each drafted node draws one row of the acceptance model's candidate bank for its children's
  depth (planner.acceptance: draft probability `conf` and conditional acceptance `accept` of
  the rank-r child, rows sorted by rank), exactly what the planner's builders draw;
- the target's token at each tree node is drawn so that child c is matched with probability
  accept[c] (children of a node are disjoint events, each child owns the interval
  [lo_c, lo_c + accept_c) of one uniform draw, lo_c = acceptance mass of lower ranks), and with
  the remaining probability no child matches (token OTHER, which no draft can hold).
P(node on the accepted path) is then the product of `accept` along its path, which is what
AcceptanceModel.node_accept_prob predicts for the same tree.

Every draw is a common random number (draws.py): a hash of (seed, step, request, node id), so
all policies measured at one batch see the same luck on the nodes they share; nothing syncs
with the host (CUDA-graph safe).
"""

from __future__ import annotations

import numpy as np
import torch

from spectune.executor.draws import ROW, CommonDraws

NEG = -1.0e30  # log(0) stand-in that stays finite under sums


class SyntheticAcceptance:
    """Per-level candidate banks of an AcceptanceModel as device tensors.

    level l (1-based, the depth of the children) -> logconf, accept, lo: float32[M_l, K]
    """

    def __init__(
        self,
        model: object,
        depth: int,
        topk: int,
        device: torch.device | str,
        draws: CommonDraws | None = None,
    ):
        self.depth, self.topk = depth, topk
        self.draws = draws
        self.table: list[torch.Tensor] = []  # per level: float32[M, 3, K] (logconf, accept, lo)
        accepts: list[np.ndarray] = []
        for level in range(1, depth + 1):
            bank = model.candidate_bank(level, topk)  # type: ignore[attr-defined]
            logc = np.where(np.isfinite(bank.logconf), bank.logconf, NEG)
            acc = np.asarray(bank.accept, dtype=np.float64)
            lo = np.cumsum(acc, axis=1) - acc
            stacked = np.stack([logc, acc, lo], axis=1)[:, :, :topk]
            self.table.append(
                torch.tensor(stacked, dtype=torch.float32, device=device).contiguous()
            )
            accepts.append(acc)
        #: whether the bank's acceptances are recorded 0/1 outcomes (a trace replay) rather
        #: than probabilities: then they are not known at draft time, and choices that rank
        #: nodes by P(accepted) (ECHO's shared budget, graft leaves) must rank by the draft
        #: probability instead, or they would pick the accepted path from the answer
        self.outcomes = all(bool(np.isin(a, (0.0, 1.0)).all()) for a in accepts)

    def rows(self, level: int) -> int:
        return int(self.table[level - 1].shape[0])

    def draw_rows(
        self, level: int, shape: tuple[int, ...], device: torch.device | str
    ) -> torch.Tensor:
        """int64[shape]: a uniformly drawn bank row for each drafted node whose children sit at
        `level` (from the global generator; the loop uses `rows_for`)."""
        return torch.randint(0, self.rows(level), shape, device=device)

    def rows_for(self, level: int, ids: torch.Tensor) -> torch.Tensor:
        """int64[B, W]: the bank row of each drafted node (ids int64[B, W], draws.py), a common
        random number: the same node draws the same row under every policy."""
        assert self.draws is not None, "rows_for needs CommonDraws"
        return self.draws.integers(ids, ROW, self.rows(level))

    def children(
        self, level: int, rows: torch.Tensor, width: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """rows: int64[...] -> (logconf, accept, lo): float32[..., width] of ranks 0..width-1
        (one gather of the stacked table; the three are views of it)."""
        t = self.table[level - 1][rows]  # [..., 3, K]
        return t[..., 0, :width], t[..., 1, :width], t[..., 2, :width]


def draw_target_tokens(
    parents: torch.Tensor,
    tokens: torch.Tensor,
    accept: torch.Tensor,
    lo: torch.Tensor,
    other: int,
    u: torch.Tensor | None = None,
) -> torch.Tensor:
    """The target's token after each tree node, drawn so that child c matches w.p. accept[c].

    parents: int64[B, N] (root -1); tokens: int64[B, N]; accept, lo: float32[B, N] of each node
    (root ignored); u: float32[B, N] the uniform of each node (None: torch.rand). Returns
    int64[B, N]: the token of the chosen child, or `other`.
    """
    b, n = parents.shape
    if u is None:
        u = torch.rand((b, n), device=parents.device)
    par = parents.clamp(min=0)
    u_par = torch.gather(u, 1, par)
    chosen = (parents >= 0) & (u_par >= lo) & (u_par < lo + accept)
    out = torch.full((b, n + 1), other, dtype=torch.int64, device=parents.device)
    dest = torch.where(chosen, par, torch.full_like(par, n))  # unchosen write the spare column
    out.scatter_(1, dest, tokens)
    return out[:, :n]
