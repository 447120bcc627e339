"""`spectune presets`: list the built-in hardware, model, workload and engine presets."""

from __future__ import annotations

import argparse
import importlib
import json

from spectune.specs import HARDWARE_PRESETS, MODEL_PRESETS
from spectune.specs.engine import ENGINE_PRESETS


def _workload_names() -> list[str]:
    try:
        workload = importlib.import_module("spectune.specs.workload")
    except ModuleNotFoundError:
        return []
    return sorted(workload.WORKLOAD_PRESETS)


def run(args: argparse.Namespace) -> int:
    listing = {
        "hardware": sorted(HARDWARE_PRESETS),
        "models": sorted(MODEL_PRESETS),
        "workloads": _workload_names(),
        "engines": sorted(ENGINE_PRESETS),
    }
    if args.json:
        print(json.dumps(listing))
        return 0
    for hw in sorted(HARDWARE_PRESETS.values(), key=lambda h: h.name):
        print(
            f"gpu      {hw.name:<22} {hw.peak_bf16_flops / 1e12:7.1f} TFLOP/s bf16  "
            f"{hw.hbm_bytes_per_s / 1e12:5.2f} TB/s  {hw.hbm_bytes / 1e9:5.0f} GB"
        )
    for m in sorted(MODEL_PRESETS.values(), key=lambda m: m.name):
        print(f"model    {m.name:<22} {m.total_params() / 1e9:8.2f} B params  {m.arch}")
    for w in listing["workloads"]:
        print(f"workload {w}")
    for e in sorted(ENGINE_PRESETS.values(), key=lambda e: e.name):
        kind = "trees" if e.trees else "chains"
        print(f"engine   {e.name:<22} {e.engine} {e.versions}  ({kind}, schedule {e.schedule})")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("presets", help="list built-in GPUs, models, workloads and engine profiles")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
