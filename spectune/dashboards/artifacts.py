"""Measurements and benchmark results for the Validation and Kernels pages, without any UI:
the committed measurements/ folder and benchmarks/results/*.json (or uploaded documents, parsed
by dashboards.uploads), checked for the fields the pages read, and what the pages derive from
them: `spectune check`'s re-prediction, the planner's end-to-end prediction, roofline points.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spectune.dashboards.data import objective_for, repo_path
from spectune.dashboards.uploads import MAX_SPEC_BYTES, parse_mapping
from spectune.specs import HARDWARE_PRESETS, NO_DRAFTER, Scenario, SpecError, TreePolicy
from spectune.specs.io import from_mapping, names_a_file

MEASUREMENT_SCHEMA = "spectune.measurement/v1"
ENV_MEASUREMENTS = "SPECTUNE_MEASUREMENTS_DIR"
ENV_BENCHMARKS = "SPECTUNE_BENCHMARKS_DIR"


def measurements_dir() -> Path:
    """Where measurement JSONs live: $SPECTUNE_MEASUREMENTS_DIR, else the repository's
    measurements/ (data.repo_path), wherever the dashboard was started."""
    return repo_path("measurements", env=ENV_MEASUREMENTS)


def benchmarks_dir() -> Path:
    """Where benchmark results live: $SPECTUNE_BENCHMARKS_DIR, else the repository's
    benchmarks/results/ (data.repo_path)."""
    return repo_path("benchmarks", "results", env=ENV_BENCHMARKS)


# ---- measurements -------------------------------------------------------------------------------


def check_measurement(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """The measurement document if it has the fields the Validation page reads."""
    if doc.get("schema") != MEASUREMENT_SCHEMA:
        raise SpecError(f"{name}: not a {MEASUREMENT_SCHEMA} document (field 'schema')")
    for key, typ in (("hardware", str), ("target", str), ("drafter", str), ("context", int)):
        if not isinstance(doc.get(key), typ) or isinstance(doc.get(key), bool):
            raise SpecError(f"{name}: field {key!r} must be a {typ.__name__}")
    for key in ("hardware", "target", "drafter", "workload"):
        if isinstance(doc.get(key), str) and names_a_file(doc[key]):  # never opened here
            raise SpecError(f"{name}: field {key!r} names a file ({doc[key][:80]!r}), not a preset")
    runs = doc.get("runs")
    if not isinstance(runs, list) or not runs:
        raise SpecError(f"{name}: field 'runs' must be a non-empty list")
    for i, r in enumerate(runs):
        w = f"{name}: runs[{i}]"
        if not isinstance(r, dict):
            raise SpecError(f"{w}: expected an object")
        for key in ("batch", "tokens_per_s", "speedup", "tokens_per_step"):
            v = r.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise SpecError(f"{w}: field {key!r} must be a number")
        ph = r.get("phases_ms")
        if not isinstance(ph, dict) or not isinstance(ph.get("step"), int | float):
            raise SpecError(f"{w}: field 'phases_ms' must hold the step time in ms ('step')")
        pol = r.get("policy")
        if pol is not None:
            if not isinstance(pol, dict):
                raise SpecError(f"{w}: field 'policy' must be an object or null")
            from_mapping(TreePolicy, pol, f"{w}.policy")
    return dict(doc)


def measurement_from_upload(name: str, data: bytes) -> dict[str, Any]:
    return check_measurement(parse_mapping(name, data), name)


@dataclass(frozen=True)
class Loaded:
    """A file of a folder: its document, or why it could not be read."""

    name: str
    doc: dict[str, Any] | None
    error: str = ""


def _read_folder(folder: Path, check: Any) -> list[Loaded]:
    out: list[Loaded] = []
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        try:
            if path.stat().st_size > MAX_SPEC_BYTES:
                raise SpecError(f"{path.name}: larger than {MAX_SPEC_BYTES} bytes")
            out.append(
                Loaded(path.name, check(parse_mapping(path.name, path.read_bytes()), path.name))
            )
        except SpecError as e:
            out.append(Loaded(path.name, None, str(e)))
        except OSError as e:
            out.append(Loaded(path.name, None, f"{path.name}: cannot read: {e}"))
    return out


def read_measurements(folder: Path) -> list[Loaded]:
    """Every *.json measurement in a folder (bad files come back with their error)."""
    return _read_folder(folder, check_measurement)


def validation_rows(doc: Mapping[str, Any], name: str = "") -> list[dict[str, Any]]:
    """Predicted (the planner's closed form for the measured scenario, decode-only: the
    executor times decode steps at a fixed batch and context) vs measured, per run."""
    try:
        scn = Scenario(
            target=doc["target"],
            drafter=doc["drafter"] or NO_DRAFTER,
            gpu=doc["hardware"],
            workload=doc.get("workload") or Scenario().workload,
        )
        obj = objective_for(scn, decode_only=True)
    except SpecError as e:
        raise SpecError(f"{name}: cannot predict this measurement: {e}") from None
    ctx = int(doc["context"])
    rows = []
    for r in doc["runs"]:
        policy = None if r.get("policy") is None else TreePolicy(**r["policy"])
        b = int(r["batch"])
        pred_tps = obj(policy, b, ctx)
        pred = {
            "step_ms": obj.step_time(policy, b, ctx) * 1e3,
            "tokens_per_s": pred_tps,
            "speedup": pred_tps / obj(None, b, ctx),
            "tokens_per_step": obj.expected_tokens(policy),
        }
        meas = {
            "step_ms": float(r["phases_ms"]["step"]),
            "tokens_per_s": float(r["tokens_per_s"]),
            "speedup": float(r["speedup"]),
            "tokens_per_step": float(r["tokens_per_step"]),
        }
        row: dict[str, Any] = {
            "file": name,
            "gpu": doc.get("gpu", doc["hardware"]),
            "batch": b,
            "context": ctx,
            "policy": r.get("label") or ("off" if policy is None else policy.builder),
        }
        for k in pred:
            row[f"predicted_{k}"] = pred[k]
            row[f"measured_{k}"] = meas[k]
            row[f"error_{k}_pct"] = (
                100.0 * (pred[k] - meas[k]) / meas[k] if meas[k] else float("nan")
            )
        rows.append(row)
    return rows


GATE_SPEEDUP_TOL = 0.10  # `spectune check` defaults
GATE_MAPE_TOL = 0.10


@dataclass(frozen=True)
class Gate:
    """What `spectune check` (the CI regression gate) computes for a folder of measurements."""

    rows: tuple[dict[str, Any], ...]
    files: int
    verify_mape: float
    worst_speedup_error: float
    passed: bool


def gate(folder: Path, extra: Mapping[str, Mapping[str, Any]] | None = None) -> Gate:
    """executor.check.check_folder on `folder`, plus uploaded documents (`extra`: name -> doc,
    written as JSON to a temporary copy of the folder). SpecError when there is nothing."""
    from spectune.validate.check import check_folder

    with tempfile.TemporaryDirectory(prefix="spectune-check-") as tmp:
        root = Path(tmp)
        if folder.is_dir():
            for p in folder.rglob("*.json"):
                if p.stat().st_size > MAX_SPEC_BYTES:
                    continue
                blob = p.read_bytes()
                try:  # files the gate cannot read are listed as skipped by the page
                    parse_mapping(p.name, blob)
                except SpecError:
                    continue
                dest = root / p.relative_to(folder)
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(blob)
        for i, (name, doc) in enumerate((extra or {}).items()):
            safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in Path(name).stem)
            (root / f"upload-{i}-{safe}.json").write_text(json.dumps(doc), encoding="utf-8")
        try:
            res = check_folder(root)
        except SpecError as e:
            raise SpecError(str(e).replace(str(root), str(folder))) from None
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"a measurement lacks a field `spectune check` needs: {e!r}") from None
    rows = [
        {"file": r.file, "check": "verify latency", "what": r.what, "predicted": r.predicted * 1e3,
         "measured": r.measured * 1e3, "unit": "ms", "error_pct": 100 * r.error}
        for r in res.verify
    ] + [
        {"file": r.file, "check": "speedup", "what": r.what, "predicted": r.predicted,
         "measured": r.measured, "unit": "x", "error_pct": 100 * r.error}
        for r in res.speedup
    ]  # fmt: skip
    return Gate(tuple(rows), res.files, res.verify_mape, res.worst_speedup_error,
                res.passed(GATE_SPEEDUP_TOL, GATE_MAPE_TOL))  # fmt: skip


# ---- kernel benchmarks --------------------------------------------------------------------------

# Attention implementations of benchmarks/bench_kernels.py: (column prefix, label).
ATTENTION_PATHS = (
    ("ours", "spectune tree attention"),
    ("sdpa_mask_packed", "SDPA + mask (packed GQA)"),
    ("sdpa_gqa", "SDPA enable_gqa"),
    ("flex", "FlexAttention"),
    ("flash_unmasked", "flash, no mask (bound)"),
)


def check_benchmark(doc: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A kernel benchmark document (bench_kernels.py --out) with its attention rows."""
    bw = doc.get("copy_bytes_per_s")
    if isinstance(bw, bool) or not isinstance(bw, int | float) or not bw > 0:
        raise SpecError(
            f"{name}: no 'copy_bytes_per_s' (measured copy bandwidth); not a kernel benchmark"
        )
    rows = doc.get("attention")
    if not isinstance(rows, list):
        raise SpecError(f"{name}: field 'attention' must be a list of benchmark rows")
    for i, r in enumerate(rows):
        if not isinstance(r, dict):
            raise SpecError(f"{name}: attention[{i}] must be an object")
        for key in ("batch", "ctx", "tree_tokens", "kv_bytes", "flops"):
            v = r.get(key)
            if isinstance(v, bool) or not isinstance(v, int | float) or v < 0:
                raise SpecError(f"{name}: attention[{i}]: field {key!r} must be a number >= 0")
    return dict(doc)


def read_benchmarks(folder: Path) -> list[Loaded]:
    return _read_folder(folder, check_benchmark)


def benchmark_from_upload(name: str, data: bytes) -> dict[str, Any]:
    return check_benchmark(parse_mapping(name, data), name)


def peak_flops_for(doc: Mapping[str, Any]) -> tuple[float, str]:
    """Dense bf16 peak of the benchmarked card from the hardware presets (0 if unknown)."""
    text = f"{doc.get('card', '')} {doc.get('device', '')}".lower()
    for key, preset in (("h200", "h200"), ("h100", "h100-sxm"), ("a100", "a100-80g"),
                        ("l40s", "l40s"), ("mi300", "mi300x")):  # fmt: skip
        if key in text and preset in HARDWARE_PRESETS:
            return HARDWARE_PRESETS[preset].peak_bf16_flops, preset
    return 0.0, ""


ROOFLINE_COLUMNS: dict[str, tuple[str, str]] = {
    "shape": ("shape (batch, context, tree tokens)", "%s"),
    "implementation": ("implementation", "%s"),
    "us": ("time, us", "%.1f"),
    "floor_us": ("copy-bandwidth floor, us", "%.1f"),
    "intensity_flop_per_byte": ("FLOP per KV byte", "%.3g"),
    "tflops": ("TFLOP/s", "%.3g"),
    "gb_per_s": ("KV GB/s", "%.0f"),
    "copy_bw_fraction": ("fraction of copy bandwidth", "%.2f"),
}


def roofline_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One point per (attention shape, implementation): arithmetic intensity (FLOP per KV byte),
    achieved TFLOP/s and GB/s, and the fraction of the measured copy bandwidth."""
    bw = float(doc["copy_bytes_per_s"])
    out = []
    for r in doc["attention"]:
        kv, flops = float(r["kv_bytes"]), float(r["flops"])
        for prefix, label in ATTENTION_PATHS:
            us = r.get(f"{prefix}_us")
            if isinstance(us, bool) or not isinstance(us, int | float) or not us > 0:
                continue
            s = float(us) * 1e-6
            out.append(
                {
                    "shape": f"B={r['batch']} ctx={r['ctx']} N={r['tree_tokens']}",
                    "implementation": label,
                    "us": float(us),
                    "floor_us": kv / bw * 1e6,
                    "intensity_flop_per_byte": flops / kv if kv else float("nan"),
                    "tflops": flops / s / 1e12,
                    "gb_per_s": kv / s / 1e9,
                    "copy_bw_fraction": kv / s / bw,
                }
            )
    return out
