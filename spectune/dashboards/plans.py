"""Policy tables for the Planner page, without any UI: a plan searched here (planner.search
with the closed-form objective `spectune plan` scores with), one read back from its stored
Optuna studies, or one loaded from a policy file; the Scenario each was planned for, its rows,
Pareto fronts and engine exports (the files `spectune export` writes).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spectune.dashboards.data import objective_for, policy_label, trace_label
from spectune.dashboards.uploads import is_kept_upload
from spectune.planner.buckets import buckets_from_edges
from spectune.planner.export import ENGINES, Export, export_table
from spectune.planner.search import BucketResult, SearchSettings, search
from spectune.specs import (
    PolicyTable,
    Scenario,
    SpecError,
    load_hardware,
    load_model,
    load_workload,
)
from spectune.specs.calibration import Calibration
from spectune.specs.io import names_a_file

# ---- planning -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """A searched (or loaded) policy table with the search's per-bucket results."""

    table: PolicyTable
    results: tuple[BucketResult, ...] = ()
    multi_objective: bool = False
    provenance: Mapping[str, Any] = field(default_factory=dict)


def run_plan(
    scenario: Scenario,
    *,
    batch_edges: Sequence[int],
    context_edges: Sequence[int],
    trials: int,
    seed: int = 0,
    multi_objective: bool = False,
    max_step_ms: float | None = None,
    trace: str = "",
) -> Plan:
    """`spectune plan` in process with the closed-form objective it scores with (the same
    predicted tokens/s for the same scenario and settings): one Optuna study per bucket.
    `trace`: an uploaded acceptance trace in place of the workload's acceptance."""
    import optuna

    from spectune import __version__
    from spectune.planner.table import build_table

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # as `spectune plan` does
    scenario = scenario.replace(objective="closed-form")
    obj = objective_for(scenario, trace)
    settings = SearchSettings(
        trials=trials,
        seed=seed,
        multi_objective=multi_objective,
        max_latency_s=None if max_step_ms is None else max_step_ms / 1e3,
    )
    buckets = buckets_from_edges(batch_edges, context_edges)
    results = search(obj, buckets, settings, latency=obj.step_latency if multi_objective else None)
    provenance: dict[str, Any] = {
        "spectune": __version__,
        "study": "dashboard",
        "storage": "memory",
        "objective": "closed-form",
        "trials": sum(r.trials for r in results),
        "trials_per_bucket": trials,
        "seed": seed,
        "multi_objective": multi_objective,
    }
    if trace:
        provenance["acceptance"] = f"trace {trace_label(trace)}"
    table = build_table(results, obj, scenario, provenance)
    return Plan(table, tuple(results), multi_objective, provenance)


_STUDY_NAME = re.compile(r"^(.*)\.b\d+-\d+\.c\d+-\d+$")


def _open_storage(storage_url: str) -> Any:
    """planner.search.make_storage, but never creating an SQLite file that is not there."""
    from pathlib import Path

    from spectune.planner.search import make_storage

    if storage_url.startswith("sqlite:///"):
        path = Path(storage_url[len("sqlite:///") :])
        if not path.is_file():
            raise SpecError(f"{path}: no such SQLite file")
    return make_storage(storage_url)


def study_prefixes(storage_url: str) -> list[str]:
    """The plans (study-name prefixes) of spectune bucket studies in an Optuna storage."""
    import optuna

    store = _open_storage(storage_url)
    names = [s.study_name for s in optuna.get_all_study_summaries(store, include_best_trial=False)]
    return sorted({m.group(1) for n in names if (m := _STUDY_NAME.match(n))})


def load_study_plan(storage_url: str, prefix: str) -> Plan:
    """A plan read back from its Optuna studies (`spectune plan --storage URL`): each bucket's
    policy chosen by the planner's own rule (planner.search.choose) from the trials stored, then
    made into the one configuration the scenario's engine runs (planner.engine_plan) as
    `spectune plan --engine` does, the Pareto front when the studies are multi-objective."""
    import optuna

    from spectune.planner.engine_plan import engine_plan
    from spectune.planner.search import bucket_studies, choose, settings_from_dict
    from spectune.planner.table import build_table
    from spectune.simulator.scoring import build_scorer
    from spectune.specs.engine import load_engine

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    store = _open_storage(storage_url)
    studies = bucket_studies(store, prefix)
    recorded = studies[0][2].get("scenario")
    if not isinstance(recorded, Mapping):
        raise SpecError(
            f"studies {prefix}.* record no scenario; were they written by spectune plan?"
        )
    scenario = Scenario.from_dict(recorded, f"studies {prefix}.*: scenario")
    scorer, closed = build_scorer(scenario)
    results = []
    multi = False
    for name, bucket, setup in studies:
        settings = settings_from_dict(setup["settings"])
        multi = multi or settings.multi_objective
        study = optuna.load_study(study_name=name, storage=store)
        results.append(choose(study, bucket, scorer, settings))
    profile = load_engine(scenario.engine)
    if profile.engine != "spectune":  # what `spectune plan --engine` writes: one engine config
        min_gain = settings_from_dict(studies[0][2]["settings"]).min_gain
        results = list(engine_plan(results, profile, scorer, min_gain=min_gain).results)
    provenance = {"study": prefix, "storage": storage_url.split("@")[-1],
                  "trials": sum(r.trials for r in results), "multi_objective": multi}  # fmt: skip
    table = build_table(results, closed, scenario, provenance)
    return Plan(table, tuple(results), multi, provenance)


def table_rows(table: PolicyTable) -> list[dict[str, Any]]:
    """The policy table, one row per bucket, as the Planner page lists it."""
    rows = []
    for b in table.buckets:
        p = b.policy
        rows.append(
            {
                "batch": f"{b.batch[0]}-{b.batch[1]}",
                "context": f"{b.context[0]}-{b.context[1]}",
                "policy": policy_label(p),
                "builder": p.builder if p else "off",
                "depth": p.depth if p else 0,
                "topk": p.topk if p else 0,
                "budget": p.budget if p else 0,
                "prune_threshold": p.prune_threshold if p else 0.0,
                "graft_budget": p.graft_budget if p else 0,
                "shared_budget": p.shared_budget if p else False,
                "tokens_per_s": b.predicted.tokens_per_s if b.predicted else float("nan"),
                "speedup": b.predicted.speedup if b.predicted else float("nan"),
                "accepted_len": b.predicted.accepted_len if b.predicted else float("nan"),
            }
        )
    return rows


def pareto_rows(results: Sequence[BucketResult]) -> list[dict[str, Any]]:
    """Each bucket's Pareto front (throughput vs step latency), distinct points only."""
    rows = []
    for r in results:
        seen = set()
        for q in r.pareto:
            key = (q.policy, round(q.tokens_per_s, 6), round(q.latency_s, 12))
            if key in seen:
                continue
            seen.add(key)
            rows.append(
                {
                    "bucket": r.bucket.name,
                    "policy": policy_label(q.policy),
                    "tokens_per_s": q.tokens_per_s,
                    "step_ms": q.latency_s * 1e3,
                    "chosen": q.policy == r.policy,
                }
            )
    return rows


def chosen_points(
    results: Sequence[BucketResult], scenario: Scenario, trace: str = ""
) -> list[dict[str, Any]]:
    """Each bucket's chosen policy on the throughput / latency plane: its tokens/s (geometric
    mean over the bucket's points, as the search scores) and the search's latency, the longest
    closed-form step over those points."""
    obj = objective_for(scenario, trace)
    return [
        {
            "bucket": r.bucket.name,
            "policy": policy_label(r.policy),
            "tokens_per_s": r.tokens_per_s,
            "step_ms": max(obj.step_latency(r.policy, b, c) for b, c in r.bucket.points()) * 1e3,
        }
        for r in results
        if r.pareto
    ]


def scenario_for_table(table: PolicyTable, fallback: Scenario) -> tuple[Scenario, str]:
    """The Scenario a policy table was planned for (PolicyTable.scenario). A spec it names
    that cannot be loaded here (a file on another machine; an old file without a workload) is
    replaced by the fallback's (the sidebar's), and the note says which; '' when none was."""
    scenario = table.scenario
    notes = []
    checks = (
        ("target", "target", load_model),
        ("drafter", "drafter", load_model),
        ("gpu", "GPU", load_hardware),
        ("workload", "workload", load_workload),
        ("calibration", "calibration", Calibration.load),
    )
    for name, kind, load in checks:
        value = getattr(scenario, name)
        if not value or (name == "drafter" and not scenario.has_drafter):
            if name == "workload":
                notes.append(f"the table names no workload; using {fallback.workload}")
                scenario = scenario.replace(workload=fallback.workload)
            continue
        if names_a_file(str(value)) and not is_kept_upload(str(value)):
            # never open a path a table (an upload) names on this server
            replacement = getattr(fallback, name) if name != "calibration" else None
            notes.append(f"{kind} {value!r} names a file on this server; using {replacement}")
            scenario = scenario.replace(**{name: replacement})
            continue
        try:
            load(value)
        except (SpecError, OSError) as e:
            replacement = getattr(fallback, name) if name != "calibration" else None
            notes.append(f"{kind} {value!r} cannot be loaded here ({e}); using {replacement}")
            scenario = scenario.replace(**{name: replacement})
    return scenario, "; ".join(notes)


def scenario_changes(planned: Scenario, sidebar: Scenario) -> str:
    """How the sidebar's scenario differs from a table's ('' when it does not), as a page
    says it: 'gpu h200 (table) vs h100-sxm (sidebar), ...'. The objective and SLOs are how
    a table was searched, not what it predicts for, so they are left out."""
    scored = ("objective", "slo_tpot_ms", "slo_ttft_ms")
    return ", ".join(
        f"{name} {mine} (table) vs {theirs} (sidebar)"
        for name, mine, theirs in planned.changes(sidebar)
        if name not in scored
    )


def engine_exports(table: PolicyTable) -> tuple[dict[str, Export | str], str]:
    """Every engine's export of a table, or the reason it failed, exactly as `spectune export`
    writes it (planner.export.export_table with the table's Scenario); and a note when the
    table's objective could not be built ('' otherwise)."""
    out: dict[str, Export | str] = {}
    note = ""
    for engine in ENGINES:
        try:
            out[engine], note = export_table(table, engine)
        except SpecError as e:
            out[engine] = str(e)
    return out, note
