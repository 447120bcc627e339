"""Positional acceptance (Sequoia, Medusa, vLLM chain statistics): the chance that a child is
accepted depends only on its depth and its rank among its siblings.

accept_by_rank[d][r] = P(the rank-r child at depth d+1 is accepted | its parent was); rows past
the table repeat the last one times depth_decay per extra level. Sequoia's acceptance vector is
the one-row case. Draft candidates are deterministic: the draft probability of the rank-r child
is taken to be its acceptance probability, so dynamic builders rank by the same numbers.
"""

from __future__ import annotations

import numpy as np

from spectune.planner.acceptance.base import (
    AcceptanceModel,
    CandidateBank,
    RetrievalProfile,
    model_sibling_rank,
)
from spectune.specs.errors import SpecError
from spectune.specs.tree import DraftTree
from spectune.specs.workload import Workload


class PositionalAcceptance(AcceptanceModel):
    """p[depth][rank] table with geometric decay past its last row."""

    def __init__(
        self,
        table: np.ndarray | list[list[float]] | list[float] | tuple[tuple[float, ...], ...],
        depth_decay: float = 1.0,
        retrieval: RetrievalProfile | None = None,
        workload: Workload | None = None,
    ) -> None:
        super().__init__(retrieval)
        t = _pad_rows(table)
        if t.ndim != 2 or t.size == 0:
            raise SpecError("a positional table must be a non-empty [depth][rank] array")
        if (t < 0).any() or (t > 1).any():
            raise SpecError("positional acceptance probabilities must lie in [0, 1]")
        if (t.sum(axis=1) > 1 + 1e-9).any():
            raise SpecError(
                "each row of a positional table must sum to <= 1 (one child can be accepted)"
            )
        if not 0 < depth_decay <= 1:
            raise SpecError("depth_decay must be in (0, 1]")
        self.table = t
        self.table.setflags(write=False)
        self.depth_decay = float(depth_decay)
        self.workload = workload
        self._banks: dict[tuple[int, int], CandidateBank] = {}

    @classmethod
    def from_workload(cls, wl: Workload) -> PositionalAcceptance:
        width = max(len(r) for r in wl.accept_by_rank)
        t = np.zeros((len(wl.accept_by_rank), width))
        for d, row in enumerate(wl.accept_by_rank):
            t[d, : len(row)] = row
        return cls(t, wl.depth_decay, RetrievalProfile.from_workload(wl), wl)

    @property
    def cache_key(self) -> tuple[object, ...]:
        key = self.__dict__.get("_key")
        if key is None:
            key = (
                type(self).__name__,
                self.table.tobytes(),
                self.table.shape,
                self.depth_decay,
                self.retrieval.rho.tobytes(),
                self.retrieval.match_probs.tobytes(),
            )
            self.__dict__["_key"] = key
        return key

    def _rows(self, levels: np.ndarray) -> np.ndarray:
        """float64[len(levels), W]: the table row for children at each depth (>= 1)."""
        rows = self.table.shape[0]
        lv = np.maximum(np.asarray(levels, dtype=np.int64), 1)
        idx = np.minimum(lv, rows) - 1
        decay = self.depth_decay ** np.maximum(lv - rows, 0)
        return self.table[idx] * decay[:, None]

    def model_conditional(self, tree: DraftTree) -> np.ndarray:
        rank = model_sibling_rank(tree)
        rows = self._rows(tree.depth)
        w = self.table.shape[1]
        ok = rank < w
        out = np.zeros(tree.num_nodes)
        out[ok] = rows[ok, rank[ok]]
        return out

    def positional_table(self, depth: int, width: int) -> np.ndarray:
        rows = self._rows(np.arange(1, depth + 1))
        out = np.zeros((depth, width))
        w = min(width, rows.shape[1])
        out[:, :w] = rows[:, :w]
        return out

    def candidate_bank(self, level: int, width: int) -> CandidateBank:
        bank = self._banks.get((level, width))
        if bank is None:
            row = self.positional_table(level, width)[level - 1]
            bank = CandidateBank.from_arrays(row[None, :], row[None, :])
            self._banks[(level, width)] = bank
        return bank


def _pad_rows(table: object) -> np.ndarray:
    """float64[D, W] from a 1-D vector, a 2-D array or ragged rows (padded with zeros)."""
    if isinstance(table, np.ndarray):
        return np.atleast_2d(table.astype(np.float64))
    rows = list(table)  # type: ignore[call-overload]
    if rows and not isinstance(rows[0], list | tuple | np.ndarray):
        rows = [rows]
    try:
        width = max((len(r) for r in rows), default=0)
        out = np.zeros((len(rows), width))
        for d, r in enumerate(rows):
            out[d, : len(r)] = np.asarray(r, dtype=np.float64)
    except (TypeError, ValueError) as e:
        raise SpecError(f"a positional table must be numbers by [depth][rank]: {e}") from e
    return out
