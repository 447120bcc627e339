"""Optuna search for the best tree policy per (batch, context) bucket.

One study per bucket. Each trial draws a policy (planner.space), scores it at the bucket's
points with the objective it was handed (a function: the closed form of planner.objective by
default, the simulator's when the CLI asks; this module never imports the simulator) and
returns the geometric mean of tokens/s over those points. The engine defaults (SGLang 5/4/8,
EAGLE 7/10/60) and "off" are enqueued as the first trials, then the best policies of the
previous batch bucket (warm start), then TPE draws the rest.

The chosen policy of a bucket is the best-scoring one among those that lose to no reference
(off, SGLang default, EAGLE default; an engine's own default as the engine runs it when the user
sets nothing, under its running-request cap: SearchSettings.reference_caps) at any point of the
bucket, so the plan never does worse
than the defaults and turns speculation off where it loses; and a reference is kept unless the
best searched policy is predicted `min_gain` (5%) faster, a margin for the model's error. The
same margin keeps a shared verify budget (ECHO super-tree, TreePolicy.shared_budget, drawn in
buckets with batches above 1) only where it beats its per-request twin by that margin, since
no engine runs ECHO yet.
In multi-objective mode (throughput vs step latency) the study keeps the Pareto front and the
table takes the highest throughput on the front whose latency meets `max_latency_s`.

Storage (planner.studies): in memory, or an Optuna RDB URL. With sqlite:///file or
postgresql://... any number of processes share a study (`run_worker`); heartbeats mark a killed
worker's trial failed and the retry callback enqueues it again, so a kill loses no finished
trial.
Seeded: the same seed, objective and in-process storage give the same table in any process.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from spectune.planner.buckets import BucketSpec
from spectune.planner.objective import Latency, Objective
from spectune.planner.space import (
    PolicySpace,
    canonical_policy,
    neighbours,
    policy_from_params,
    policy_params,
    suggest_policy,
)
from spectune.planner.studies import (
    SearchSettings,
    bucket_studies,
    count_trials,
    make_sampler,
    make_storage,
    open_study,
    prepare_study,
    settings_from_dict,
    study_name,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import ChainChoice, TreePolicy, policy_label

ATTR_POINTS = "points_tokens_per_s"
ATTR_LATENCY = "latency_s"

Progress = Callable[[str, int, int], None]
"""progress(bucket_name, finished_trials, target_trials)"""


@dataclass(frozen=True)
class ParetoPoint:
    policy: TreePolicy | None
    tokens_per_s: float
    latency_s: float


@dataclass(frozen=True)
class BucketResult:
    """What the search chose for one bucket and how it compares."""

    bucket: BucketSpec
    policy: TreePolicy | None
    tokens_per_s: float
    points: tuple[float, ...]
    references: Mapping[str, tuple[float, ...]]
    trials: int
    failed: int
    chain: ChainChoice | None = None
    pareto: tuple[ParetoPoint, ...] = ()
    note: str = ""
    searched_best: float = 0.0
    """The best score among the study's own trials (inside the policy space; the chosen policy
    may also be an engine default outside a restricted space)."""
    flat: tuple[TreePolicy | None, float, tuple[float, ...]] | None = None
    """Where the space draws hierarchical policies: the best policy the target verifies itself
    (a tree, a chain or off: no intermediate), its tokens/s and its points, what a
    hierarchical choice is compared with (and must beat by min_gain); None otherwise."""

    @property
    def hierarchical_gain(self) -> float | None:
        """tokens/s of the chosen policy over the best flat one (None: no flat comparison)."""
        return None if self.flat is None else self.tokens_per_s / self.flat[1]

    @property
    def off_tokens_per_s(self) -> float:
        return geomean(self.references["off"])

    @property
    def speedup(self) -> float:
        """Over no speculation (geometric mean over the bucket's points)."""
        return self.tokens_per_s / self.off_tokens_per_s

    @property
    def best_default(self) -> tuple[str, float]:
        """The better engine default and its tokens/s ('off' when the engine has none)."""
        names = [n for n in self.references if n != "off"] or ["off"]
        name = max(names, key=lambda n: geomean(self.references[n]))
        return name, geomean(self.references[name])


def _below(gain: float) -> str:
    """A gain short of min_gain as a percentage rounded down to 0.1%, so that it never reads
    as the threshold it missed (+4.96% is +4.9%, not +5.0%)."""
    return f"{math.floor(1000 * gain) / 10:+.1f}%"


def geomean(values: Iterable[float]) -> float:
    vs = [max(float(v), 1e-300) for v in values]
    return math.exp(sum(math.log(v) for v in vs) / len(vs))


class Scorer:
    """Scores policies at a bucket's points through the objective, with a cache (the objective
    is deterministic, and TPE redraws the same integer points)."""

    def __init__(self, objective: Objective, latency: Latency | None = None) -> None:
        self.objective = objective
        self.latency = latency
        self._cache: dict[tuple[TreePolicy | None, int, int], float] = {}
        self._lat: dict[tuple[TreePolicy | None, int, int], float] = {}
        self.evaluations = 0

    def point_values(
        self, policy: TreePolicy | None, bucket: BucketSpec, max_running: int | None = None
    ) -> tuple[float, ...]:
        """tokens/s at each of the bucket's points; `max_running`: a server that admits no more
        running requests (an engine's own cap, planner.capacity.default_max_running) runs each
        larger batch as that many (the rest queue)."""
        pts = bucket.points()
        if max_running is not None:
            pts = tuple((min(b, max_running), c) for b, c in pts)
        missing = [(b, c) for b, c in pts if (policy, b, c) not in self._cache]
        if missing:
            self.evaluations += len(missing)
            many = getattr(self.objective, "many", None)
            ctxs = {c for _, c in missing}
            if many is not None and len(ctxs) == 1:  # one vectorised call (closed form)
                vals = [float(v) for v in many(policy, [b for b, _ in missing], ctxs.pop())]
            else:
                vals = [float(self.objective(policy, b, c)) for b, c in missing]
            for (b, c), v in zip(missing, vals, strict=True):
                if not math.isfinite(v) or v < 0:
                    raise SpecError(f"objective returned {v} for {policy} at batch {b}")
                self._cache[(policy, b, c)] = v
        return tuple(self._cache[(policy, b, c)] for b, c in pts)

    def latency_value(self, policy: TreePolicy | None, bucket: BucketSpec) -> float:
        if self.latency is None:
            raise SpecError("multi-objective search needs a latency function")
        vals = []
        for b, c in bucket.points():
            key = (policy, b, c)
            if key not in self._lat:
                self._lat[key] = float(self.latency(policy, b, c))
            vals.append(self._lat[key])
        return max(vals)


# ---- storage and studies ---------------------------------------------------------------------


def optimize_study(
    study: optuna.Study,
    bucket: BucketSpec,
    scorer: Scorer,
    settings: SearchSettings,
    *,
    progress: Progress | None = None,
    poll_s: float = 0.5,
) -> None:
    """Run trials until the study holds `settings.trials` complete trials and nothing is
    waiting (a retried trial of a killed worker is waiting) or still running elsewhere.
    Safe to call from many processes on one shared study."""
    space = settings.space
    multi = settings.multi_objective

    def objective(trial: optuna.Trial) -> float | tuple[float, float]:
        policy = suggest_policy(trial, space, bucket.batch[1])
        values = scorer.point_values(policy, bucket)
        trial.set_user_attr(ATTR_POINTS, list(values))
        score = geomean(values)
        if multi:
            lat = scorer.latency_value(policy, bucket)
            trial.set_user_attr(ATTR_LATENCY, lat)
            return score, lat
        return score

    heartbeat = isinstance(study._storage, optuna.storages.RDBStorage)
    while True:
        if heartbeat:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                optuna.storages.fail_stale_trials(study)
        complete, waiting, running, _failed = count_trials(study)
        if progress is not None:
            progress(bucket.name, complete, settings.trials)
        if waiting == 0 and complete + running >= settings.trials:
            if running == 0:
                return
            time.sleep(poll_s)  # another worker's trial: wait for it, or for it to go stale
            continue
        if waiting == 0 and complete >= settings.refine_after * settings.trials:
            _enqueue_neighbour(study, space, bucket.batch[1])
        try:
            study.optimize(objective, n_trials=1, catch=(SpecError,), gc_after_trial=False)
        except ValueError as e:
            # SQLite cannot lock rows: two processes may pop the same enqueued trial, and the
            # second tell is refused. The objective is deterministic, so nothing is lost.
            if not str(e).startswith("Cannot tell a"):
                raise


def _enqueue_neighbour(
    study: optuna.Study, space: PolicySpace, max_batch: int | None = None, top: int = 3
) -> bool:
    """Local refinement: enqueue the first untried neighbour of the best policies so far
    (TPE finds the region, the walk settles the integers; `max_batch`: the bucket's largest
    batch, which decides whether the shared budget is a neighbour). False when none is left."""
    trials = study.get_trials(deepcopy=False)
    seen = {policy_from_params(t.params) for t in trials if t.params}
    done = [t for t in trials if t.state == TrialState.COMPLETE]
    done.sort(key=lambda t: -t.values[0])
    best: list[TreePolicy | None] = []
    for t in done:
        p = policy_from_params(t.params)
        if p not in best:
            best.append(p)
        if len(best) == top:
            break
    for p in best:
        for q in neighbours(p, space, max_batch):
            if q not in seen:
                study.enqueue_trial(policy_params(q, space, max_batch))
                return True
    return False


# ---- choosing ---------------------------------------------------------------------------------


def _trial_policy(t: FrozenTrial) -> TreePolicy | None:
    return policy_from_params(t.params)


def _dominates(values: Sequence[float], refs: Mapping[str, Sequence[float]]) -> bool:
    """True when `values` is at least every reference at every point."""
    return all(v >= max(r[i] for r in refs.values()) * (1 - 1e-9) for i, v in enumerate(values))


def best_chain(
    scorer: Scorer, bucket: BucketSpec, space: PolicySpace, off: Sequence[float]
) -> ChainChoice:
    """The best chain (top-k 1, depth 1..space max) or off, for chain-only engines."""
    best_d, best_v = 0, geomean(off)
    for d in range(1, space.depth[1] + 1):
        v = geomean(scorer.point_values(canonical_policy("dynamic-topk", d, 1, d + 1), bucket))
        if v > best_v:
            best_d, best_v = d, v
    return ChainChoice(draft_tokens=best_d, tokens_per_s=best_v, speedup=best_v / geomean(off))


def choose(
    study: optuna.Study, bucket: BucketSpec, scorer: Scorer, settings: SearchSettings
) -> BucketResult:
    """Pick the bucket's policy from a finished study (see the module docstring)."""
    references = settings.references
    caps = settings.reference_caps
    refs = {name: scorer.point_values(p, bucket, caps.get(name)) for name, p in references.items()}
    complete = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    failed = sum(t.state == TrialState.FAIL for t in study.get_trials(deepcopy=False))
    cands: dict[TreePolicy | None, tuple[float, ...]] = {}
    lat: dict[TreePolicy | None, float] = {}
    for t in complete:
        p = _trial_policy(t)
        pts = t.user_attrs.get(ATTR_POINTS)
        cands[p] = tuple(pts) if pts else scorer.point_values(p, bucket)
        if settings.multi_objective:
            lat[p] = float(t.values[1])
    for p in references.values():  # as exported (caps set), not as the engine defaults run
        cands.setdefault(p, scorer.point_values(p, bucket))
        if settings.multi_objective and p not in lat:
            lat[p] = scorer.latency_value(p, bucket)

    pool = dict(cands)
    note = ""
    if settings.multi_objective and settings.max_latency_s is not None:
        limit = settings.max_latency_s
        pool = {p: v for p, v in cands.items() if lat[p] <= limit}
        if not pool:
            fastest = min(cands, key=lambda p: lat[p])
            pool = {fastest: cands[fastest]}
            note = f"no policy meets step latency {limit * 1e3:.2f} ms; took the fastest"
        refs_ok = {n: v for n, v in refs.items() if lat[references[n]] <= limit}
    else:
        refs_ok = refs
    safe = {p: v for p, v in pool.items() if _dominates(v, refs_ok)} if refs_ok else pool
    if not safe:
        safe = pool
        note = note or "no policy beats every reference at every point; took the best mean"
    policy = max(safe, key=lambda p: (geomean(safe[p]), p is None))
    twin_note = ""
    if settings.min_gain > 0 and policy is not None and policy.shared_budget:
        policy, twin_note = _per_request_unless_shared_gains(
            policy, safe, refs_ok, bucket, scorer, settings
        )
    searched_pick = policy
    kept = [p for p in references.values() if p in safe and p != policy]
    if settings.min_gain > 0 and policy not in references.values() and kept:
        ref = max(kept, key=lambda p: geomean(safe[p]))
        gain = geomean(safe[policy]) / geomean(safe[ref]) - 1
        if gain < settings.min_gain:
            name = next(n for n, p in references.items() if p == ref)
            note = note or (
                f"kept {name}: the best searched policy ({policy_label(policy)}) is predicted only "
                f"{_below(gain)} over it, >= {100 * settings.min_gain:g}% required (min_gain)"
            )
            policy = ref
    pareto: tuple[ParetoPoint, ...] = ()
    if settings.multi_objective:
        pareto = tuple(
            sorted(
                (
                    ParetoPoint(_trial_policy(t), t.values[0], t.values[1])
                    for t in study.best_trials
                ),
                key=lambda q: q.latency_s,
            )
        )
    flat = None
    if settings.space.hierarchical:
        flats = {p: v for p, v in pool.items() if p is None or not p.chain}
        if flats:
            best_flat = max(flats, key=lambda p: (geomean(flats[p]), p is None))
            flat = (best_flat, geomean(flats[best_flat]), flats[best_flat])
            gain = geomean(safe[policy]) / flat[1] - 1 if policy is not None else 0.0
            if (
                policy is not None
                and policy.chain
                and gain < settings.min_gain
                and best_flat in safe
            ):
                note = note or (
                    f"kept the best flat policy: the hierarchical {policy_label(policy)} is "
                    f"predicted only {_below(gain)} over it, >= {100 * settings.min_gain:g}% "
                    "required (min_gain; it also loads the intermediate model)"
                )
                policy = best_flat
    if policy == searched_pick:  # a kept reference says why; the twin does not matter then
        note = "; ".join(n for n in (note, twin_note) if n)
    chain = best_chain(scorer, bucket, settings.space, refs["off"]) if settings.chains else None
    searched = max((t.values[0] for t in complete), default=0.0)
    return BucketResult(
        bucket=bucket,
        policy=policy,
        searched_best=float(searched),
        tokens_per_s=geomean(safe[policy]),
        points=safe[policy],
        references=refs,
        trials=len(complete),
        failed=failed,
        chain=chain,
        pareto=pareto,
        note=note,
        flat=flat,
    )


def _per_request_unless_shared_gains(
    policy: TreePolicy,
    safe: dict[TreePolicy | None, tuple[float, ...]],
    refs: Mapping[str, Sequence[float]],
    bucket: BucketSpec,
    scorer: Scorer,
    settings: SearchSettings,
) -> tuple[TreePolicy, str]:
    """A shared verify budget (ECHO, which no engine runs yet) is kept only when it is predicted
    `min_gain` faster than its per-request twin (the same margin for the model's error as the
    references get); else the twin, if it too loses to no reference (and meets the latency
    limit). Adds the twin to `safe`. Returns the policy and a note ('' if unchanged)."""
    twin = replace(policy, shared_budget=False)
    values = safe.get(twin) or scorer.point_values(twin, bucket)
    if refs and not _dominates(values, refs):
        return policy, ""
    limit = settings.max_latency_s
    if (
        settings.multi_objective
        and limit is not None
        and scorer.latency_value(twin, bucket) > limit
    ):
        return policy, ""
    gain = geomean(safe[policy]) / geomean(values) - 1
    if gain >= settings.min_gain:
        return policy, ""
    safe[twin] = values
    return twin, (
        f"kept the per-request budget: ECHO's shared budget ({policy_label(policy)}) is predicted "
        f"only {_below(gain)} over it, >= {100 * settings.min_gain:g}% required (min_gain)"
    )


def top_policies(study: optuna.Study, n: int) -> list[TreePolicy | None]:
    """The n best distinct policies of a study (warm starts for the next bucket)."""
    done = [t for t in study.get_trials(deepcopy=False) if t.state == TrialState.COMPLETE]
    done.sort(key=lambda t: -t.values[0])
    out: list[TreePolicy | None] = []
    for t in done:
        p = _trial_policy(t)
        if p not in out:
            out.append(p)
        if len(out) == n:
            break
    return out


# ---- the whole plan -------------------------------------------------------------------------


def with_flat_search(hier: BucketResult, flat: BucketResult, min_gain: float = 0.0) -> BucketResult:
    """A bucket's result from a search that drew hierarchical policies, compared with the same
    bucket searched without them (`flat`: every trial spent on policies the target verifies
    itself, so its optimum is not starved by the hierarchical half of the space). The best
    flat policy of the two searches is recorded (`BucketResult.flat`); a hierarchical choice
    stands only when it beats it by `min_gain` (it also loads the intermediate model), else
    the better flat result is taken; a flat choice is the better of the two."""
    if hier.bucket != flat.bucket:
        raise SpecError(f"buckets differ: {hier.bucket} vs {flat.bucket}")
    best = (flat.policy, flat.tokens_per_s, flat.points)
    if hier.flat is not None and hier.flat[1] > best[1]:
        best = hier.flat
    chosen = hier.policy is not None and hier.policy.chain > 0
    if chosen:
        gain = hier.tokens_per_s / best[1] - 1
        if gain >= min_gain:
            return replace(hier, flat=best)
        base = flat if flat.tokens_per_s >= best[1] * (1 - 1e-12) else hier
        note = (
            f"kept the best flat policy: the hierarchical {policy_label(hier.policy)} is "
            f"predicted only {_below(gain)} over it, >= {100 * min_gain:g}% required (min_gain; "
            "it also loads the intermediate model)"
        )
        if base is hier:  # the hierarchical study's own flat optimum was the better one
            policy, tps, points = best
            return replace(hier, policy=policy, tokens_per_s=tps, points=points, note=note,
                           flat=best)  # fmt: skip
        return replace(flat, note=note, flat=best)
    out = hier if hier.tokens_per_s >= flat.tokens_per_s else flat
    return replace(out, flat=best)


def search(
    objective: Objective,
    buckets: Sequence[BucketSpec],
    settings: SearchSettings | None = None,
    *,
    latency: Latency | None = None,
    storage: str | None = None,
    study_prefix: str = "spectune",
    setup: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> list[BucketResult]:
    """Search every bucket in this process, one study each, in bucket order (so that each
    batch bucket warm-starts from the previous one at the same context)."""
    s = settings or SearchSettings()
    if s.multi_objective and latency is None:
        raise SpecError("multi-objective search needs a latency function")
    scorer = Scorer(objective, latency)
    store = make_storage(storage, s)
    results = []
    previous: dict[tuple[int, int], optuna.Study] = {}
    for bucket in buckets:
        study = open_study(store, study_name(study_prefix, bucket), bucket, s)
        prev = previous.get(bucket.context)
        warm = top_policies(prev, s.warm_start) if prev is not None and s.warm_start else []
        prepare_study(study, bucket, s, setup or {}, warm)
        optimize_study(study, bucket, scorer, s, progress=progress)
        results.append(choose(study, bucket, scorer, s))
        previous[bucket.context] = study
    return results


def run_worker(
    storage_url: str,
    study_prefix: str,
    make_scorer: Callable[[Mapping[str, Any]], Scorer],
    *,
    settings_override: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
) -> int:
    """Work on every bucket study of a plan in a shared storage until all are done; returns
    the number of studies visited. Many workers on many machines may run this at once."""
    probe = make_storage(storage_url)
    studies = bucket_studies(probe, study_prefix)
    scorer: Scorer | None = None
    for name, bucket, setup in studies:
        s = settings_from_dict({**setup["settings"], **(settings_override or {})})
        if scorer is None:
            scorer = make_scorer(setup)
        store = make_storage(storage_url, s)
        sampler = make_sampler(s, bucket, salt=os.getpid())
        study = optuna.load_study(study_name=name, storage=store, sampler=sampler)
        optimize_study(study, bucket, scorer, s, progress=progress)
    return len(studies)


__all__ = [
    "BucketResult",
    "ParetoPoint",
    "Progress",
    "Scorer",
    "SearchSettings",
    "best_chain",
    "choose",
    "geomean",
    "optimize_study",
    "run_worker",
    "search",
    "top_policies",
    "with_flat_search",
]
