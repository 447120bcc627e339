"""The requests of one run as parallel numpy arrays (one row per request), so that a replica
updates a whole batch with a few vectorised operations per iteration.

A request's tokens are its prompt plus what it has generated; `computed` of them have K/V in
the cache. Each iteration feeds a request the tokens it lacks (a prefill chunk, or one pending
token plus its draft tree when decoding); when `computed` catches up with the tokens known, a
new token is sampled. Preemption by recomputation sets `computed` back to 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Requests:
    """arrival_s: float64[R]; prompt, output (target lengths), out (generated so far),
    computed (tokens with K/V cached): int64[R]; first_token_s, finish_s: float64[R] (NaN until
    then); preemptions, replica: int32[R]."""

    arrival_s: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    out: np.ndarray = field(init=False)
    computed: np.ndarray = field(init=False)
    first_token_s: np.ndarray = field(init=False)
    finish_s: np.ndarray = field(init=False)
    preemptions: np.ndarray = field(init=False)
    replica: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        n = self.prompt.size
        self.arrival_s = np.asarray(self.arrival_s, dtype=np.float64).copy()
        self.prompt = np.asarray(self.prompt, dtype=np.int64)
        self.output = np.asarray(self.output, dtype=np.int64)
        self.out = np.zeros(n, dtype=np.int64)
        self.computed = np.zeros(n, dtype=np.int64)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int32)
        self.replica = np.full(n, -1, dtype=np.int32)

    def __len__(self) -> int:
        return int(self.prompt.size)
