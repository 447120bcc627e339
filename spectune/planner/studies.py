"""Optuna studies of a plan: storages, study names, samplers, and what a study records.

A plan has one study per bucket, named PREFIX.BUCKET. The plan process creates each study,
enqueues the references and seeds, and records the bucket, the search settings and the scenario
in the study's user attributes, so a `spectune worker` anywhere needs only the storage URL and
the prefix. RDB storages (SQLite, PostgreSQL) get heartbeats and a retry callback: a trial
whose worker died is failed once its heartbeat stops and enqueued again.
"""

from __future__ import annotations

import importlib.util
import warnings
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import optuna
from optuna.trial import TrialState

from spectune.planner.buckets import BucketSpec
from spectune.planner.space import (
    PolicySpace,
    engine_references,
    policy_params,
    seed_policies,
)
from spectune.specs.engine import load_engine
from spectune.specs.errors import SpecError, mask_secrets
from spectune.specs.io import help_field
from spectune.specs.policy import TreePolicy

ATTR_SETUP = "spectune.setup"


@dataclass(frozen=True)
class SearchSettings:
    """How hard and where to search."""

    trials: int = help_field(48, help="complete trials per bucket study (references included)")
    seed: int = help_field(0, help="sampler seed; each bucket derives its own from it")
    space: PolicySpace = field(default_factory=PolicySpace, metadata={"help": "policy space"})
    multi_objective: bool = help_field(False, help="maximise tokens/s and minimise latency")
    max_latency_s: float | None = help_field(
        None, help="multi-objective: the table takes the best tokens/s under this latency"
    )
    min_gain: float = help_field(
        0.05,
        help="keep the best reference (off or an engine default) unless a searched policy is "
        "predicted at least this much faster: a margin for the model's error",
    )
    warm_start: int = help_field(3, help="best policies of the previous batch bucket to enqueue")
    seeds: bool = help_field(True, help="enqueue planner.space.seed_policies(space)")
    refine_after: float = help_field(
        0.5, help="fraction of trials after which neighbours of the best are walked"
    )
    startup_trials: int = help_field(8, help="TPE's random trials before it models")
    chains: bool = help_field(True, help="also find the best chain per bucket (chain engines)")
    heartbeat_s: int = help_field(5, help="RDB storages: worker heartbeat interval, seconds")
    grace_s: int | None = help_field(
        None, help="a trial without heartbeat this long is failed (default 3 x heartbeat)"
    )
    max_retry: int = help_field(3, help="times a failed (killed) trial is run again")
    engine: str = help_field(
        "spectune",
        help="engine profile (name or file) whose default config every plan must beat, beside "
        "no speculation; `space` holds what the engine runs (planner.space.engine_space)",
    )

    @property
    def references(self) -> Mapping[str, TreePolicy | None]:
        """The policies every bucket's choice must not lose to (planner.space.engine_references
        for the engine): no speculation and the engine's default config."""
        return engine_references(None if self.engine == "spectune" else load_engine(self.engine))

    @property
    def reference_caps(self) -> Mapping[str, int]:
        """Reference name -> the running requests its server admits when the user sets nothing
        (planner.capacity.default_max_running: SGLang's 48 with speculation on); references
        without a cap of their own are absent."""
        from spectune.planner.capacity import default_max_running

        if self.engine == "spectune":
            return {}
        profile = load_engine(self.engine)
        caps = {}
        for name, p in self.references.items():
            cap = default_max_running(profile, p is not None)
            if cap is not None:
                caps[name] = cap
        return caps

    def __post_init__(self) -> None:
        if self.trials < 1:
            raise SpecError(f"--trials must be at least 1, got {self.trials}")
        if self.min_gain < 0:
            raise SpecError(f"--min-gain must be >= 0, got {self.min_gain}")


def make_storage(url: str | None, settings: SearchSettings | None = None) -> Any:
    """In-memory storage for None/'' (one process), else an RDB storage with heartbeats and
    failed-trial retry (sqlite:///file.db, postgresql://user:pw@host:port/db)."""
    s = settings or SearchSettings()
    if not url:
        return optuna.storages.InMemoryStorage()
    if not url.startswith(("sqlite:", "postgresql", "mysql")):
        raise SpecError(
            f"--storage {mask_secrets(url)!r}: expected sqlite:///FILE.db or postgresql://USER:PW@HOST:PORT/DB"
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
                f"--storage {mask_secrets(url)!r} needs a database driver: {e}. For PostgreSQL install "
                "the postgres extra: pip install 'spectune[postgres]'"
            ) from e
        except Exception as e:  # sqlalchemy OperationalError and friends
            raise SpecError(
                f"--storage {mask_secrets(url)!r}: cannot open the database: {mask_secrets(str(e))}"
            ) from e


def resolve_storage_url(url: str) -> str:
    """postgresql://... with the driver that is installed: SQLAlchemy 2.1 defaults to psycopg
    (3), while the `postgres` extra brings psycopg2."""
    if not url.startswith(("postgresql://", "postgres://")):
        return url
    rest = url.split("://", 1)[1]
    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2"):
        return f"postgresql+psycopg2://{rest}"
    return f"postgresql://{rest}"


def study_name(prefix: str, bucket: BucketSpec) -> str:
    return f"{prefix}.{bucket.name}"


def bucket_seed(seed: int, bucket: BucketSpec) -> int:
    """A per-bucket sampler seed that does not depend on bucket order or process."""
    return zlib.crc32(f"{seed}:{bucket.name}".encode()) & 0x7FFFFFFF


def make_sampler(
    settings: SearchSettings, bucket: BucketSpec, salt: int = 0
) -> optuna.samplers.BaseSampler:
    """Seeded multivariate TPE. Workers sharing a study pass distinct salts (their process
    ids) so that they do not all draw the same points."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.TPESampler(
            seed=(bucket_seed(settings.seed, bucket) + salt) & 0x7FFFFFFF,
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
        sampler=make_sampler(settings, bucket),
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
    seeds = seed_policies(settings.space) if settings.seeds else ()
    queue: list[TreePolicy | None] = []
    for policy in (*settings.references.values(), *warm, *seeds):
        if (policy is None and not settings.space.allow_off) or policy in queue:
            continue
        queue.append(policy)
    for policy in queue[: settings.trials]:  # the references first; never more than asked
        study.enqueue_trial(
            policy_params(policy, settings.space, bucket.batch[1]), skip_if_exists=True
        )
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


def count_trials(study: optuna.Study) -> tuple[int, int, int, int]:
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
