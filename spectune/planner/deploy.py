"""What to deploy: a plan exported for one serving engine, and its predicted gain over that
engine's default config and over no speculation, across a batch-size distribution.

An engine runs its export (planner.export), not the plan: one tree shape, speculation keyed by
batch size only. `deployment` reads what the export runs per batch range back
(planner.export.runs.engine_runs) and prices it, the engine's default config
(planner.space.engine_default) and speculation off with the served tok/s of the plan's scenario
run on that engine (planner.tokens_per_s.SERVED, with the engine profile's host overheads), at
each batch size of a `BatchWeights` distribution and the context the export was made for.

The gain is the ratio of weighted means, sum_b w_b * tok/s(b) over the same sum for the
reference, with w_b the share of serving time spent at batch size b: the ratio of the tokens
served over that time (Little's law does the rest). Where the engine has no default config
(vLLM and TensorRT-LLM require the user to choose), the only reference is speculation off.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from spectune.planner.export import Export, export_table
from spectune.planner.export.runs import EngineRun, engine_runs
from spectune.planner.tokens_per_s import SERVED, served_objective, tokens_per_s
from spectune.specs import PolicyTable, SpecError, TreePolicy
from spectune.specs.engine import load_engine

MAX_BATCH_WEIGHTS = 64
"""Batch sizes one distribution may list."""


@dataclass(frozen=True)
class BatchWeights:
    """A batch-size distribution: `sizes` int[P] ascending, `weights` float64[P] summing to 1
    (the share of serving time at each batch size); `source` says where it came from."""

    sizes: tuple[int, ...]
    weights: tuple[float, ...]
    source: str

    def __post_init__(self) -> None:
        if not self.sizes or len(self.sizes) != len(self.weights):
            raise SpecError("batch weights: one weight per batch size, at least one")
        if len(self.sizes) > MAX_BATCH_WEIGHTS:
            raise SpecError(f"batch weights: at most {MAX_BATCH_WEIGHTS} batch sizes")
        if list(self.sizes) != sorted(set(self.sizes)) or self.sizes[0] < 1:
            raise SpecError("batch weights: batch sizes must be distinct integers >= 1")
        if any(not w >= 0 for w in self.weights) or abs(sum(self.weights) - 1) > 1e-9:
            raise SpecError("batch weights: weights must be >= 0 and sum to 1")

    @classmethod
    def of(cls, pairs: Sequence[tuple[int, float]], source: str) -> BatchWeights:
        """From (batch, weight) pairs in any order, normalised to sum 1 (a zero total is an
        error)."""
        total = sum(w for _, w in pairs)
        if not pairs or not total > 0:
            raise SpecError(f"batch weights ({source}): the weights must sum to more than 0")
        ordered = sorted(pairs)
        return cls(
            tuple(int(b) for b, _ in ordered), tuple(float(w) / total for _, w in ordered), source
        )

    @classmethod
    def uniform(cls, max_batch: int) -> BatchWeights:
        """Equal weight on the powers of two up to max_batch (and max_batch itself)."""
        sizes = sorted(
            {1 << i for i in range(max_batch.bit_length()) if 1 << i <= max_batch} | {max_batch}
        )
        return cls.of([(b, 1.0) for b in sizes], f"uniform over batch sizes 1..{max_batch}")

    @property
    def label(self) -> str:
        return ", ".join(f"{b}: {w:.0%}" for b, w in zip(self.sizes, self.weights, strict=True))


@dataclass(frozen=True)
class Deployment:
    """One engine's deployment of a plan: its export (config, launch argv, approximations),
    what it runs per batch range, and the predicted served tok/s at each weighted batch size of
    the engine's runs, its default config (None: it has none) and speculation off."""

    profile: str
    export: Export
    runs: tuple[EngineRun, ...]
    default: TreePolicy | None
    context: int
    weights: BatchWeights
    tokens_per_s: tuple[float, ...]
    default_tokens_per_s: tuple[float, ...] | None
    off_tokens_per_s: tuple[float, ...]
    note: str = ""

    def _mean(self, values: Sequence[float]) -> float:
        return float(sum(w * v for w, v in zip(self.weights.weights, values, strict=True)))

    @property
    def mean_tokens_per_s(self) -> float:
        """Weighted served tok/s of what the engine runs."""
        return self._mean(self.tokens_per_s)

    @property
    def gain_vs_off(self) -> float:
        """Weighted served tok/s over speculation off, minus 1."""
        return self.mean_tokens_per_s / self._mean(self.off_tokens_per_s) - 1

    @property
    def gain_vs_default(self) -> float | None:
        """Weighted served tok/s over the engine's default config, minus 1 (None: no default)."""
        if self.default_tokens_per_s is None:
            return None
        return self.mean_tokens_per_s / self._mean(self.default_tokens_per_s) - 1

    def policy_at(self, batch: int) -> TreePolicy | None:
        """The policy the engine runs at a batch size (past its last range: the last one's)."""
        for r in self.runs:
            if r.batch[0] <= batch <= r.batch[1]:
                return r.policy
        return self.runs[-1].policy


def export_context(export_rows_context: tuple[int, int]) -> int:
    """The context a batch range of an export is priced at: the middle of its context bucket
    (as the exporters fit the engine shape)."""
    lo, hi = export_rows_context
    return (lo + hi + 1) // 2


def deployment(
    table: PolicyTable, engine: str, weights: BatchWeights, *, context: int | None = None
) -> Deployment:
    """The plan `table` exported for `engine` (export_table) and its predicted gains; priced
    with the table's scenario on that engine (its host overheads) at `context` (default: the
    middle of the shortest context bucket, which the export takes)."""
    profile = load_engine(engine)
    export, note = export_table(table, profile, context=context)
    runs = engine_runs(export.engine, export.config, profile)
    ctx_range = min(b.context for b in table.buckets)
    if context is not None:
        ctx_range = next(
            b.context for b in table.buckets if b.context[0] <= context <= b.context[1]
        )
    ctx = export_context(ctx_range)
    resolved = table.scenario.replace(engine=engine).resolve()  # a preset name or profile file
    objective = served_objective(resolved)
    from spectune.planner.space import engine_default

    default = engine_default(profile)
    dep = Deployment(profile.name, export, runs, default, ctx, weights, (), None, (), note)
    sizes = list(weights.sizes)

    def at(policy_of: list[TreePolicy | None]) -> tuple[float, ...]:
        return tuple(
            float(tokens_per_s(objective, SERVED, p, b, ctx)[0])
            for p, b in zip(policy_of, sizes, strict=True)
        )

    return Deployment(
        profile=profile.name,
        export=export,
        runs=runs,
        default=default,
        context=ctx,
        weights=weights,
        tokens_per_s=at([dep.policy_at(b) for b in sizes]),
        default_tokens_per_s=None if default is None else at([default] * len(sizes)),
        off_tokens_per_s=at([None] * len(sizes)),
        note=note,
    )


__all__ = ["MAX_BATCH_WEIGHTS", "BatchWeights", "Deployment", "deployment", "export_context"]
