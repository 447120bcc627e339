"""`spectune check`: re-predict every committed measurement with the current cost model (CPU only).

For each measurement document (schema spectune.measurement/v1) in a folder, the calibration
committed beside it for the same GPU (a spectune.calibration/v1 file whose `hardware` matches;
none: the cost model's defaults) configures CostModel(hardware, target, drafter, tp), tp being
the document's (the GPUs the executor split the target over; 1 when absent). Per run:
- verify latency: CostModel.verify_time(batch, tree tokens, context) vs the measured verify phase
  (and the baseline's verify at 1 token); for a pruned policy the tree tokens are the measured
  mean verified per sequence (`verified_mean`; also for shared-budget and grafted trees), or,
  in a document without it, the planner's mean kept tokens (ClosedFormObjective.tree_tokens
  for the document's workload), with their spread over the batch's requests (`verified_cv`,
  else the planner's: a ragged verify pads each request's rows to its launch's tile);
- speedup: predicted = tokens_per_step_measured / CostModel.iteration(policy, batch, context,
  tokens=tree tokens).total_s x CostModel.iteration(None, batch, context).total_s vs the
  measured speedup. The iteration charges everything the policy has (a pruned policy its
  pruning pass, ragged packing and host read: Calibration.prune_step_s), and its draft extend
  runs over depth + 1 tokens (its default) because the executor pads it so (graph-captured, as
  engines do; a grafting run pads it further, to depth + its longest chain: the document's
  `extend_tokens`). The measured accepted length is used on both sides, so the check tests the
  timing model (acceptance is checked separately, against the acceptance model, by the
  executor's tests).
Calibration-run documents (spectune.calibration-run/v1) add their verify grids to the MAPE,
and their speculative runs (`spec_runs`) are checked like a measurement's runs.

Engine measurement documents (spectune.engine-measurement/v1: parsed engine output, published
figures) are predicted with the engine's profile (the preset named by the document's engine,
or a fitted profile passed per engine): per point, tokens/s = batch x accept length /
CostModel.iteration(...).total_s, the iteration including the engine's host time
(validate.engine_points, validate.engine_fit.predict), at the document's accept length where it
has one (else the workload's acceptance model's); and, where an accept length was measured,
the acceptance model's prediction of it. Points the cost model cannot price (a GPU or model
without a preset, no throughput figure) are listed as skipped, with the reason; a document that
states a `known_miss` (the cause spectune cannot model) is predicted and shown, not gated.

The gate fails (exit 1) when any run's speedup differs by more than `speedup_tol` (10%), the
verify-latency MAPE exceeds `mape_tol` (10%), or an engine's tokens/s MAPE exceeds
`engine_tol` (ENGINE_TOL) or its accept-length MAPE `accept_tol` (ACCEPT_TOL). Nothing here
imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spectune.specs import SpecError, TreePolicy, load_hardware, load_model
from spectune.specs.calibration import SCHEMA as CALIBRATION_SCHEMA
from spectune.specs.calibration import Calibration
from spectune.specs.io import loads_json, read_bytes_bounded
from spectune.validate.measure import (
    RUN_SCHEMA,
    doc_tp,
    planned_objective,
    run_draft_widths,
    spec_run_measurements,
    validate_document,
)

if TYPE_CHECKING:
    from spectune.planner.costmodel import CostModel
    from spectune.planner.step import StepBreakdown
    from spectune.specs.engine import EngineProfile

MEASUREMENT_SCHEMA = "spectune.measurement/v1"
ENGINE_TOL = 0.10
"""Largest per-engine tokens/s MAPE: the leave-one-source-out goal of the engine fit
(benchmarks/bench_engine_fit.py)."""
ACCEPT_TOL = 0.15
"""Largest per-engine accept-length MAPE: the acceptance presets' own tolerance band for a
pair or dataset they were not fitted to (traces.published)."""


@dataclass
class EngineRow:
    """One engine-measured figure against its prediction."""

    file: str
    engine: str
    what: str
    quantity: str  # "tokens_per_s" or "accept_length"
    predicted: float
    measured: float
    note: str = ""
    gated: bool = True  # False: a document with a stated known miss (reported, not gated)

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


@dataclass
class Row:
    file: str
    what: str
    predicted: float
    measured: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1.0


@dataclass
class CheckResult:
    verify: list[Row] = field(default_factory=list)
    speedup: list[Row] = field(default_factory=list)
    engine: list[EngineRow] = field(default_factory=list)
    engine_skipped: list[tuple[str, str]] = field(default_factory=list)  # (where, why)
    # (plan, measurement, calibration run, {key: (run's choice, measurement's)}): GEMM variants
    # ("gemm_plan") or tree-attention launches ("attention_plan") a measurement ran other than
    # those of the calibration run beside it (plan_differences)
    plan_notes: list[tuple[str, str, str, dict[str, tuple[str, str]]]] = field(default_factory=list)
    files: int = 0

    @property
    def verify_mape(self) -> float:
        return sum(abs(r.error) for r in self.verify) / max(len(self.verify), 1)

    @property
    def worst_speedup_error(self) -> float:
        return max((abs(r.error) for r in self.speedup), default=0.0)

    def engine_mape(self) -> dict[tuple[str, str], tuple[float, int]]:
        """(engine, quantity) -> (MAPE, points) over the gated rows."""
        groups: dict[tuple[str, str], list[float]] = {}
        for r in self.engine:
            if not r.gated:
                continue
            groups.setdefault((r.engine, r.quantity), []).append(abs(r.error))
        return {k: (sum(v) / len(v), len(v)) for k, v in sorted(groups.items())}

    def passed(
        self,
        speedup_tol: float,
        mape_tol: float,
        engine_tol: float = ENGINE_TOL,
        accept_tol: float = ACCEPT_TOL,
    ) -> bool:
        errors = [r.error for r in (*self.verify, *self.speedup)]
        errors += [r.error for r in self.engine if r.gated]
        finite = all(math.isfinite(e) for e in errors)
        engines = all(
            m <= (engine_tol if q == "tokens_per_s" else accept_tol)
            for (_, q), (m, _) in self.engine_mape().items()
        )
        return (
            finite
            and engines
            and self.worst_speedup_error <= speedup_tol
            and self.verify_mape <= mape_tol
        )


def _load(path: Path) -> dict[str, Any] | None:
    data = loads_json(read_bytes_bounded(path), str(path))  # bounded; NaN and inf rejected
    return data if isinstance(data, dict) else None


def calibrations_in(folder: Path) -> dict[str, Calibration]:
    """hardware name -> Calibration, from the spectune.calibration/v1 files of a folder."""
    out: dict[str, Calibration] = {}
    for p in sorted(folder.glob("*.json")):
        data = _load(p)
        if data and data.get("schema") == CALIBRATION_SCHEMA:
            cal = Calibration.load(p)
            if cal.hardware in out:
                raise SpecError(f"{folder}: two calibrations for {cal.hardware!r}")
            out[cal.hardware] = cal
    return out


def check_folder(
    folder: str | Path, engine_profiles: Mapping[str, EngineProfile] | None = None
) -> CheckResult:
    """Re-predict every measurement, calibration run and engine measurement under `folder`
    (recursively, grouped by the folder each file sits in). `engine_profiles`: engine family
    (sglang, vllm, trtllm) -> the profile its documents are predicted with (default: the
    preset of that name)."""
    from spectune.planner.costmodel import CostModel
    from spectune.validate.engine_measure import SCHEMA as ENGINE_SCHEMA

    root = Path(folder)
    if not root.is_dir():
        raise SpecError(f"{root}: no such folder")
    res = CheckResult()
    dirs = sorted({p.parent for p in root.rglob("*.json")})
    for d in dirs:
        cals = calibrations_in(d)
        # plan field -> file -> (calibration run?, plan)
        plans: dict[str, dict[str, tuple[bool, dict[str, str]]]] = {k: {} for k in PLAN_FIELDS}
        for p in sorted(d.glob("*.json")):
            data = _load(p)
            if data and data.get("schema") == ENGINE_SCHEMA:
                _check_engine(data, p, str(p.relative_to(root)), engine_profiles or {}, res)
                res.files += 1
                continue
            if not data or data.get("schema") not in (MEASUREMENT_SCHEMA, RUN_SCHEMA):
                continue
            validate_document(data, str(p))
            res.files += 1
            hw = load_hardware(data["hardware"])
            cm = CostModel(
                hw,
                load_model(data["target"]),
                load_model(data["drafter"]),
                tp=doc_tp(data, str(p)),
                calibration=cals.get(hw.name),
            )
            name = str(p.relative_to(root))
            for kind in PLAN_FIELDS:
                if data.get(kind):
                    plans[kind][name] = (data["schema"] == RUN_SCHEMA, data[kind])
            if data["schema"] == RUN_SCHEMA:
                for r in data.get("verify", []):
                    pred = _scalar(cm.verify_time(r["batch"], r["tokens"], r["context"]))
                    res.verify.append(
                        Row(
                            name,
                            f"verify B={r['batch']} N={r['tokens']} C={r['context']}",
                            pred,
                            r["seconds"],
                        )
                    )
                for m in spec_run_measurements(data):  # spectune calibrate's own spec runs
                    _check_measurement(cm, m, name, res)
                continue
            _check_measurement(cm, data, name, res)
        for kind in PLAN_FIELDS:
            res.plan_notes.extend((kind, *d) for d in plan_differences(plans[kind]))
    if res.files == 0:
        raise SpecError(f"{root}: no measurement or calibration-run JSON files")
    return res


#: the documents' records of the kernels their process chose (specs.kernel_plan)
PLAN_FIELDS = ("gemm_plan", "attention_plan")


def plan_differences(
    plans: Mapping[str, tuple[bool, Mapping[str, str]]],
) -> list[tuple[str, str, dict[str, tuple[str, str]]]]:
    """For each measurement of a folder (file -> (is a calibration run, its plan: gemm_plan or
    attention_plan)) beside exactly one calibration run: the entries both record with
    different choices, {key: (run's, measurement's)}; entries only one records (other shapes,
    e.g. a tp shard's) are not compared. Tuned in two processes, kernels tied within a few
    percent can differ, and then the measurement did not run the kernels the calibration was
    fitted on (`spectune execute --gemm-plan` pins the GEMMs)."""
    runs = [(name, plan) for name, (is_run, plan) in plans.items() if is_run]
    if len(runs) != 1:
        return []
    run_name, run_plan = runs[0]
    out = []
    for name, (is_run, plan) in plans.items():
        if is_run:
            continue
        diff = {k: (run_plan[k], v) for k, v in sorted(plan.items()) if run_plan.get(k, v) != v}
        if diff:
            out.append((name, run_name, diff))
    return out


def _check_measurement(cm: Any, doc: dict[str, Any], name: str, res: CheckResult) -> None:
    from spectune.validate.measure import validate_measurement

    validate_measurement(doc, name)
    c = doc["context"]
    seen_ar: set[int] = set()
    planned: dict[str, Any] = {}  # the planner's objective, built once if a run needs it
    for r in doc["runs"]:
        b, pol, ph = r["batch"], r["policy"], r["phases_ms"]
        ar_pred = _scalar(cm.iteration(None, b, c).total_s)
        if "ar_phases_ms" in r and b not in seen_ar:
            seen_ar.add(b)
            res.verify.append(
                Row(
                    name,
                    f"verify B={b} N=1 C={c} (baseline)",
                    _scalar(cm.verify_time(b, 1, c)),
                    r["ar_phases_ms"]["verify"] / 1e3,
                )
            )
        if pol is None:
            continue
        step, n = price_run(cm, doc, r, planned)
        label = f"B={b} {r['label']} {pol['depth']}/{pol['topk']}/{pol['budget']}"
        if pol.get("prune_threshold", 0.0) > 0:
            label += f"/p{pol['prune_threshold']:g}"
        res.verify.append(
            Row(name, f"verify {label} N={n:g}", _scalar(step.verify_s), ph["verify"] / 1e3)
        )
        spec_pred = _scalar(step.total_s)
        pred_speedup = r["tokens_per_step"] / spec_pred * ar_pred
        res.speedup.append(Row(name, f"speedup {label}", pred_speedup, r["speedup"]))


def price_run(
    cm: CostModel, doc: dict[str, Any], run: dict[str, Any], planned: dict[str, Any]
) -> tuple[StepBreakdown, float]:
    """(the StepBreakdown, the tree tokens per sequence) a measured speculative run of `doc`
    is predicted with: its policy at its batch and the document's context, over the tokens it
    verified (_tree_tokens), its padded draft extend (`extend_tokens`) and its trees' spread
    (_tree_spread). `planned`: a per-document cache of the planner's objective (an empty dict
    on the document's first run). A static run drafts its shape's nodes per level
    (measure.run_draft_widths)."""
    n = _tree_tokens(doc, run, planned)
    step = cm.iteration(
        TreePolicy(**run["policy"]),
        run["batch"],
        doc["context"],
        tokens=n,
        accepted=run.get("extend_tokens"),
        tokens_cv=_tree_spread(doc, run, planned),
        draft_widths=run_draft_widths(doc, run, planned),
    )
    return step, n


def _check_engine(
    doc: dict[str, Any],
    path: Path,
    name: str,
    profiles: Mapping[str, EngineProfile],
    res: CheckResult,
) -> None:
    """Predict one engine measurement document's throughput and accept lengths."""
    from spectune.specs.engine import engine_preset
    from spectune.validate.engine_fit import predict
    from spectune.validate.engine_measure import validate_engine_measurement
    from spectune.validate.engine_points import points_from_document, predicted_accept_length

    validate_engine_measurement(doc, str(path))
    engine = doc["engine"]
    profile = profiles.get(engine) or engine_preset(engine)
    points, skipped = points_from_document(doc, name, profile)
    res.engine_skipped += [(s.where, s.reason) for s in skipped]
    gated = "known_miss" not in doc
    for r, p in zip(predict(points, profile.overheads), points, strict=True):
        note = "" if p.accept_measured else "accept length predicted"
        if not gated:
            note = "known miss, not gated: " + doc["known_miss"][:60] + "..."
        res.engine.append(
            EngineRow(
                name,
                engine,
                p.label,
                "tokens_per_s",
                r.predicted_tokens_per_s,
                r.measured_tokens_per_s,
                note,
                gated,
            )
        )
        pol = p.policy
        if pol is not None and p.accept_measured:
            target, drafter = load_model(p.target), load_model(p.drafter) if p.drafter else None
            al = predicted_accept_length(pol, p.workload, target, drafter)
            res.engine.append(
                EngineRow(name, engine, p.label, "accept_length", al, p.accept_length, "", gated)
            )


def _tree_tokens(doc: dict[str, Any], run: dict[str, Any], planned: dict[str, Any]) -> float:
    """Tokens a run verified per sequence: its tree slots (a dense verify), or for a ragged one
    (pruned, or ECHO's shared budget above batch 1) the measured mean `verified_mean` (else,
    in a document without it, the planner's tree_tokens for the document's workload)."""
    pol = run["policy"]
    shared = bool(pol.get("shared_budget")) and run["batch"] > 1
    if pol.get("prune_threshold", 0.0) <= 0 and not shared:
        return float(run["nodes"])
    if run.get("verified_mean") is not None:
        return float(run["verified_mean"])
    obj = planned_objective(doc, planned)
    if obj is None:
        raise SpecError(
            "a pruned run without 'verified_mean' needs the document's workload (a preset or "
            f"spec file the planner can build), got {doc.get('workload')!r}"
        )
    return float(obj.tree_tokens(TreePolicy(**pol)))


def _tree_spread(doc: dict[str, Any], run: dict[str, Any], planned: dict[str, Any]) -> float | None:
    """Spread (std / mean) of a ragged run's per-request verified tokens (a shared-budget run
    above batch 1, or a pruned run): the measured `verified_cv`, else the planner's for the
    document's workload (ClosedFormObjective.tree_spread), else None (a workload the planner
    cannot build, e.g. a recorded trace: the cost model's default, costmodel.SHARED_TREE_CV
    for a shared budget, every step at the mean for pruned trees). None for other runs (the
    cost model prices them at their mean)."""
    pol = run["policy"]
    pruned = pol.get("prune_threshold", 0.0) > 0
    if not ((bool(pol.get("shared_budget")) or pruned) and run["batch"] > 1):
        return None
    if run.get("verified_cv") is not None:
        return float(run["verified_cv"])
    obj = planned_objective(doc, planned)
    return None if obj is None else float(obj.tree_spread(TreePolicy(**pol), run["batch"]))


def format_check(
    res: CheckResult,
    speedup_tol: float,
    mape_tol: float,
    engine_tol: float = ENGINE_TOL,
    accept_tol: float = ACCEPT_TOL,
) -> str:
    lines = [f"{'file':<36} {'what':<44} {'predicted':>10} {'measured':>10} {'error':>7}"]
    for r in res.verify:
        lines.append(
            f"{r.file:<36.36} {r.what:<44.44} {r.predicted * 1e3:>8.3f}ms {r.measured * 1e3:>8.3f}ms {r.error:>+7.1%}"
        )
    for r in res.speedup:
        flag = "  FAIL" if abs(r.error) > speedup_tol else ""
        lines.append(
            f"{r.file:<36.36} {r.what:<44.44} {r.predicted:>9.3f}x {r.measured:>9.3f}x {r.error:>+7.1%}{flag}"
        )
    for e in res.engine:
        if e.quantity == "tokens_per_s":
            pred, meas = f"{e.predicted:>7.1f}tok/s", f"{e.measured:>7.1f}tok/s"
        else:
            pred, meas = f"{e.predicted:>6.2f} acc.len", f"{e.measured:>6.2f} acc.len"
        note = f"  ({e.note})" if e.note else ""
        lines.append(f"{e.file:<36.36} {e.what:<44.44} {pred} {meas} {e.error:>+7.1%}{note}")
    for where, why in res.engine_skipped:
        lines.append(f"skipped {where}: {why}")
    for kind, name, run_name, diff in res.plan_notes:
        shown = ", ".join(f"{k} {a} -> {b}" for k, (a, b) in list(diff.items())[:4])
        more = f" and {len(diff) - 4} more" if len(diff) > 4 else ""
        what, pin = (
            (
                "GEMM variant(s)",
                f" (spectune execute --gemm-plan {Path(run_name).name} runs the calibration's)",
            )
            if kind == "gemm_plan"
            else ("tree-attention launch(es)", "")
        )
        lines.append(
            f"note: {name} ran {len(diff)} {what} other than {run_name}'s, whose timings the "
            f"calibration was fitted on: {shown}{more}{pin}"
        )
    for (eng, q), (m, n) in res.engine_mape().items():
        tol = engine_tol if q == "tokens_per_s" else accept_tol
        flag = "" if m <= tol else "  FAIL"
        lines.append(f"engine {eng}: {q} MAPE {m:.1%} over {n} points (limit {tol:.0%}){flag}")
    verdict = "PASS" if res.passed(speedup_tol, mape_tol, engine_tol, accept_tol) else "FAIL"
    lines.append(
        f"{verdict}: {res.files} files; verify-latency MAPE {res.verify_mape:.1%} over {len(res.verify)} "
        f"(limit {mape_tol:.0%}); worst speedup error {res.worst_speedup_error:.1%} over "
        f"{len(res.speedup)} runs (limit {speedup_tol:.0%})"
    )
    return "\n".join(lines)


def _scalar(x: object) -> float:
    """The one value of a cost-model result (a 0-d or 1-element array)."""
    import numpy as np

    return float(np.asarray(x, dtype=np.float64).reshape(-1)[0])
