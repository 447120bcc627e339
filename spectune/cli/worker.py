"""`spectune worker`: join a shared plan search and run trials until every bucket is done.

`spectune plan --storage URL` (or `--workers N`) creates one study per bucket and records the
Scenario in them (Scenario.to_dict); a worker reads it back (Scenario.from_dict), so any number
of workers on any number of machines need only the storage URL and the study name. A worker killed mid-trial loses nothing: its
trial is marked failed once its heartbeat stops and is retried by a surviving worker.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from typing import Any

from spectune.cli.common import STORAGE_ENV, int_range
from spectune.planner.search import Scorer, run_worker
from spectune.simulator.scoring import build_scorer
from spectune.specs.errors import SpecError
from spectune.specs.scenario import Scenario


def _make_scorer(setup: Mapping[str, Any]) -> Scorer:
    """The plan's scorer, from the Scenario its studies record."""
    recorded = setup.get("scenario")
    if not isinstance(recorded, Mapping):
        raise SpecError(
            "the plan's studies record no scenario; were they written by spectune plan?"
        )
    scorer, _closed = build_scorer(Scenario.from_dict(recorded, "the studies' scenario"))
    return scorer


def run(args: argparse.Namespace) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = args.storage or os.environ.get(STORAGE_ENV)
    if not storage:
        raise SpecError(f"no storage: pass --storage URL or set {STORAGE_ENV}")
    override: dict[str, Any] = {}
    if args.heartbeat_s is not None:
        override["heartbeat_s"] = args.heartbeat_s

    def progress(bucket: str, done: int, target: int) -> None:
        if not args.quiet:
            print(f"\rworker: {bucket} {done}/{target}".ljust(60), end="", file=sys.stderr)

    n = run_worker(storage, args.study, _make_scorer, settings_override=override, progress=progress)
    if not args.quiet:
        print(f"\nworker: {n} bucket studies done", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "worker",
        help="run trials of a shared plan search (PostgreSQL or SQLite storage)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--storage",
        default=None,
        help="the plan's storage URL, e.g. postgresql://USER:PW@HOST:5432/DB (default: env "
        f"{STORAGE_ENV}, which keeps a password off the command line)",
    )
    p.add_argument("--study", required=True, help="the plan's study name prefix")
    p.add_argument(
        "--heartbeat-s",
        type=int_range(1, 3600),
        default=None,
        help="heartbeat interval, seconds (default: the plan's)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.set_defaults(func=run)
