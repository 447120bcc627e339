"""Optuna search for the best tree policy per (batch, context) bucket.

One study per bucket. Each trial draws a policy (planner.space), scores it at the bucket's
points with the objective it was handed (a function: the closed form of planner.objective by
default, the simulator's when the CLI asks; this module never imports the simulator) and
returns the geometric mean of tokens/s over those points. The engine defaults (SGLang 5/4/8,
EAGLE 7/10/60) and "off" are enqueued as the first trials, then the best policies of the
previous batch bucket (warm start), then TPE draws the rest.

The chosen policy of a bucket is the best-scoring one among those that lose to no reference
(off, SGLang default, EAGLE default) at any point of the bucket, so the plan never does worse
than the defaults and turns speculation off where it loses. In multi-objective mode
(throughput vs step latency) the study keeps the Pareto front and the table takes the highest
throughput on the front whose latency meets `max_latency_s`.

Storage: in memory, or an Optuna RDB URL. With sqlite:///file or postgresql://... any number
of processes share a study (`run_worker`); heartbeats mark a killed worker's trial failed and
RetryFailedTrialCallback enqueues it again, so a kill loses no finished trial.
Seeded: the same seed, objective and in-process storage give the same table in any process.
"""

from __future__ import annotations

import math
import time
import warnings
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from spectune.planner.buckets import BucketSpec
from spectune.planner.objective import Latency, Objective
from spectune.planner.space import (
    EAGLE_DEFAULT,
    ENGINE_DEFAULTS,
    SEED_POLICIES,
    PolicySpace,
    canonical_policy,
    neighbours,
    policy_from_params,
    policy_params,
    suggest_policy,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import ChainChoice, TreePolicy

REFERENCES: Mapping[str, TreePolicy | None] = {"off": None, **ENGINE_DEFAULTS}
ATTR_POINTS = "points_tokens_per_s"
ATTR_LATENCY = "latency_s"
ATTR_SETUP = "spectune.setup"

Progress = Callable[[str, int, int], None]
"""progress(bucket_name, finished_trials, target_trials)"""


@dataclass(frozen=True)
class SearchSettings:
    """How hard and where to search."""

    trials: int = 48
    seed: int = 0
    space: PolicySpace = field(default_factory=PolicySpace)
    multi_objective: bool = False
    max_latency_s: float | None = None
    warm_start: int = 3
    seeds: bool = True
    refine_after: float = 0.5
    startup_trials: int = 8
    chains: bool = True
    heartbeat_s: int = 5
    grace_s: int | None = None
    max_retry: int = 3

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise SpecError(f"--trials must be at least 1, got {self.trials}")


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

    @property
    def off_tokens_per_s(self) -> float:
        return geomean(self.references["off"])

    @property
    def speedup(self) -> float:
        """Over no speculation (geometric mean over the bucket's points)."""
        return self.tokens_per_s / self.off_tokens_per_s

    @property
    def best_default(self) -> tuple[str, float]:
        """The better engine default and its tokens/s."""
        name = max(ENGINE_DEFAULTS, key=lambda n: geomean(self.references[n]))
        return name, geomean(self.references[name])


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

    def point_values(self, policy: TreePolicy | None, bucket: BucketSpec) -> tuple[float, ...]:
        pts = bucket.points()
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


def make_storage(url: str | None, settings: SearchSettings | None = None) -> Any:
    """In-memory storage for None/'' (one process), else an RDB storage with heartbeats and
    failed-trial retry (sqlite:///file.db, postgresql://user:pw@host:port/db)."""
    s = settings or SearchSettings()
    if not url:
        return optuna.storages.InMemoryStorage()
    if not url.startswith(("sqlite:", "postgresql", "mysql")):
        raise SpecError(
            f"--storage {url!r}: expected sqlite:///FILE.db or postgresql://USER:PW@HOST:PORT/DB"
        )
    url = resolve_storage_url(url)
    engine_kwargs: dict[str, Any] = {}
    if url.startswith("sqlite:"):
        engine_kwargs = {"connect_args": {"timeout": 60}}
    else:
        engine_kwargs = {"pool_pre_ping": True}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        try:
            retry: dict[str, Any]
            if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):  # optuna >= 4.9
                cb = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=s.max_retry)
                retry = {"heartbeat_stale_trial_callback": cb}
            else:  # pragma: no cover - older optuna
                cb = optuna.storages.RetryFailedTrialCallback(max_retry=s.max_retry)
                retry = {"failed_trial_callback": cb}
            return optuna.storages.RDBStorage(
                url,
                engine_kwargs=engine_kwargs,
                heartbeat_interval=s.heartbeat_s,
                grace_period=s.grace_s or 3 * s.heartbeat_s,
                **retry,
            )
        except ImportError as e:
            raise SpecError(
                f"--storage {url!r} needs a database driver: {e}. For PostgreSQL install "
                "the postgres extra: pip install 'spectune[postgres]'"
            ) from e
        except Exception as e:  # sqlalchemy OperationalError and friends
            raise SpecError(f"--storage {url!r}: cannot open the database: {e}") from e


def resolve_storage_url(url: str) -> str:
    """postgresql://... with the driver that is installed: SQLAlchemy 2.1 defaults to psycopg
    (3), while the `postgres` extra brings psycopg2."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    import importlib.util

    rest = url.split("://", 1)[1]
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
        return f"postgresql+psycopg2://{rest}"
    return f"postgresql://{rest}"


def study_name(prefix: str, bucket: BucketSpec) -> str:
    return f"{prefix}.{bucket.name}"


def bucket_seed(seed: int, bucket: BucketSpec) -> int:
    """A per-bucket sampler seed that does not depend on bucket order or process."""
    return zlib.crc32(f"{seed}:{bucket.name}".encode()) & 0x7FFFFFFF


def _sampler(settings: SearchSettings, bucket: BucketSpec) -> optuna.samplers.BaseSampler:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=bucket_seed(settings.seed, bucket),
            multivariate=True,
            group=True,
            n_startup_trials=settings.startup_trials,
            constant_liar=True,
        )


def _directions(settings: SearchSettings) -> list[optuna.study.StudyDirection]:
    up, down = optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE
    return [up, down] if settings.multi_objective else [up]


def open_study(
    storage: Any, name: str, bucket: BucketSpec, settings: SearchSettings
) -> optuna.Study:
    """Create or load the study of one bucket."""
    return optuna.create_study(
        storage=storage,
        study_name=name,
        sampler=_sampler(settings, bucket),
        directions=_directions(settings),
        load_if_exists=True,
    )


def prepare_study(
    study: optuna.Study,
    bucket: BucketSpec,
    settings: SearchSettings,
    setup: Mapping[str, Any],
    warm: Sequence[TreePolicy | None] = (),
) -> None:
    """Record the bucket and settings in the study (workers read them) and enqueue the
    references and warm starts, once."""
    if ATTR_SETUP in study.user_attrs:
        return
    seeds = SEED_POLICIES if settings.seeds else ()
    queue: list[TreePolicy | None] = []
    for policy in (*REFERENCES.values(), *warm, *seeds):
        if (policy is None and not settings.space.allow_off) or policy in queue:
            continue
        queue.append(policy)
    for policy in queue[: settings.trials]:  # the references first; never more than asked
        study.enqueue_trial(policy_params(policy, settings.space), skip_if_exists=True)
    study.set_user_attr(
        ATTR_SETUP,
        {
            "bucket": {"batch": list(bucket.batch), "context": list(bucket.context)},
            "settings": settings_to_dict(settings),
            **dict(setup),
        },
    )


def settings_to_dict(settings: SearchSettings) -> dict[str, Any]:
    d = asdict(settings)
    d["space"] = {k: list(v) if isinstance(v, tuple) else v for k, v in d["space"].items()}
    return d


def settings_from_dict(d: Mapping[str, Any]) -> SearchSettings:
    raw: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in d["space"].items()}
    space = PolicySpace(**raw)
    return SearchSettings(**{**d, "space": space})


def _count(study: optuna.Study) -> tuple[int, int, int, int]:
    """(complete, waiting, running, failed) trials of a study."""
    counts = dict.fromkeys(TrialState, 0)
    for t in study.get_trials(deepcopy=False):
        counts[t.state] += 1
    return (
        counts[TrialState.COMPLETE],
        counts[TrialState.WAITING],
        counts[TrialState.RUNNING],
        counts[TrialState.FAIL],
    )


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
        policy = suggest_policy(trial, space)
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
        complete, waiting, running, _failed = _count(study)
        if progress is not None:
            progress(bucket.name, complete, settings.trials)
        if waiting == 0 and complete + running >= settings.trials:
            if running == 0:
                return
            time.sleep(poll_s)  # another worker's trial: wait for it, or for it to go stale
            continue
        if waiting == 0 and complete >= settings.refine_after * settings.trials:
            _enqueue_neighbour(study, space)
        try:
            study.optimize(objective, n_trials=1, catch=(SpecError,), gc_after_trial=False)
        except ValueError as e:
            # SQLite cannot lock rows: two processes may pop the same enqueued trial, and the
            # second tell is refused. The objective is deterministic, so nothing is lost.
            if not str(e).startswith("Cannot tell a"):
                raise


def _enqueue_neighbour(study: optuna.Study, space: PolicySpace, top: int = 3) -> bool:
    """Local refinement: enqueue the first untried neighbour of the best policies so far
    (TPE finds the region, the walk settles the integers). False when none is left."""
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
        for q in neighbours(p, space):
            if q not in seen:
                study.enqueue_trial(policy_params(q, space))
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
    refs = {name: scorer.point_values(p, bucket) for name, p in REFERENCES.items()}
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
    for name, p in REFERENCES.items():
        cands.setdefault(p, refs[name])
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
        refs_ok = {n: v for n, v in refs.items() if lat[REFERENCES[n]] <= limit}
    else:
        refs_ok = refs
    safe = {p: v for p, v in pool.items() if _dominates(v, refs_ok)} if refs_ok else pool
    if not safe:
        safe = pool
        note = note or "no policy beats every reference at every point; took the best mean"
    policy = max(safe, key=lambda p: (geomean(safe[p]), p is None))
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


def bucket_studies(
    storage: Any, study_prefix: str
) -> list[tuple[str, BucketSpec, Mapping[str, Any]]]:
    """The bucket studies of a plan in a shared storage, in bucket order."""
    out = []
    for summary in optuna.get_all_study_summaries(storage, include_best_trial=False):
        if not summary.study_name.startswith(study_prefix + "."):
            continue
        setup = summary.user_attrs.get(ATTR_SETUP)
        if not setup:
            continue
        b = setup["bucket"]
        out.append((summary.study_name, BucketSpec(tuple(b["batch"]), tuple(b["context"])), setup))
    out.sort(key=lambda x: (x[1].context, x[1].batch))
    if not out:
        raise SpecError(f"no spectune studies named {study_prefix}.* in this storage")
    return out


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
        study = optuna.load_study(study_name=name, storage=store, sampler=_sampler(s, bucket))
        optimize_study(study, bucket, scorer, s, progress=progress)
    return len(studies)


__all__ = [
    "EAGLE_DEFAULT",
    "REFERENCES",
    "BucketResult",
    "ParetoPoint",
    "Scorer",
    "SearchSettings",
    "bucket_studies",
    "choose",
    "geomean",
    "make_storage",
    "open_study",
    "optimize_study",
    "prepare_study",
    "run_worker",
    "search",
]
