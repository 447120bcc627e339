"""`spectune execute`: run policies on the GPU and write the measurement JSON.

For each batch size: the baseline (speculation off) and the policy the table gives for
(batch, context), each timed per phase over many steps after warm-up. One target, drafter and
KV cache serve every run (allocated once at the largest batch), so an 8B run fits on one GPU.

Measurement JSON (schema spectune.measurement/v1; spectune.validate.check reads it without torch):
    {"schema", "gpu": device name, "hardware": HardwareSpec preset, "target", "drafter",
     "workload", "context", "steps", "attention": backend, "created",
     "runs": [{"batch", "label", "policy": TreePolicy dict | null, "nodes": tree slots,
               "verified_mean": tokens verified per sequence per step, root included (= nodes
               unless the policy prunes; optional in older documents),
               "verified_cv": spread (std / mean over the batch's requests) of the tokens
               verified per sequence, mean over steps (0 for equal trees; optional),
               "phases_ms": {draft, tree, verify, accept, compact, extend, overhead, step},
               "accepted_mean": accepted draft tokens per step, "tokens_per_step",
               "tokens_per_s", "ar_step_ms", "ar_tokens_per_s", "speedup",
               "extend_tokens": tokens per sequence of the (padded) draft extend (optional;
               absent: depth + 1),
               "draft_widths": tokens per sequence of each drafting step after the first,
               a static shape's drafted nodes per level (static runs; optional),
               "repeats": {"tokens_per_s": [...], "tokens_per_step": [...], "step_ms": [...]}
               and "spread": {"tokens_per_s_rel": sample std / mean, ...} (optional: runs
               measured more than once; the run's figures are then the repeats' means),
               "gpu_state", "ar_gpu_state": the SM clock (median, lowest; MHz), power (W), its
               enforced limit and the share of samples at it, while the run / its baseline
               was timed (executor.gpu_state; optional: NVML present)}],
     "attention_plan": the tree-attention launch the process tuned per verify shape,
               {"B<b>xN<n>xC<c>": launch} (specs.kernel_plan; optional),
     "gemm_plan": the GEMM variant the process ran per weight shape and token bucket,
               {"NxK@M[+silu]": variant} (specs.kernel_plan; optional: a GPU run's plan, autotuned
               or pinned with `spectune execute --gemm-plan`; calibration-run documents carry
               it too),
     "gemm_plan_seconds": the seconds the autotune timed each planned variant at, alone,
               {"NxK@M[+silu]": seconds} (specs.kernel_plan; optional: the entries it timed)}
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from spectune.specs import SpecError, TreePolicy
from spectune.specs.io import from_mapping
from spectune.specs.kernel_plan import check_attention_plan, check_plan_seconds, parse_plan
from spectune.specs.policy import MAX_DEPTH

SCHEMA = "spectune.measurement/v1"
#: how far a verify row's kernel time by class (linear_s + attention_s, a mean over profiled
#: calls) may exceed its timed median seconds before the row is refused
CLASS_SLACK = 1.1
PHASE_KEYS = ("draft", "tree", "verify", "accept", "compact", "extend", "overhead", "step")


def gpu_hardware_name(device_name: str) -> str:
    """The HardwareSpec preset of a CUDA device name ('NVIDIA H100 80GB HBM3' -> 'h100-sxm')."""
    low = device_name.lower()
    for key, preset in (
        ("h200", "h200"),
        ("h100", "h100-sxm"),
        ("a100", "a100-80g"),
        ("l40s", "l40s"),
    ):
        if key in low:
            return preset
    raise SpecError(f"no hardware preset for GPU {device_name!r}; pass --hardware")


@dataclass(frozen=True)
class RunSpec:
    """One measured configuration: a batch size and its policy (None: speculation off)."""

    batch: int
    policy: TreePolicy | None
    label: str


def _rel_std(values: Sequence[float]) -> float:
    """Sample standard deviation / mean (0 for fewer than two values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return math.sqrt(var) / mean if mean else 0.0


def run_record(spec: RunSpec, spec_res: Any, ar_res: Any) -> dict[str, Any]:
    """One entry of "runs" from a spec PhaseResult, or a list of repeats of one (None when off),
    and the baseline PhaseResult. Repeats: phases are the means of the repeats' medians,
    accepted and verified lengths the means over every timed step, and the entry holds each
    repeat's figures and their relative spread."""
    repeats: list[Any] = []
    if isinstance(spec_res, list | tuple):
        repeats = list(spec_res)
        spec_res = repeats[0] if len(repeats) == 1 else _pooled(repeats)
    ar_ms = ar_res.phases_s["step"] * 1e3
    ar_tps = spec.batch / ar_res.phases_s["step"]
    if spec_res is None:
        phases = {k: 0.0 for k in PHASE_KEYS}
        phases["verify"] = ar_res.phases_s["verify"] * 1e3
        phases["overhead"] = ar_res.phases_s["overhead"] * 1e3
        phases["step"] = ar_ms
        acc, tps, nodes, verified, spread = 0.0, ar_tps, 1, 1.0, 0.0
    else:
        phases = {k: spec_res.phases_s.get(k, 0.0) * 1e3 for k in PHASE_KEYS}
        acc = spec_res.tokens_per_step - 1.0
        tps = spec_res.tokens_per_s
        nodes = spec_res.nodes
        verified = float(getattr(spec_res, "verified_mean", nodes))
        spread = float(getattr(spec_res, "verified_cv", 0.0))
    return {
        "batch": spec.batch,
        "label": spec.label,
        "policy": dataclasses.asdict(spec.policy) if spec.policy else None,
        "nodes": nodes,
        "verified_mean": verified,
        "verified_cv": spread,
        "phases_ms": phases,
        "accepted_mean": acc,
        "tokens_per_step": acc + 1.0,
        "tokens_per_s": tps,
        "ar_step_ms": ar_ms,
        "ar_phases_ms": {
            "verify": ar_res.phases_s["verify"] * 1e3,
            "overhead": ar_res.phases_s["overhead"] * 1e3,
        },
        "ar_tokens_per_s": ar_tps,
        "speedup": tps / ar_tps,
        **_extras(spec_res, repeats),
    }


def _pooled(repeats: Sequence[Any]) -> Any:
    """One PhaseResult-like record of several repeats of one run (see run_record)."""
    first = repeats[0]
    keys = first.phases_s.keys()
    phases = {k: sum(r.phases_s[k] for r in repeats) / len(repeats) for k in keys}
    return dataclasses.replace(
        first,
        phases_s=phases,
        accepted=[a for r in repeats for a in r.accepted],
        verified=[v for r in repeats for v in r.verified],
        spread=[v for r in repeats for v in getattr(r, "spread", [])],
    )


def _extras(res: Any, repeats: Sequence[Any]) -> dict[str, Any]:
    """extend_tokens (when known) and, for repeated runs, the repeats and their spread."""
    out: dict[str, Any] = {}
    if res is not None and getattr(res, "extend_tokens", None):
        out["extend_tokens"] = int(res.extend_tokens)
    if res is not None and getattr(res, "draft_widths", None) is not None:
        out["draft_widths"] = [int(w) for w in res.draft_widths]
    if len(repeats) > 1:
        tps = [float(r.tokens_per_s) for r in repeats]
        per_step = [float(r.tokens_per_step) for r in repeats]
        step_ms = [float(r.phases_s["step"]) * 1e3 for r in repeats]
        out["repeats"] = {"tokens_per_s": tps, "tokens_per_step": per_step, "step_ms": step_ms}
        out["spread"] = {
            "tokens_per_s_rel": _rel_std(tps),
            "tokens_per_step_rel": _rel_std(per_step),
            "step_ms_rel": _rel_std(step_ms),
        }
    return out


def comparisons(runs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each speculative run against the first speculative run at its batch: the ratio of their
    tokens/s, each one's run-to-run spread (relative std over its repeats; 0 when measured
    once), and with repeats the paired ratios (repeat r of both saw draw stream r) and their
    spread. A ratio farther from 1 than the spreads is a difference the draws do not explain."""
    first: dict[int, dict[str, Any]] = {}
    out = []
    for r in runs:
        if r.get("policy") is None:
            continue
        ref = first.setdefault(r["batch"], r)
        if ref is r:
            continue
        row: dict[str, Any] = {
            "batch": r["batch"],
            "label": r["label"],
            "versus": ref["label"],
            "tokens_per_s_ratio": r["tokens_per_s"] / ref["tokens_per_s"],
            "spread_rel": r.get("spread", {}).get("tokens_per_s_rel", 0.0),
            "versus_spread_rel": ref.get("spread", {}).get("tokens_per_s_rel", 0.0),
        }
        a, b = r.get("repeats"), ref.get("repeats")
        if a and b and len(a["tokens_per_s"]) == len(b["tokens_per_s"]):
            paired = [x / y for x, y in zip(a["tokens_per_s"], b["tokens_per_s"], strict=True)]
            row["paired_ratios"] = paired
            row["paired_spread_rel"] = _rel_std(paired)
        out.append(row)
    return out


def format_comparisons(rows: Sequence[dict[str, Any]]) -> str:
    """The comparisons as a table: ratio of tokens/s and the spreads beside it."""
    lines = [
        f"{'batch':>5} {'policy':<28} {'vs':<28} {'tok/s ratio':>11} {'spread':>7} "
        f"{'vs spread':>9} {'paired':>7}"
    ]
    for c in rows:
        paired = f"{c['paired_spread_rel']:>6.1%}" if "paired_spread_rel" in c else "      -"
        lines.append(
            f"{c['batch']:>5} {c['label']:<28.28} {c['versus']:<28.28} "
            f"{c['tokens_per_s_ratio']:>11.3f} {c['spread_rel']:>7.1%} "
            f"{c['versus_spread_rel']:>9.1%} {paired}"
        )
    return "\n".join(lines)


def measurement_doc(
    *,
    gpu: str,
    hardware: str,
    target: str,
    drafter: str,
    workload: str,
    context: int,
    steps: int,
    attention: str,
    runs: Sequence[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "gpu": gpu,
        "hardware": hardware,
        "target": target,
        "drafter": drafter,
        "workload": workload,
        "context": context,
        "steps": steps,
        "attention": attention,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "runs": list(runs),
    }
    if extra:
        doc.update(extra)
    return doc


def _number(
    d: dict[str, Any],
    key: str,
    where: str,
    *,
    lo: float = 0.0,
    lo_open: bool = True,
    hi: float = 1e30,
    integer: bool = False,
) -> float:
    """d[key] as a finite number in (lo, hi] ([lo, hi] without lo_open); SpecError naming the
    field otherwise (a missing, NaN or zero speedup must fail the gate, not pass it)."""
    v = d.get(key)
    kind = "an integer" if integer else "a number"
    if (
        isinstance(v, bool)
        or not isinstance(v, int | float)
        or (integer and not isinstance(v, int))
    ):
        raise SpecError(f"{where}: field {key!r} must be {kind}, got {v!r:.40}")
    if not math.isfinite(v) or not (lo < v if lo_open else lo <= v) or v > hi:
        span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
        raise SpecError(f"{where}: field {key!r} must be {kind} in {span}, got {v!r:.40}")
    return float(v)


def _policy(r: dict[str, Any], where: str) -> None:
    pol = r.get("policy")
    if pol is None:
        return
    if not isinstance(pol, dict):
        raise SpecError(f"{where}: field 'policy' must be an object or null")
    from_mapping(TreePolicy, pol, f"{where}: field 'policy'")


def validate_measurement(doc: Any, where: str = "measurement") -> None:
    """SpecError unless `doc` has the measurement schema's fields and types: at least one run,
    every timing, rate and speedup a finite number > 0 (phases >= 0), a valid policy or null."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SpecError(f"{where}: not a {SCHEMA} document")
    for key, typ in (
        ("gpu", str),
        ("hardware", str),
        ("target", str),
        ("drafter", str),
        ("context", int),
        ("runs", list),
    ):
        if not isinstance(doc.get(key), typ) or isinstance(doc.get(key), bool):
            raise SpecError(f"{where}: field {key!r} must be a {typ.__name__}")
    _number(doc, "context", where, lo_open=False, hi=2**31, integer=True)
    doc_tp(doc, where)
    gemm_plan(doc, where)
    attention_plan(doc, where)
    if not doc["runs"]:
        raise SpecError(f"{where}: field 'runs' is empty; a measurement needs at least one run")
    for i, r in enumerate(doc["runs"]):
        w = f"{where}: runs[{i}]"
        if not isinstance(r, dict):
            raise SpecError(f"{w}: expected an object")
        _number(r, "batch", w, lo=1, lo_open=False, hi=2**31, integer=True)
        _number(r, "nodes", w, lo=1, lo_open=False, hi=2**31, integer=True)
        _number(r, "accepted_mean", w, lo_open=False, hi=1e6)
        for key in ("tokens_per_s", "ar_step_ms", "speedup"):
            _number(r, key, w)
        for key in ("tokens_per_step", "ar_tokens_per_s"):
            if key in r:
                _number(r, key, w)
        if r.get("verified_mean") is not None:
            _number(r, "verified_mean", w, lo=1, lo_open=False)
        if r.get("verified_cv") is not None:
            _number(r, "verified_cv", w, lo_open=False, hi=100.0)
        if r.get("draft_widths") is not None:
            _draft_widths(r, w)
        ph = r.get("phases_ms")
        if not isinstance(ph, dict):
            raise SpecError(f"{w}: field 'phases_ms' needs numbers for {', '.join(PHASE_KEYS)}")
        for k in PHASE_KEYS:
            _number(ph, k, f"{w}.phases_ms", lo_open=k == "step")
        if "ar_phases_ms" in r:
            ar = r["ar_phases_ms"]
            if not isinstance(ar, dict):
                raise SpecError(f"{w}: field 'ar_phases_ms' must be an object")
            _number(ar, "verify", f"{w}.ar_phases_ms")
        if "label" in r and not isinstance(r["label"], str):
            raise SpecError(f"{w}: field 'label' must be a string")
        for key in ("gpu_state", "ar_gpu_state"):
            if key in r:
                gpu_state(r[key], f"{w}.{key}")
        _policy(r, w)
        if r.get("policy") is not None and "tokens_per_step" not in r:
            raise SpecError(f"{w}: field 'tokens_per_step' is missing")


def _draft_widths(run: dict[str, Any], where: str) -> None:
    """A run's "draft_widths": a list of at most MAX_DEPTH integers in [1, 2**31]."""
    v = run["draft_widths"]
    if not isinstance(v, list) or len(v) > MAX_DEPTH:
        raise SpecError(
            f"{where}: field 'draft_widths' must be a list of at most {MAX_DEPTH} "
            f"integers (tokens per drafting step after the first), got {v!r:.60}"
        )
    for i, x in enumerate(v):
        _number({f"draft_widths[{i}]": x}, f"draft_widths[{i}]", where, lo=1, lo_open=False,
                hi=2**31, integer=True)  # fmt: skip


def planned_objective(doc: dict[str, Any], planned: dict[str, Any]) -> Any:
    """The planner's objective (planner.objective.closed_form_objective) for the document's
    models, GPU and workload, built once per document (cached in `planned`, a dict the caller
    keeps per document); None where the workload is none the planner can build."""
    if "objective" not in planned:
        from spectune.planner.objective import closed_form_objective

        try:
            planned["objective"] = closed_form_objective(
                doc["target"], doc["drafter"], doc["hardware"], doc.get("workload") or ""
            )
        except SpecError:
            planned["objective"] = None
    return planned["objective"]


def run_draft_widths(
    doc: dict[str, Any], run: dict[str, Any], planned: dict[str, Any]
) -> tuple[int, ...] | None:
    """Tokens per sequence of each drafting step after the first of a measured `run`
    (CostModel.iteration's draft_widths): the run's recorded "draft_widths", else, for a
    static run of a document without them, its shape's drafted nodes per level under the
    document's workload (planned_objective's acceptance model, what the executor drafts with
    unless it replayed a trace; a workload the planner cannot build leaves the cost model's
    top-k default); None for the other builders."""
    if run.get("draft_widths") is not None:
        return tuple(int(w) for w in run["draft_widths"])
    pol = run.get("policy")
    if not pol or pol.get("builder") != "static":
        return None
    obj = planned_objective(doc, planned)
    if obj is None:
        return None
    from spectune.planner.trees import draft_widths

    return draft_widths(TreePolicy(**pol), obj.acceptance, int(run["batch"]))


RUN_SCHEMA = "spectune.calibration-run/v1"
MAX_TP = 64  # as Scenario.tp


def attention_plan(doc: dict[str, Any], where: str) -> dict[str, str]:
    """The document's "attention_plan" ({} when absent), or a SpecError naming the entry that
    is not "B<b>xN<n>xC<c>" -> a tree-attention launch (specs.kernel_plan)."""
    plan = doc.get("attention_plan", {})
    check_attention_plan(plan, where)
    return plan


def gemm_plan(doc: dict[str, Any], where: str) -> dict[str, str]:
    """The document's "gemm_plan" ({} when absent), or a SpecError naming the entry that is not
    "NxK@M[+silu]" -> a kernels.gemm variant (specs.kernel_plan.parse_plan)."""
    plan = doc.get("gemm_plan", {})
    parse_plan(plan, where)
    if "gemm_plan_seconds" in doc:
        check_plan_seconds(doc["gemm_plan_seconds"], plan, where)
    return plan


#: a run's "gpu_state" (executor.gpu_state.summarize): field -> (lowest, highest, integer)
GPU_STATE_FIELDS = {
    "sm_clock_mhz": (1.0, 10_000.0, False),
    "sm_clock_min_mhz": (1.0, 10_000.0, False),
    "samples": (1.0, 1e7, True),
    "power_w": (0.0, 10_000.0, False),
    "power_limit_w": (1.0, 10_000.0, False),
    "at_power_limit": (0.0, 1.0, False),
}


def gpu_state(state: object, where: str) -> None:
    """SpecError unless `state` is a run's "gpu_state": an object of GPU_STATE_FIELDS (SM clock
    and its lowest value in MHz, samples, power and its limit in W, the share of samples at the
    limit), each a finite number in its range; sm_clock_mhz and samples required."""
    if not isinstance(state, dict):
        raise SpecError(f"{where}: must be an object (SM clock and power while timed)")
    for key in state:
        if key not in GPU_STATE_FIELDS:
            raise SpecError(
                f"{where}: unknown field {str(key)[:40]!r}; known: {', '.join(GPU_STATE_FIELDS)}"
            )
    for key in ("sm_clock_mhz", "samples"):
        if key not in state:
            raise SpecError(f"{where}: field {key!r} is missing")
    for key, (lo, hi, integer) in GPU_STATE_FIELDS.items():
        if key in state:
            _number(state, key, where, lo=lo, lo_open=False, hi=hi, integer=integer)


def doc_tp(doc: dict[str, Any], where: str) -> int:
    """The document's tensor-parallel degree: field 'tp' (absent: 1, one GPU), 1..MAX_TP."""
    if "tp" not in doc:
        return 1
    return int(_number(doc, "tp", where, lo=1, lo_open=False, hi=MAX_TP, integer=True))


def _collectives(doc: dict[str, Any], where: str) -> None:
    """The collectives sweep's rows (spectune.executor.collectives.collective_sweep): op, tp
    in 2..MAX_TP, bytes >= 1, seconds > 0."""
    rows = doc.get("collectives", [])
    if not isinstance(rows, list):
        raise SpecError(f"{where}: field 'collectives' must be a list of objects")
    for i, r in enumerate(rows):
        w = f"{where}: collectives[{i}]"
        if not isinstance(r, dict) or not isinstance(r.get("op"), str):
            raise SpecError(f"{w}: expected an object with a string 'op'")
        _number(r, "tp", w, lo=2, lo_open=False, hi=MAX_TP, integer=True)
        _number(r, "bytes", w, lo=1, lo_open=False, hi=2**40, integer=True)
        _number(r, "seconds", w, hi=1e3)


def validate_calibration_run(doc: Any, where: str = "calibration run") -> None:
    """SpecError unless `doc` is a calibration-run document (spectune calibrate's micro-benchmarks)
    with at least one verify or gemm row, every size a positive integer and every time > 0."""
    if not isinstance(doc, dict) or doc.get("schema") != RUN_SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise SpecError(f"{where}: not a {RUN_SCHEMA} document (schema {got!r:.60})")
    for key in ("hardware", "target", "drafter"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise SpecError(f"{where}: field {key!r} must be a non-empty string")
    sizes = {
        "verify": ("batch", "tokens", "context"),
        "gemm": ("m", "n", "k"),
        "draft": ("batch", "tokens", "context"),  # TP drafter steps (executor.tp_jobs)
    }
    for kind, keys in sizes.items():
        rows = doc.get(kind, [])
        if not isinstance(rows, list):
            raise SpecError(f"{where}: field {kind!r} must be a list of objects")
        for i, r in enumerate(rows):
            w = f"{where}: {kind}[{i}]"
            if not isinstance(r, dict):
                raise SpecError(f"{w}: expected an object")
            for key in keys:
                lo = 0 if key == "context" else 1
                _number(r, key, w, lo=lo, lo_open=False, hi=2**31, integer=True)
            _number(r, "seconds", w, hi=1e6)
            if kind in ("verify", "draft") and "seconds_nocomm" in r:
                _number(r, "seconds_nocomm", w, hi=1e6)
            if kind == "verify" and ("linear_s" in r or "attention_s" in r):
                # kernel time by class (executor.calibrate.kernel_classes): both or neither,
                # together at most the forward's own time (kernels do not overlap in the graph;
                # CLASS_SLACK allows for the profiled calls' spread about the timed median)
                cap = CLASS_SLACK * r["seconds"]
                for key in ("linear_s", "attention_s"):
                    _number(r, key, w, lo=0, lo_open=False, hi=cap)
                if r["linear_s"] + r["attention_s"] > cap:
                    raise SpecError(
                        f"{w}: linear_s + attention_s ({r['linear_s']:.6g} + "
                        f"{r['attention_s']:.6g} s) exceed the forward's seconds "
                        f"({r['seconds']:.6g}) by more than {CLASS_SLACK - 1:.0%}: kernel time "
                        "by class is part of the forward"
                    )
    doc_tp(doc, where)
    gemm_plan(doc, where)
    attention_plan(doc, where)
    _collectives(doc, where)
    if not doc.get("verify") and not doc.get("gemm"):
        raise SpecError(f"{where}: no verify or gemm rows to fit or check")
    spec = doc.get("spec_runs")
    if spec is not None:
        if not isinstance(spec, dict) or not isinstance(spec.get("runs"), list):
            raise SpecError(f"{where}: field 'spec_runs' must be an object with a 'runs' list")
        for m in spec_run_measurements(doc):
            validate_measurement(m, f"{where}: spec_runs")
    for key in ("copy_bytes_per_s", "read_bytes_per_s", "matmul_flops"):
        if key in doc:
            _number(doc, key, where)


def spec_run_measurements(run: dict[str, Any]) -> list[dict[str, Any]]:
    """The speculative runs a calibration-run document holds (`spec_runs`: {"context",
    "workload", "steps", "runs": [...]}, spectune calibrate) as one measurement document of the
    run's GPU and models ([] when it holds none)."""
    spec = run.get("spec_runs")
    if not spec:
        return []
    doc = measurement_doc(
        gpu=str(run.get("gpu", run["hardware"])),
        hardware=run["hardware"],
        target=run["target"],
        drafter=run["drafter"],
        workload=str(spec.get("workload", "")),
        context=spec["context"],
        steps=int(spec.get("steps", 0)),
        attention=str(run.get("attention", "")),
        runs=spec["runs"],
    )
    return [doc]


def validate_document(doc: dict[str, Any], where: str) -> None:
    """validate_measurement or validate_calibration_run, by the document's schema."""
    if doc.get("schema") == RUN_SCHEMA:
        validate_calibration_run(doc, where)
    else:
        validate_measurement(doc, where)


def format_table(doc: dict[str, Any]) -> str:
    """The measurement as a readable table (one row per run)."""
    head = (
        f"{doc['gpu']} ({doc['hardware']}), {doc['target']} + {doc['drafter']}, "
        f"context {doc['context']}, workload {doc.get('workload', '')}, attention {doc.get('attention', '')}"
    )
    cols = (
        f"{'batch':>5} {'policy':<24} {'N':>5} {'draft':>7} {'tree':>6} {'verify':>7} {'acc+cmp':>7} "
        f"{'extend':>6} {'ovh':>5} {'step ms':>8} {'acc':>5} {'tok/s':>9} {'AR tok/s':>9} {'speedup':>7}"
    )
    lines = [head, cols]
    for r in doc["runs"]:
        p = r["policy"]
        name = "off" if p is None else f"{r['label']}:{p['depth']}/{p['topk']}/{p['budget']}"
        if p is not None and p.get("prune_threshold", 0.0) > 0:
            name += f"/p{p['prune_threshold']:g}"
        if p is not None and p.get("graft_budget", 0) > 0:
            name += f"/g{p['graft_budget']}"
        if p is not None and p.get("shared_budget"):
            name += "/echo"
        ph = r["phases_ms"]
        nodes = r.get("verified_mean", r["nodes"])  # tokens verified per sequence
        lines.append(
            f"{r['batch']:>5} {name:<24.24} {nodes:>5.1f} {ph['draft']:>7.2f} {ph['tree']:>6.2f} "
            f"{ph['verify']:>7.2f} {ph['accept'] + ph['compact']:>7.2f} {ph['extend']:>6.2f} "
            f"{ph['overhead']:>5.2f} {ph['step']:>8.2f} {r['accepted_mean']:>5.2f} "
            f"{r['tokens_per_s']:>9.0f} {r['ar_tokens_per_s']:>9.0f} {r['speedup']:>7.2f}"
        )
    if doc.get("comparisons"):
        lines.append(format_comparisons(doc["comparisons"]))
    return "\n".join(lines)


def script_command(script: str, options: dict[str, object]) -> str:
    """The command line that reproduces a benchmark script's run from its parsed options
    (vars(args)); unset and false options and --out are left out."""
    return f"python {script} " + " ".join(
        f"--{k.replace('_', '-')} {v}"
        for k, v in options.items()
        if v not in (None, False) and k != "out"
    )
