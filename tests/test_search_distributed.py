"""Distributed search: two worker processes share one study; one is killed with SIGKILL in the
middle of a trial. The study still completes, every finished trial is kept, and the killed
trial is marked failed (its heartbeat stopped) and run again by the survivor.

Runs against PostgreSQL (scripts/setup.d/postgres.sh starts one on loopback; override the URL
with SPECTUNE_TEST_POSTGRES_URL) and against a SQLite file. Without a PostgreSQL server the
PostgreSQL case skips, unless CI is set, where a missing server fails the test.

This file is also the worker program: `python tests/test_search_distributed.py URL PREFIX DIR`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import pytest
from optuna.trial import TrialState

from spectune.planner.buckets import BucketSpec
from spectune.planner.search import Scorer, SearchSettings, run_worker
from spectune.planner.space import policy_from_params
from spectune.planner.studies import (
    make_storage,
    open_study,
    prepare_study,
    resolve_storage_url,
    study_name,
)

pytestmark = pytest.mark.slow

POSTGRES_URL = os.environ.get(
    "SPECTUNE_TEST_POSTGRES_URL", "postgresql://spectune:spectune@127.0.0.1:5432/spectune_test"
)
BUCKET = BucketSpec((1, 1), (0, 4095))
TRIALS = 8
SLEEP_S = 0.8


class SlowObjective:
    """The fake closed form, slowed down, leaving a marker file when each evaluation starts."""

    def __init__(self, marker_dir: Path) -> None:
        sys.path.insert(0, str(Path(__file__).parent))
        from test_search import fake_objective

        self.inner = fake_objective()
        self.marker_dir = marker_dir
        self.calls = 0

    def __call__(self, policy: Any, batch: int, context: int) -> float:
        self.calls += 1
        (self.marker_dir / f"{os.getpid()}.{self.calls}").touch()
        time.sleep(SLEEP_S)
        return self.inner(policy, batch, context)


def _worker_main(url: str, prefix: str, marker_dir: str) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    def make_scorer(setup: Mapping[str, Any]) -> Scorer:
        return Scorer(SlowObjective(Path(marker_dir)))

    run_worker(url, prefix, make_scorer)


def _postgres_url() -> str:
    try:
        import sqlalchemy

        engine = sqlalchemy.create_engine(
            resolve_storage_url(POSTGRES_URL), connect_args={"connect_timeout": 3}
        )
        with engine.connect():
            pass
        engine.dispose()
    except Exception as e:  # driver missing or server down
        reason = f"no PostgreSQL at {POSTGRES_URL} ({type(e).__name__}: {e}); run scripts/setup.d/postgres.sh"
        if os.environ.get("CI"):
            pytest.fail(f"CI is set but {reason}")
        pytest.skip(reason)
    return POSTGRES_URL


@pytest.fixture(params=["postgresql", "sqlite"])
def storage_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'shared.db'}"
    else:
        yield _postgres_url()


def _spawn(url: str, prefix: str, marker_dir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, __file__, url, prefix, str(marker_dir)],
        stdout=subprocess.DEVNULL,
    )


def _wait_for(cond: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_killed_worker_loses_no_trial(storage_url: str, tmp_path: Path) -> None:
    prefix = f"t{uuid.uuid4().hex[:10]}"
    settings = SearchSettings(trials=TRIALS, seed=0, heartbeat_s=1, grace_s=2, chains=False)
    store = make_storage(storage_url, settings)
    name = study_name(prefix, BUCKET)
    study = open_study(store, name, BUCKET, settings)
    prepare_study(study, BUCKET, settings, {"scenario": {"fake": True}})
    markers = tmp_path / "markers"
    markers.mkdir()
    victim = _spawn(storage_url, prefix, markers)
    survivor = None
    try:
        # Let the victim finish one trial and start a second one, then kill it mid-trial.
        _wait_for(lambda: len(list(markers.glob(f"{victim.pid}.*"))) >= 2, 60, "victim trials")
        survivor = _spawn(storage_url, prefix, markers)
        time.sleep(0.2)
        before = {
            t.number: t.params
            for t in study.get_trials(deepcopy=False)
            if t.state == TrialState.COMPLETE
        }
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        assert survivor.wait(120) == 0
    finally:
        for p in (victim, survivor):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait(10)

    trials = optuna.load_study(study_name=name, storage=store).get_trials(deepcopy=False)
    complete = {t.number: t for t in trials if t.state == TrialState.COMPLETE}
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(complete) >= TRIALS
    assert all(n in complete and complete[n].params == p for n, p in before.items())
    assert failed, "the killed trial should be marked failed"
    assert not [t for t in trials if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    for f in failed:
        retries = [t for t in complete.values() if t.system_attrs.get("failed_trial") == f.number]
        assert retries, f"failed trial {f.number} was not retried"
        assert policy_from_params(retries[0].params) == policy_from_params(f.params)
    if storage_url.startswith("postgresql"):
        optuna.delete_study(study_name=name, storage=store)


if __name__ == "__main__":
    _worker_main(sys.argv[1], sys.argv[2], sys.argv[3])


def test_plan_with_local_workers_writes_the_table(tmp_path: Path) -> None:
    """`spectune plan --workers 2` on a SQLite file: two `spectune worker` processes share the
    bucket studies; the plan reads them back and writes the policy file."""
    from spectune.cli import main
    from spectune.specs.policy import PolicyTable

    out = tmp_path / "policy.json"
    url = f"sqlite:///{tmp_path / 'plan.db'}"
    args = [
        "plan",
        "--workers",
        "2",
        "--trials",
        "5",
        "--batch-edges",
        "1,64",
        "--context-edges",
        "4096",
        "--storage",
        url,
        "--study",
        "w",
        "--out",
        str(out),
        "--quiet",
    ]
    assert main(args) == 0
    table = PolicyTable.load(out)
    assert [b.batch for b in table.buckets] == [(1, 1), (2, 64)]
    assert table.provenance["workers"] == 2 and table.provenance["trials"] >= 10
    studies = optuna.get_all_study_names(url)
    assert len(studies) == 2
    for name in studies:
        done = optuna.load_study(study_name=name, storage=url).get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)
        )
        assert len(done) >= 5
    # the same storage and study for another scenario is refused, not mixed in
    assert main([*args, "--gpu", "a100-80g"]) == 2


def test_worker_without_a_plan_is_an_error(tmp_path: Path) -> None:
    from spectune.cli import main

    url = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["worker", "--storage", url, "--study", "nothing-here", "--quiet"]) == 2
