"""`spectune plan`: search the best draft-tree policy per batch size and context, write the
policy file.

Bare `spectune plan` tunes Llama-3.1-8B with its EAGLE-3 head on an H100-SXM for MT-Bench
traffic with the closed-form objective, in well under a minute on two cores. `--objective
goodput` scores by simulation instead (the simulator's objective, handed to the search here:
the planner never imports the simulator). `--workers N` runs N worker processes on a shared
storage (a temporary SQLite file unless --storage names one); any number of further
`spectune worker --storage URL --study NAME` processes, on any machine, may join.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from spectune import __version__
from spectune.cli.common import (
    STORAGE_ENV,
    add_intermediate,
    add_strict,
    check_out_path,
    engine_option,
    float_range,
    int_range,
    ints,
    seed,
)
from spectune.cli.outputs import add_csv_plot, check_csv_plot, write_outputs
from spectune.cli.plan_report import (
    bucket_notes,
    format_range,
    hierarchy_lines,
    hierarchy_provenance,
    summarize_notes,
)
from spectune.planner.buckets import (
    DEFAULT_BATCH_EDGES,
    DEFAULT_CONTEXT_EDGES,
    BucketSpec,
    buckets_from_edges,
)
from spectune.planner.engine_plan import engine_plan
from spectune.planner.objective import ClosedFormObjective
from spectune.planner.search import (
    BucketResult,
    Scorer,
    SearchSettings,
    choose,
    search,
    with_flat_search,
)
from spectune.planner.space import (
    HIERARCHICAL_CHAIN,
    PolicySpace,
    check_engine_drafter,
    engine_default,
    engine_space,
)
from spectune.planner.studies import (
    ATTR_SETUP,
    make_storage,
    open_study,
    prepare_study,
    study_name,
)
from spectune.planner.table import build_table
from spectune.planner.tokens_per_s import SERVED
from spectune.simulator.scoring import build_scorer
from spectune.specs.calibration import load_calibration
from spectune.specs.compat import drafter_kind
from spectune.specs.engine import load_engine
from spectune.specs.errors import SpecError, mask_secrets
from spectune.specs.policy import PolicyTable, policy_label
from spectune.specs.scenario import OBJECTIVES, Scenario

DEFAULTS = Scenario()
"""The scenario of a bare `spectune plan` (each flag's default)."""


# ---- the scenario (shared with `spectune worker` through the studies) ------------------------


def scenario_from_args(args: argparse.Namespace) -> Scenario:
    """The Scenario the flags name. With --calibration the scenario holds the file's absolute
    path (workers load it themselves) and the GPU defaults to the one it was fitted on."""
    calibration = getattr(args, "calibration", None)
    gpu = args.gpu
    if calibration:
        path = Path(calibration)
        if not path.is_file():
            raise SpecError(f"--calibration {calibration}: no such file")
        calibration = str(path.resolve())
        if gpu is None:
            gpu = load_calibration(path).hardware or None
    return Scenario(
        target=args.target,
        drafter=args.drafter,
        gpu=gpu or DEFAULTS.gpu,
        tp=args.tp,
        workload=args.workload,
        calibration=calibration or None,
        engine=getattr(args, "engine", DEFAULTS.engine),
        objective=args.objective,
        slo_tpot_ms=args.slo_tpot_ms,
        slo_ttft_ms=args.slo_ttft_ms,
        intermediate=args.intermediate,
        intermediate_drafter=args.intermediate_drafter,
    )


# ---- output ---------------------------------------------------------------------------------


def _default_legend(engine: str) -> str:
    """What the "vs default" column compares with, for the engine planned for."""
    profile = load_engine(engine)
    if profile.engine == "spectune":
        return "over the better of the SGLang (5/4/8) and EAGLE (7/10/60) trees"
    default = engine_default(profile)
    if default is None:
        return f"{profile.name} has no default speculative config (it requires one), so over off"
    return f"over {profile.name}'s own default config ({default.label})"


def print_table(
    results: Sequence[BucketResult],
    out: Any = None,
    closed: ClosedFormObjective | None = None,
    engine: str = "spectune",
    *,
    verbose: bool = True,
    min_gain: float = SearchSettings.min_gain,
) -> None:
    """The plan as a table; with `closed`, buckets whose largest batch the KV cache cannot hold
    at their context say how many requests actually run. `engine`: the engine profile planned
    for, whose default config the "vs default" column compares with. Notes follow their rows
    with `verbose`, else one line per kind of note under the table (plan_report)."""
    out = out or sys.stdout
    # the policy column fits the table's longest label (prune + graft + hierarchical: > 30)
    labels = [policy_label(r.policy) for r in results]
    labels += [policy_label(q.policy) for r in results for q in r.pareto]
    w = max([30, *map(len, labels)])
    head = (
        f"{'batch':>8} {'context':>12}  {'policy':<{w}} {'served tok/s':>12} {'vs off':>7} "
        f"{'vs default':>16}  {'chain':>5}"
    )
    print(head, file=out)
    print("-" * len(head), file=out)
    kv_notes: dict[int, str] = {}
    for i, r in enumerate(results):
        name, dflt = r.best_default
        chain = "-" if r.chain is None else str(r.chain.draft_tokens)
        print(
            f"{format_range(r.bucket.batch):>8} {format_range(r.bucket.context):>12}  "
            f"{policy_label(r.policy):<{w}} {r.tokens_per_s:12.0f} {r.speedup:6.2f}x "
            f"{r.tokens_per_s / dflt:7.2f}x {name:<8}  {chain:>5}",
            file=out,
        )
        if r.note and verbose:
            print(f"{'':>8} note: {r.note}", file=out)
        if closed is not None:
            ctx = r.bucket.context_point
            fits = int(closed.fitting_batch(r.bucket.batch[1], ctx)[0])
            if fits < r.bucket.batch[1]:
                kv_notes[i] = (
                    f"the KV cache holds {fits} requests at context {ctx}; "
                    "larger batches run as that many"
                )
                if verbose:
                    print(f"{'':>8} note: {kv_notes[i]}", file=out)
        for q in r.pareto:
            print(
                f"{'':>23}pareto  {policy_label(q.policy):<{w}} {q.tokens_per_s:9.0f} "
                f"{SERVED.label} {q.latency_s * 1e3:7.2f} ms/step",
                file=out,
            )
    print(
        f"{SERVED.label}: predicted {SERVED.description} (prompt = context), geometric mean "
        f"over the bucket's batch ends; vs default: {_default_legend(engine)}; "
        "chain: best chain length for chain-only engines (0 = off)",
        file=out,
    )
    for line in hierarchy_lines(results):
        print(line, file=out)
    notes = bucket_notes(results, kv_notes)
    if notes and not verbose:
        print(f"notes ({len(notes)}; --verbose shows each under its row):", file=out)
        for line in summarize_notes(notes, min_gain):
            print(f"  {line}", file=out)


class ProgressBar:
    """One line on stderr, redrawn in place on a terminal, every 10% otherwise."""

    def __init__(self, total: int, enabled: bool = True) -> None:
        self.total = max(total, 1)
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        self.done_before = 0
        self.last_bucket = ""
        self.last_decile = -1
        self.start = time.monotonic()

    def update(self, bucket: str, done: int, target: int) -> None:
        if not self.enabled:
            return
        if bucket != self.last_bucket:
            if self.last_bucket:
                self.done_before += target
            self.last_bucket = bucket
        self.show(self.done_before + min(done, target), bucket)

    def show(self, done: int, label: str) -> None:
        if not self.enabled:
            return
        frac = min(done / self.total, 1.0)
        decile = int(frac * 10)
        if not self.tty and decile == self.last_decile:
            return
        self.last_decile = decile
        bar = "#" * int(frac * 30)
        line = (
            f"planning [{bar:<30}] {done}/{self.total} trials "
            f"{time.monotonic() - self.start:5.1f}s {label}"
        )
        print(
            ("\r" + line.ljust(100)) if self.tty else line,
            end="" if self.tty else "\n",
            file=sys.stderr,
            flush=True,
        )

    def close(self) -> None:
        if self.enabled and self.tty:
            print(file=sys.stderr)


# ---- running --------------------------------------------------------------------------------


def default_study_prefix(scenario: Scenario, seed: int) -> str:
    s = scenario
    raw = f"spectune.{s.target}.{s.drafter}.{s.gpu}.{s.workload}.tp{s.tp}.{s.objective}.s{seed}"
    if s.calibration:  # another calibration is another study
        raw += f".cal-{Path(s.calibration).stem}"
    if s.engine != DEFAULTS.engine:  # so is another engine
        raw += f".eng-{s.engine}"
    if s.intermediate:  # and another hierarchical stage
        raw += f".int-{s.intermediate}.{s.intermediate_drafter or s.drafter}"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", raw)


def _redact(url: str | None) -> str:
    return mask_secrets(url) if url else "memory"


def _settings(args: argparse.Namespace, scenario: Scenario) -> SearchSettings:
    """The search settings the flags name, within what the scenario's engine runs."""
    profile = engine_option(scenario.engine)
    resolved = scenario.resolve()
    if profile.engine != "spectune":
        check_engine_drafter(drafter_kind(resolved.drafter), profile)
    base = PolicySpace().at_temperature(resolved.workload.temperature)  # rules, delayed at T > 0
    if resolved.intermediate is not None:  # hierarchical policies join the search
        if profile.engine != "spectune":
            raise SpecError(
                f"--intermediate: {profile.name} does not run hierarchical drafting (no serving "
                "engine has an intermediate-model stage); plan without --engine to price it "
                "(spectune plans and simulates it, but neither its executor nor an export runs "
                "it), or drop --intermediate"
            )
        base = replace(base, chain=HIERARCHICAL_CHAIN)
    return SearchSettings(
        space=engine_space(profile, base),
        engine=scenario.engine,
        trials=args.trials,
        seed=args.seed,
        multi_objective=args.multi_objective,
        max_latency_s=None if args.max_step_ms is None else args.max_step_ms / 1e3,
        min_gain=args.min_gain,
        heartbeat_s=args.heartbeat_s,
    )


def _check_same_scenario(study: Any, scenario: Scenario, name: str) -> None:
    setup = study.user_attrs.get(ATTR_SETUP)
    if not setup:
        return
    recorded = setup.get("scenario")
    try:
        same = isinstance(recorded, Mapping) and Scenario.from_dict(recorded) == scenario
    except SpecError:  # a scenario this version cannot read is another scenario
        same = False
    if not same:
        raise SpecError(
            f"study {name!r} in this storage was planned for another scenario "
            f"({recorded}); pass another --study"
        )


def _run_distributed(
    args: argparse.Namespace,
    buckets: Sequence[BucketSpec],
    settings: SearchSettings,
    scorer: Scorer,
    scenario: Scenario,
    prefix: str,
    bar: ProgressBar,
) -> list[BucketResult]:
    tmpdir = None
    url = args.storage
    if not url:
        tmpdir = tempfile.TemporaryDirectory(prefix="spectune-plan-")
        url = f"sqlite:///{Path(tmpdir.name) / 'study.db'}"
    try:
        store = make_storage(url, settings)
        studies = []
        for b in buckets:
            name = study_name(prefix, b)
            study = open_study(store, name, b, settings)
            _check_same_scenario(study, scenario, name)
            prepare_study(study, b, settings, {"scenario": scenario.to_dict()})
            studies.append(study)
        # the URL (a password in it) goes through the environment, never the command line
        cmd = [sys.executable, "-m", "spectune", "worker", "--study", prefix, "--quiet"]
        env = {**os.environ, STORAGE_ENV: url}
        procs = [subprocess.Popen(cmd, env=env) for _ in range(args.workers)]
        total = settings.trials * len(buckets)
        while any(p.poll() is None for p in procs):
            done = sum(min(settings.trials, _complete(s)) for s in studies)
            bar.show(done, f"{args.workers} workers")
            time.sleep(0.5)
        bar.show(total, f"{args.workers} workers")
        bad = [p.returncode for p in procs if p.returncode != 0]
        if bad and not all(_complete(s) >= settings.trials for s in studies):
            raise SpecError(f"{len(bad)} worker(s) failed (exit codes {bad}); see their messages")
        return [choose(s, b, scorer, settings) for s, b in zip(studies, buckets, strict=True)]
    finally:
        if tmpdir is not None:
            tmpdir.cleanup()


def _compare_flat(
    args: argparse.Namespace,
    results: Sequence[BucketResult],
    buckets: Sequence[BucketSpec],
    settings: SearchSettings,
    scorer: Scorer,
    scenario: Scenario,
    bar: ProgressBar,
) -> list[BucketResult]:
    """With an intermediate model: every bucket searched again without hierarchical policies
    (here, in its own studies), so a hierarchical choice is compared with a flat optimum that
    had every trial (planner.search.with_flat_search)."""
    flat_settings = replace(settings, space=replace(settings.space, chain=(0, 0)))
    flat = search(
        scorer.objective,
        buckets,
        flat_settings,
        latency=scorer.latency,
        storage=args.storage if args.workers == 0 else None,
        study_prefix=(args.study or default_study_prefix(scenario, args.seed)) + ".flat",
        setup={"scenario": scenario.to_dict()},
        progress=lambda b, done, target: bar.update("flat " + b, done, target),
    )
    return [with_flat_search(h, f, settings.min_gain) for h, f in zip(results, flat, strict=True)]


def _complete(study: Any) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))


def run(args: argparse.Namespace) -> int:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    check_out_path(args.out)
    check_csv_plot(args)
    scenario = scenario_from_args(args)
    settings = _settings(args, scenario)
    buckets = buckets_from_edges(args.batch_edges, args.context_edges)
    scorer, closed = build_scorer(scenario)
    prefix = args.study or default_study_prefix(scenario, args.seed)
    passes = 2 if settings.space.hierarchical else 1  # + the flat search to compare with
    bar = ProgressBar(settings.trials * len(buckets) * passes, enabled=not args.quiet)
    t0 = time.monotonic()
    try:
        if args.workers > 0:
            results = _run_distributed(args, buckets, settings, scorer, scenario, prefix, bar)
        else:
            if args.storage:
                store = make_storage(args.storage, settings)
                for b in buckets:
                    name = study_name(prefix, b)
                    _check_same_scenario(open_study(store, name, b, settings), scenario, name)
            results = search(
                scorer.objective,
                buckets,
                settings,
                latency=scorer.latency,
                storage=args.storage,
                study_prefix=prefix,
                setup={"scenario": scenario.to_dict()},
                progress=bar.update,
            )
        if settings.space.hierarchical:
            results = _compare_flat(args, results, buckets, settings, scorer, scenario, bar)
    finally:
        bar.close()
    elapsed = time.monotonic() - t0
    provenance = {
        "spectune": __version__,
        "study": prefix,
        "storage": _redact(args.storage),
        "objective": scenario.objective,
        "trials": sum(r.trials for r in results),
        "trials_per_bucket": settings.trials,
        "seed": args.seed,
        "multi_objective": args.multi_objective,
        "workers": args.workers,
    }
    provenance.update(hierarchy_provenance(results))
    if scenario.calibration:
        provenance["calibration"] = (
            f"{scenario.calibration}: {load_calibration(scenario.calibration).source}"
        )
    profile = engine_option(scenario.engine)
    planned = None
    if profile.engine != "spectune":  # one configuration the engine runs, for every bucket
        limit = settings.max_latency_s
        planned = engine_plan(
            results, profile, scorer, min_gain=settings.min_gain, max_latency_s=limit
        )
        results = list(planned.results)
        provenance["engine_plan"] = planned.provenance()
    table = build_table(results, closed, scenario, provenance)
    print(
        f"spectune plan: {scenario.label}, objective {scenario.objective}, "
        f"{provenance['trials']} trials in {elapsed:.1f} s"
    )
    print_table(
        results,
        closed=closed,
        engine=scenario.engine,
        verbose=args.verbose,
        min_gain=settings.min_gain,
    )
    if planned is not None:
        print(planned.summary)
    table.save(args.out)
    print(f"wrote {args.out}")
    report(args, table, results, closed)
    return 0


def report(
    args: argparse.Namespace,
    table: PolicyTable,
    results: Sequence[BucketResult],
    closed: ClosedFormObjective,
) -> None:
    """What follows the table: the policy notation, the deployment per engine, --csv, --plot."""
    from spectune.cli import plan_report as pr

    print(pr.LEGEND)
    max_batch = max(b.batch[1] for b in table.buckets)
    weights = pr.batch_weights(args, max_batch, closed_workload(table))
    engines = pr.deploy_engines(table.scenario.engine)
    pr.print_deployments(
        pr.deployments(table, engines, weights), args.out, weights, sys.stdout, verbose=args.verbose
    )
    write_outputs(
        args,
        pr.csv_rows(results),
        pr.draw_plan(results),
        title=f"spectune plan: {table.scenario.label}",
        xlabel="batch size (geometric middle of the bucket)",
        ylabel=SERVED.label,
    )


def closed_workload(table: PolicyTable) -> Any:
    """The plan's resolved workload (for its batch-size distribution)."""
    return table.scenario.resolve().workload


def add_scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--target",
        default=DEFAULTS.target,
        help=f"target model preset or spec file (default {DEFAULTS.target})",
    )
    p.add_argument(
        "--drafter",
        default=DEFAULTS.drafter,
        help=f"drafter preset or spec file (default {DEFAULTS.drafter})",
    )
    p.add_argument(
        "--gpu",
        default=DEFAULTS.gpu,
        help=f"GPU preset or spec file (default {DEFAULTS.gpu})",
    )
    p.add_argument(
        "--workload",
        default=DEFAULTS.workload,
        help=f"workload preset or file (default {DEFAULTS.workload})",
    )
    p.add_argument(
        "--tp",
        type=int_range(1, 64),
        default=DEFAULTS.tp,
        help=f"tensor-parallel degree (default {DEFAULTS.tp})",
    )
    p.add_argument(
        "--engine",
        default=DEFAULTS.engine,
        help="serving engine to plan for: an engine profile (`spectune presets` lists sglang, "
        "vllm, vllm-0.11, trtllm, trtllm-1.4, trtllm-stage1) or a profile file. The search "
        "draws only what that engine runs, prices its host overheads, and compares with its "
        f"own default config (default {DEFAULTS.engine}: spectune's executor, every policy, "
        "measured overheads only)",
    )
    add_intermediate(p)
    add_strict(p)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="search the best tree policy per batch size and context; write policy.json",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_scenario_args(p)
    p.set_defaults(gpu=None)  # None: the calibration's GPU, else DEFAULTS.gpu
    p.add_argument(
        "--calibration",
        default=None,
        metavar="FILE",
        help="price with this fitted calibration (spectune calibrate; e.g. "
        "measurements/h200/calibration-h200.json); --gpu defaults to the GPU it was fitted on",
    )
    p.add_argument(
        "--out", default="policy.json", help="policy file to write (default policy.json)"
    )
    p.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=DEFAULTS.objective,
        help="closed-form steady state (default), or by simulation: goodput under the SLO, "
        "or throughput",
    )
    p.add_argument(
        "--slo-tpot-ms",
        type=float_range(0, 1e7, lo_open=True),
        default=None,
        help="TPOT SLO for --objective goodput (simulator default if unset)",
    )
    p.add_argument(
        "--slo-ttft-ms",
        type=float_range(0, 1e7, lo_open=True),
        default=None,
        help="TTFT SLO for --objective goodput (simulator default if unset)",
    )
    p.add_argument(
        "--trials",
        type=int_range(1, 100_000),
        default=SearchSettings.trials,
        help=f"complete trials per bucket study (default {SearchSettings.trials})",
    )
    p.add_argument("--seed", type=seed, default=0, help="sampler seed (default 0)")
    p.add_argument(
        "--min-gain",
        type=float_range(0, 10),
        default=SearchSettings.min_gain,
        help="keep off or an engine default unless a searched policy is predicted this fraction "
        f"faster, e.g. 0.05 = 5%% (default {SearchSettings.min_gain}: a margin for model error)",
    )
    p.add_argument(
        "--storage",
        default=os.environ.get(STORAGE_ENV) or None,
        help="Optuna storage: sqlite:///spectune.db or postgresql://USER:PW@HOST/DB "
        "(default: in memory; env SPECTUNE_STORAGE)",
    )
    p.add_argument(
        "--study",
        default=None,
        help="study name prefix (default: derived from the scenario and seed)",
    )
    p.add_argument(
        "--workers",
        type=int_range(0, 256),
        default=0,
        help="start N local worker processes on the storage (default 0: search here)",
    )
    p.add_argument(
        "--multi-objective",
        action="store_true",
        help="throughput vs step latency: keep the Pareto front per bucket",
    )
    p.add_argument(
        "--max-step-ms",
        type=float_range(0, 1e7, lo_open=True),
        default=None,
        help="with --multi-objective: pick the fastest-throughput policy under this step latency",
    )
    p.add_argument(
        "--batch-edges",
        type=ints(1, 1 << 16),
        default=list(DEFAULT_BATCH_EDGES),
        help="upper edges of batch buckets (default 1,2,4,...,256)",
    )
    p.add_argument(
        "--context-edges",
        type=ints(1, 1 << 24),
        default=list(DEFAULT_CONTEXT_EDGES),
        help="upper edges of context buckets (default 4096,16384,32768)",
    )
    p.add_argument(
        "--heartbeat-s",
        type=int_range(1, 3600),
        default=SearchSettings.heartbeat_s,
        help="worker heartbeat for shared storages, seconds (default 5)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--verbose",
        action="store_true",
        help="every note under its row, every export approximation and the per-batch "
        "predictions (default: one line per kind of note)",
    )
    from spectune.cli.plan_report import batch_weights_type

    p.add_argument(
        "--batch-weights",
        type=batch_weights_type,
        default=None,
        metavar="B:W,...",
        help="batch-size distribution the deployment gains are weighted by, as share of "
        "serving time per batch size, e.g. 1:0.2,8:0.5,64:0.3 (normalised; default: the "
        "workload's, else equal weights on 1, 2, 4, ... up to the largest batch edge)",
    )
    add_csv_plot(p, "the plan's table (served tok/s per bucket)")
    p.set_defaults(func=run)
