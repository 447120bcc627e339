"""Retrieval acceptance (prompt lookup, REST, SuffixDecoding, Token Recycling): a retriever
proposes continuations found by a suffix match; the j-th token of a match of length m is
accepted (given the previous one was) with probability rho[m][j].

As a standalone drafter the retriever proposes one continuation per step, so its trees are
chains; this model scores a chain by the match-length mixture, i.e. it is the positional model
whose rank-0 entry at depth j is P(j accepted | j-1 accepted) averaged over match lengths.
Grafted retrieval nodes inside model trees are scored by every model (see base).
"""

from __future__ import annotations

import numpy as np

from spectune.planner.acceptance.base import RetrievalProfile
from spectune.planner.acceptance.positional import PositionalAcceptance
from spectune.specs.errors import SpecError
from spectune.specs.workload import Workload


def chain_conditionals(profile: RetrievalProfile) -> np.ndarray:
    """float64[J]: P(j-th retrieved token accepted | the previous was), over the mixture of match
    lengths (steps without a match propose nothing and count as rejection at j = 1)."""
    alive = profile.match_probs[:, None] * np.cumprod(profile.rho, axis=1)  # [M, J]
    reach = alive.sum(axis=0)  # P(first j accepted)
    prev = np.r_[1.0, reach[:-1]]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(prev > 0, reach / np.maximum(prev, 1e-300), 0.0)


class RetrievalAcceptance(PositionalAcceptance):
    """A retrieval-only drafter: chains scored by the match-length mixture."""

    def __init__(self, profile: RetrievalProfile, workload: Workload | None = None) -> None:
        if not profile.enabled:
            raise SpecError("a retrieval acceptance model needs retrieval_accept and match probs")
        cond = chain_conditionals(profile)
        super().__init__(cond[:, None], 1.0, profile, workload)
        self.profile = profile

    @classmethod
    def from_workload(cls, wl: Workload) -> RetrievalAcceptance:
        return cls(RetrievalProfile.from_workload(wl), wl)

    def _rows(self, levels: np.ndarray) -> np.ndarray:
        # past the longest continuation nothing is proposed: no decay, just zeros
        lv = np.maximum(np.asarray(levels, dtype=np.int64), 1)
        rows = self.table.shape[0]
        out = self.table[np.minimum(lv, rows) - 1].copy()
        out[lv > rows] = 0.0
        return out
