"""Confidence-calibrated acceptance (EAGLE-2): draft confidence, mapped by a calibration curve.

For the children of a node at depth d, the drafter's top-1 probability is drawn from a Beta
distribution with the workload's mean for that depth; lower ranks share the remaining mass
geometrically (with some noise), sorted so ranks stay ordered. A child's acceptance given its
parent is calibration(draft probability), a piecewise-linear curve kept at or below the diagonal
so that siblings, whose draft probabilities sum to <= 1, also have acceptances summing to <= 1.

Draws come from a per-depth bank of `bank_rows` candidate rows generated once, lazily, from a
seed derived from the workload's name (same workload, same bank, in any process; top-1
probabilities are stratified Beta quantiles, so the bank moves smoothly with the parameters);
builders pick rows at random with their own generator.
"""

from __future__ import annotations

import zlib

import numpy as np
from scipy.special import betaincinv

from spectune.planner.acceptance.base import AcceptanceModel, CandidateBank, RetrievalProfile
from spectune.specs.tree import DraftTree
from spectune.specs.workload import Workload

BANK_WIDTH = 64  # ranks generated per row (TreePolicy allows topk <= 64)
BANK_ROWS = 1024  # small enough that a batch's bank gathers stay in L2


class ConfidenceAcceptance(AcceptanceModel):
    """EAGLE-2 style: acceptance = calibration(draft confidence)."""

    def __init__(self, workload: Workload, bank_rows: int = BANK_ROWS) -> None:
        super().__init__(RetrievalProfile.from_workload(workload))
        self.workload = workload
        self.bank_rows = int(bank_rows)
        self._xs = np.asarray(workload.calibration_x, dtype=np.float64)
        self._ys = np.asarray(workload.calibration_y, dtype=np.float64)
        self._means = np.asarray(workload.confidence_mean, dtype=np.float64)
        # the bank's uniforms depend on the name only, so refits of one workload see common
        # random numbers (top-1 draws are Beta quantiles of them: smooth in the parameters)
        self._seed = zlib.crc32(workload.name.encode("utf-8")) ^ self.bank_rows
        self._key = ("confidence", repr(workload), self.bank_rows)
        self._banks: dict[int, CandidateBank] = {}
        self._sliced: dict[tuple[int, int], CandidateBank] = {}

    @property
    def cache_key(self) -> tuple[object, ...]:
        return self._key

    def calibrate(self, conf: np.ndarray) -> np.ndarray:
        """Acceptance probability for draft probabilities `conf` (any shape)."""
        return np.interp(conf, self._xs, self._ys)

    def mean_top1(self, level: int) -> float:
        n = self._means.size
        extra = max(level - n, 0)
        return float(self._means[min(level, n) - 1] * self.workload.depth_decay**extra)  # type: ignore[union-attr]

    def _full_bank(self, level: int) -> CandidateBank:
        bank = self._banks.get(level)
        if bank is None:
            wl = self.workload
            assert wl is not None
            rng = np.random.default_rng([self._seed, level])
            m = self.mean_top1(level)
            k = wl.confidence_concentration
            u = (np.arange(self.bank_rows) + rng.random(self.bank_rows)) / self.bank_rows
            top1 = betaincinv(m * k, (1 - m) * k, rng.permutation(u))  # stratified Beta quantiles
            top1 = np.clip(top1, 1e-6, 1 - 1e-6)
            tail = wl.confidence_tail
            shares = (1 - tail) * tail ** np.arange(BANK_WIDTH - 1)
            noise = rng.uniform(0.5, 1.5, size=(self.bank_rows, BANK_WIDTH - 1))
            rest = shares[None, :] * noise
            rest /= np.maximum(rest.sum(axis=1, keepdims=True), 1.0)  # keep the rest's sum <= 1
            rest *= (1 - top1)[:, None]
            rest = np.minimum(rest, top1[:, None])
            rest = -np.sort(-rest, axis=1)
            conf = np.concatenate([top1[:, None], rest], axis=1)
            bank = CandidateBank.from_arrays(conf, self.calibrate(conf))
            self._banks[level] = bank
        return bank

    def candidate_bank(self, level: int, width: int) -> CandidateBank:
        cached = self._sliced.get((level, width))
        if cached is not None:
            return cached
        full = self._full_bank(level)
        w = min(width, BANK_WIDTH)
        conf = np.zeros((full.rows, width))
        conf[:, :w] = full.conf[:, :w]
        acc = np.zeros((full.rows, width))
        acc[:, :w] = full.accept[:, :w]
        bank = CandidateBank.from_arrays(conf, acc)
        self._sliced[(level, width)] = bank
        return bank

    def positional_table(self, depth: int, width: int) -> np.ndarray:
        return np.stack(
            [self.candidate_bank(d, width).accept.mean(axis=0) for d in range(1, depth + 1)]
        )

    def model_conditional(self, tree: DraftTree) -> np.ndarray:
        return self.calibrate(np.exp(tree.logprobs))
