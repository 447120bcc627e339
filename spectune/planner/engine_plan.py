"""What a serving engine runs for a whole plan: one configuration, chosen over every bucket.

The search (planner.search) gives each (batch, context) bucket its own best policy. A serving
engine runs one configuration for the whole server, and none keys speculation by context:

  SGLang 0.5.23   one static (steps, top-k, draft tokens) for every batch, or an adaptive draft
                  length per batch range with top-k 1 (chains; keys are batch-size lower bounds);
  vLLM 0.33       one chain length K per batch range (K = 0: off);
  TensorRT-LLM    one tree option set (top-k, total draft tokens) and a draft length per batch
                  range (draft_len_schedule; the first range's length is the maximum).

`choose_engine_config` enumerates the configurations the engine runs that the search suggests:
  - each bucket's winner (as the engine runs it, planner.space.engine_policy) and each bucket's
    best chain, made global (one setting for every batch and context);
  - the engine's own default config (planner.space.engine_default) and speculation off;
  - where the engine has a per-batch schedule, for each tree shape it may hold (chains; for
    engines whose schedule takes trees, each winner's top-k and tree size), the best draft
    length per batch range (0 where the schedule may turn a range off), summed over the
    range's context buckets;
and scores each by the geometric mean over every bucket of the bucket's score (the search's:
tokens/s, geometric mean over the bucket's points), i.e. every bucket weighs the same. The best
wins, but a reference (the engine default, off) is kept unless the best is `min_gain` better:
the search's margin for the model's error.

`engine_plan` applies the choice to search results: every bucket then holds exactly what the
engine runs, scored as such, and `EnginePlan.cost` is what the engine's constraint costs (the
per-bucket optima's geometric mean over the chosen configuration's). `fit_table` does the same
for a policy table that was not planned for the engine (an export of a spectune plan): it is
the one place engine knobs are chosen by the objective; exporters read tables as they are.

A range a schedule turns off still runs on a speculating server: the drafter stays loaded and
its KV cache keeps its share of HBM (planner.capacity). With the closed form that range is
scored with the speculating server's capacity (`resident_off`); only "off" everywhere gets the
plain server's. Host work a speculating engine still does at draft length 0 is not charged.
SGLang routes a batch to its adaptive slot after padding it to the CUDA-graph batch size; where
that moves a batch into the next range (batch edges that are not captured sizes) the export
says so.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from spectune.planner.buckets import BucketSpec
from spectune.planner.space import canonical_policy, engine_default, engine_policy
from spectune.specs.engine import EngineProfile
from spectune.specs.errors import SpecError
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy, policy_label

if TYPE_CHECKING:
    from spectune.planner.search import BucketResult, Scorer

BucketScore = Callable[[TreePolicy | None, BucketSpec], float]
"""Score of a policy over a bucket (tokens/s, geometric mean over its points); larger is better."""

MAX_SCHEDULE_DEPTH = 12
"""Deepest draft length a schedule candidate tries (PolicySpace's default depth range)."""


@dataclass(frozen=True)
class EngineConfig:
    """One configuration an engine runs: a policy per batch range (batch order; None: off)."""

    kind: str  # "static", "schedule" or "off"
    batches: tuple[tuple[int, int], ...]
    policies: tuple[TreePolicy | None, ...]
    tokens_per_s: float  # geometric mean over every bucket of the plan
    reference: str = ""  # "default" or "off" when the config is one of the references

    def policy_for(self, batch: tuple[int, int]) -> TreePolicy | None:
        return self.policies[self.batches.index(batch)]

    @property
    def label(self) -> str:
        if self.kind == "off":
            return "off"
        if self.kind == "static":
            return f"static {policy_label(self.policies[0])}"
        on = [p for p in self.policies if p is not None]
        shape = "chains" if not on or on[0].topk == 1 else f"top-k {on[0].topk}, {on[0].budget}"
        depths = ", ".join(
            f"{lo}-{hi}: {0 if p is None else p.depth}"
            for (lo, hi), p in zip(self.batches, self.policies, strict=True)
        )
        return f"schedule {shape} ({depths})"


def _chain(depth: int) -> TreePolicy:
    return canonical_policy("dynamic-topk", depth, 1, depth + 1)


def choose_engine_config(
    buckets: Sequence[BucketSpec],
    winners: Sequence[TreePolicy | None],
    chains: Sequence[int | None],
    profile: EngineProfile,
    score: BucketScore,
    *,
    min_gain: float = 0.0,
    resident_off: Callable[[BucketSpec], float] | None = None,
    feasible: Callable[[TreePolicy | None, BucketSpec], bool] | None = None,
) -> tuple[EngineConfig, tuple[EngineConfig, ...]]:
    """The configuration `profile`'s engine runs that scores best over `buckets` (module
    docstring), and every candidate scored (best first). `winners[i]` and `chains[i]` are
    bucket i's own best policy and best chain length (None: unknown). `resident_off`: the
    score of a bucket whose range a speculating configuration turns off (None: as plain off).
    `feasible`: whether a policy may run in a bucket (a step-latency limit); a configuration
    that runs an infeasible policy anywhere is a candidate only when none is feasible."""
    if not buckets:
        raise SpecError("an engine plan needs at least one bucket")
    ranges = tuple(sorted({b.batch for b in buckets}))
    by_range = {r: [b for b in buckets if b.batch == r] for r in ranges}
    logs: dict[tuple[TreePolicy | None, tuple[int, int]], float] = {}

    resident: dict[tuple[int, int], float] = {}
    ok: dict[tuple[TreePolicy | None, tuple[int, int]], bool] = {}

    def range_log(p: TreePolicy | None, r: tuple[int, int]) -> float:
        key = (p, r)
        if key not in logs:
            logs[key] = sum(math.log(max(score(p, b), 1e-300)) for b in by_range[r])
        return logs[key]

    def off_log(r: tuple[int, int]) -> float:
        """A range turned off inside a speculating configuration."""
        if resident_off is None:
            return range_log(None, r)
        if r not in resident:
            resident[r] = sum(math.log(max(resident_off(b), 1e-300)) for b in by_range[r])
        return resident[r]

    def runs(p: TreePolicy | None, r: tuple[int, int]) -> bool:
        if feasible is None or p is None:
            return True
        if (p, r) not in ok:
            ok[(p, r)] = all(feasible(p, b) for b in by_range[r])
        return ok[(p, r)]

    def config(kind: str, policies: Sequence[TreePolicy | None], ref: str = "") -> EngineConfig:
        speculating = any(p is not None for p in policies)
        total = sum(
            off_log(r) if p is None and speculating else range_log(p, r)
            for p, r in zip(policies, ranges, strict=True)
        )
        if len(set(policies)) == 1:  # one setting everywhere
            kind = "off" if policies[0] is None else "static"
        return EngineConfig(kind, ranges, tuple(policies), math.exp(total / len(buckets)), ref)

    default = engine_default(profile)
    statics: list[TreePolicy] = []
    for p in [*winners, *(_chain(c) for c in chains if c), default]:
        try:
            q = engine_policy(p, profile)  # as the engine runs it
        except SpecError:
            continue
        if q is not None and q not in statics:
            statics.append(q)
    cands = [config("off", [None] * len(ranges), "off")]
    cands += [
        config("static", [p] * len(ranges), "default" if p == default else "") for p in statics
    ]
    if profile.has_schedule:
        seen = {c.policies for c in cands}

        def sched_log(p: TreePolicy | None, r: tuple[int, int]) -> float:
            if not runs(p, r):
                return -math.inf
            return off_log(r) if p is None else range_log(p, r)

        for c in _schedules(statics, ranges, profile, sched_log, config):
            if c.policies not in seen:  # a schedule of one length everywhere is a static one
                seen.add(c.policies)
                cands.append(c)
    cands.sort(key=lambda c: -c.tokens_per_s)
    allowed = [c for c in cands if all(runs(p, r) for p, r in zip(c.policies, ranges, strict=True))]
    best = (allowed or cands)[0]
    refs = [c for c in allowed or cands if c.reference]
    if min_gain > 0 and not best.reference and refs:
        ref = max(refs, key=lambda c: c.tokens_per_s)
        if best.tokens_per_s / ref.tokens_per_s - 1 < min_gain:
            best = ref
    return best, tuple(cands)


def _schedules(
    statics: Sequence[TreePolicy],
    ranges: Sequence[tuple[int, int]],
    profile: EngineProfile,
    range_log: Callable[[TreePolicy | None, tuple[int, int]], float],
    config: Callable[[str, Sequence[TreePolicy | None]], EngineConfig],
) -> list[EngineConfig]:
    """Per shape the engine's schedule may hold, the best draft length per batch range.

    A tree shape keeps its top-k and tree tokens at every draft length of the schedule, so only
    lengths whose tree holds that many tokens are tried (d <= tokens - 1 <= the engine's bound
    for d steps). `schedule_first_is_max` (TensorRT-LLM): the first range speculates, and no
    range drafts longer than it."""
    deepest = max((p.depth for p in statics), default=1) + 1
    top = min(MAX_SCHEDULE_DEPTH, profile.max_steps or MAX_SCHEDULE_DEPTH, deepest)
    shapes: list[tuple[int, int]] = [(1, 0)]
    if profile.trees and not profile.schedule_topk1_only:
        shapes += list(
            dict.fromkeys(
                (p.topk, p.budget) for p in statics if p.topk > 1 and p.builder == "dynamic-topk"
            )
        )

    def best(r: tuple[int, int], opts: Sequence[TreePolicy | None]) -> TreePolicy | None:
        return max(opts, key=lambda q: range_log(q, r))

    out: list[EngineConfig] = []
    for topk, tokens in shapes:
        at: dict[int, TreePolicy] = {}
        for d in range(1, top + 1):
            if topk == 1:
                at[d] = _chain(d)
            elif d <= tokens - 1 <= profile.max_draft_tokens(d, topk):
                at[d] = TreePolicy("dynamic-topk", d, topk, tokens)
        if not at:
            continue
        floor: list[TreePolicy | None] = [] if profile.schedule_min_steps else [None]
        options: list[TreePolicy | None] = [*floor, *at.values()]

        if profile.schedule_first_is_max:
            tries = []
            for d1, first in at.items():
                below = [p for p in options if p is None or p.depth <= d1]
                pols = [first, *(best(r, below) for r in ranges[1:])]
                tries.append(config("schedule", pols))
            out.append(max(tries, key=lambda c: c.tokens_per_s))
        else:
            out.append(config("schedule", [best(r, options) for r in ranges]))
    return out


# ---- applying the choice ----------------------------------------------------------------------


@dataclass(frozen=True)
class EnginePlan:
    """Search results made into what one engine runs, and what that costs."""

    results: tuple[BucketResult, ...]
    config: EngineConfig
    candidates: tuple[EngineConfig, ...]
    per_bucket_tokens_per_s: float  # geometric mean over buckets of each bucket's own optimum

    @property
    def cost(self) -> float:
        """Fraction of tokens/s the engine's constraint costs vs the per-bucket optima (>= 0
        up to the min_gain margin, geometric means over every bucket)."""
        return 1.0 - self.config.tokens_per_s / self.per_bucket_tokens_per_s

    @property
    def summary(self) -> str:
        return (
            f"engine-runnable plan: {self.config.label}, {self.config.tokens_per_s:.0f} tok/s; "
            f"the per-bucket optima would give {self.per_bucket_tokens_per_s:.0f} tok/s "
            f"({100 * self.cost:.1f}% is the engine's constraint; geometric means over "
            f"{len(self.results)} buckets)"
        )

    def provenance(self) -> dict[str, object]:
        """What the policy file records about the choice."""
        return {
            "config": self.config.label,
            "tokens_per_s": round(self.config.tokens_per_s, 3),
            "per_bucket_tokens_per_s": round(self.per_bucket_tokens_per_s, 3),
            "cost": round(self.cost, 4),
            "candidates": {c.label: round(c.tokens_per_s, 3) for c in self.candidates},
        }


def _geomean(values: Sequence[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-300)) for v in values) / len(values))


def engine_plan(
    results: Sequence[BucketResult],
    profile: EngineProfile,
    scorer: Scorer,
    *,
    min_gain: float = 0.0,
    max_latency_s: float | None = None,
) -> EnginePlan:
    """The search results with every bucket holding what `profile`'s engine runs (module
    docstring), rescored with `scorer` (the search's). A bucket whose policy changes says what
    its own optimum was in its note. `max_latency_s` (multi-objective plans): no policy whose
    step latency (scorer.latency_value) exceeds it, where any configuration allows that."""
    from spectune.planner.objective import ClosedFormObjective

    buckets = [r.bucket for r in results]

    def score(p: TreePolicy | None, b: BucketSpec) -> float:
        return _geomean(scorer.point_values(p, b))

    cf = scorer.objective if isinstance(scorer.objective, ClosedFormObjective) else None

    def resident_points(b: BucketSpec) -> tuple[float, ...]:
        """Off in a bucket whose range a speculating configuration turns off (drafter loaded)."""
        assert cf is not None
        batches = [x for x, _ in b.points()]
        return tuple(float(v) for v in cf.many(None, batches, b.context_point, resident=True))

    feasible = None
    if max_latency_s is not None and scorer.latency is not None:

        def feasible(p: TreePolicy | None, b: BucketSpec) -> bool:
            return scorer.latency_value(p, b) <= max_latency_s

    chosen, cands = choose_engine_config(
        buckets,
        [r.policy for r in results],
        [None if r.chain is None else r.chain.draft_tokens for r in results],
        profile,
        score,
        min_gain=min_gain,
        resident_off=None if cf is None else lambda b: _geomean(resident_points(b)),
        feasible=feasible,
    )
    out = []
    for r in results:
        p = chosen.policy_for(r.bucket.batch)
        resident = p is None and chosen.kind != "off" and cf is not None
        if p == r.policy and not resident:
            out.append(r)
            continue
        points = resident_points(r.bucket) if resident else scorer.point_values(p, r.bucket)
        tps = _geomean(points)
        note = r.note
        if p != r.policy:
            note = (
                f"{profile.name} runs {chosen.label}; this bucket's own optimum "
                f"{policy_label(r.policy)} would give {r.tokens_per_s:.0f} tok/s "
                f"({100 * (r.tokens_per_s / tps - 1):+.1f}%)"
            )
        out.append(replace(r, policy=p, tokens_per_s=tps, points=points, note=note, pareto=()))
    own = _geomean([r.tokens_per_s for r in results])
    return EnginePlan(tuple(out), chosen, cands, own)


def runnable_reason(table: PolicyTable, profile: EngineProfile) -> str:
    """Why `profile`'s engine cannot run `table` exactly as written ('' when it can): policies
    that differ between context ranges of one batch range, a policy the engine runs otherwise
    (planner.space.engine_policy), or per-batch-range policies its schedule cannot hold
    (planner.space.check_engine_schedule)."""
    from spectune.planner.space import check_engine_schedule

    if profile.engine == "spectune":
        return ""
    per_range: dict[tuple[int, int], TreePolicy | None] = {}
    for b in table.buckets:
        if per_range.setdefault(b.batch, b.policy) != b.policy:
            return f"batch range {b.batch[0]}-{b.batch[1]} has other policies at other contexts"
    policies = [per_range[r] for r in sorted(per_range)]
    try:
        for p in policies:
            if p is not None and p.verify != "token":
                return (
                    f"{profile.name} verifies token by token (greedy at temperature 0, "
                    f"recursive rejection above), not by {p.verify} ({policy_label(p)})"
                )
            if engine_policy(p, profile) != p:
                return f"{profile.name} runs {policy_label(p)} otherwise"
        check_engine_schedule(policies, profile)
    except SpecError as e:
        return str(e)
    on = [(r, p) for r, p in zip(sorted(per_range), policies, strict=True) if p is not None]
    if profile.schedule_first_is_max and len(set(policies)) > 1 and on:
        first = policies[0]
        if first is None or any(p.depth > first.depth for _, p in on):
            return f"{profile.name}'s smallest schedule key maps to the largest draft length"
    return ""


def fit_table(
    table: PolicyTable,
    profile: EngineProfile,
    evaluate: Callable[[TreePolicy | None, int, int], float],
    *,
    min_gain: float = 0.0,
) -> tuple[PolicyTable, EngineConfig, float]:
    """`table` with every bucket holding the configuration `profile`'s engine runs best under
    `evaluate` (tokens/s at batch, context: the planner's objective), and that configuration
    and its mean log-ratio to the table's own policies (0: nothing lost). Predictions of
    changed buckets are dropped (they were the old policies')."""
    buckets = [BucketSpec(b.batch, b.context) for b in table.buckets]
    cache: dict[tuple[TreePolicy | None, BucketSpec], float] = {}

    def score(p: TreePolicy | None, b: BucketSpec) -> float:
        if (p, b) not in cache:
            cache[(p, b)] = _geomean([evaluate(p, x, c) for x, c in b.points()])
        return cache[(p, b)]

    chosen, _ = choose_engine_config(
        buckets,
        [b.policy for b in table.buckets],
        [None if b.chain is None else b.chain.draft_tokens for b in table.buckets],
        profile,
        score,
        min_gain=min_gain,
    )
    rows: list[Bucket] = []
    loss = 0.0
    for b, spec in zip(table.buckets, buckets, strict=True):
        p = chosen.policy_for(b.batch)
        loss += math.log(score(p, spec)) - math.log(score(b.policy, spec))
        rows.append(b if p == b.policy else replace(b, policy=p, predicted=None))
    return replace(table, buckets=tuple(rows)), chosen, loss / len(rows)


__all__ = [
    "BucketScore",
    "EngineConfig",
    "EnginePlan",
    "choose_engine_config",
    "engine_plan",
    "fit_table",
    "runnable_reason",
]
