"""Runs policies on a real GPU: real-shape models, the spec-decoding loop, calibration (needs torch).

Modules (one concept each): model (dense decoder + KV cache), drafter (EAGLE-3 head, draft
model), attention / fused / gemm (the kernels a forward runs), tree_build (device EAGLE-2
builder), synthetic (acceptance-model-driven target tokens), loop (the speculative loop and the
baseline), timing (CUDA-event phases), session (one GPU session), calibrate (micro-benchmarks),
fit (Calibration fit), measure (measurement JSON), check (the CI gate), planned (plans with a
calibration). `measure`, `check`, `fit` and `planned` need no torch; this package's __init__
imports nothing, so `spectune check` runs on a CPU-only install.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Decoder": "model",
    "KVCache": "model",
    "Eagle3Head": "drafter",
    "ModelDrafter": "drafter",
    "SpecRunner": "loop",
    "ARRunner": "loop",
    "PhaseResult": "loop",
    "Session": "session",
    "SessionConfig": "session",
    "measure_runs": "session",
    "calibration_run": "calibrate",
    "fit_calibration": "fit",
    "check_folder": "check",
    "measurement_doc": "measure",
    "validate_measurement": "measure",
    "plan_table": "planned",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the defining module on first use (torch comes in only with the GPU parts)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'spectune.executor' has no attribute {name!r}")
    return getattr(importlib.import_module(f"spectune.executor.{_EXPORTS[name]}"), name)
