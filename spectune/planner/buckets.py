"""Batch-size x context-length buckets: the cells the planner tunes one policy for.

Each bucket gets its own study. A policy is scored at a few points of its bucket (both ends of
the batch range at one representative context), so a policy chosen for [33, 64] is good at 33
and at 64, not only in the middle. Default edges cover batch 1..256 in powers of two (the
batch sizes serving engines capture CUDA graphs for) and context up to 32K.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spectune.specs.errors import SpecError

MAX_CONTEXT = 32768
DEFAULT_BATCH_EDGES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_CONTEXT_EDGES = (4096, 16384, MAX_CONTEXT)


@dataclass(frozen=True)
class BucketSpec:
    """One cell: inclusive batch and context ranges."""

    batch: tuple[int, int]
    context: tuple[int, int]

    def __post_init__(self) -> None:
        if not 1 <= self.batch[0] <= self.batch[1]:
            raise SpecError(f"batch range must be [lo, hi] with 1 <= lo <= hi, got {self.batch}")
        if not 0 <= self.context[0] <= self.context[1]:
            raise SpecError(
                f"context range must be [lo, hi] with 0 <= lo <= hi, got {self.context}"
            )

    @property
    def name(self) -> str:
        """Stable id used in study names: 'b33-64.c0-4095'."""
        return f"b{self.batch[0]}-{self.batch[1]}.c{self.context[0]}-{self.context[1]}"

    @property
    def context_point(self) -> int:
        """The context length a policy is scored at: the middle of the range."""
        return (self.context[0] + self.context[1] + 1) // 2

    def points(self) -> tuple[tuple[int, int], ...]:
        """(batch, context) pairs a policy is scored at: both batch ends, mid context."""
        ctx = self.context_point
        return tuple((b, ctx) for b in sorted({self.batch[0], self.batch[1]}))


def buckets_from_edges(
    batch_edges: Sequence[int] = DEFAULT_BATCH_EDGES,
    context_edges: Sequence[int] = DEFAULT_CONTEXT_EDGES,
) -> tuple[BucketSpec, ...]:
    """Buckets from upper edges: batch edges (1, 2, 4) give [1,1], [2,2], [3,4]; context
    edges (4096, 32768) give [0, 4095], [4096, 32768] (the last edge is inclusive)."""
    be = sorted(set(batch_edges))
    ce = sorted(set(context_edges))
    if not be or be[0] < 1:
        raise SpecError(f"batch edges must be positive integers, got {list(batch_edges)}")
    if not ce or ce[0] < 1:
        raise SpecError(f"context edges must be positive integers, got {list(context_edges)}")
    batch_ranges = []
    lo = 1
    for hi in be:
        batch_ranges.append((lo, hi))
        lo = hi + 1
    ctx_ranges = []
    lo = 0
    for i, hi in enumerate(ce):
        top = hi if i == len(ce) - 1 else hi - 1
        ctx_ranges.append((lo, top))
        lo = hi
    return tuple(BucketSpec(b, c) for b in batch_ranges for c in ctx_ranges)


DEFAULT_BUCKETS = buckets_from_edges()
