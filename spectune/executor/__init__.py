"""Runs policies on a real GPU: real-shape models, the spec-decoding loop, calibration (needs torch).

Modules (one concept each): model (dense decoder + KV cache), moe (MoE decoder), drafter
(EAGLE-3 head, draft model), loop (the speculative loop and the baseline), sources/ (tree
sources: dynamic top-k, static shape, pruned, ECHO shared budget, grafted), verifiers/ (dense
and ragged verify), accept (accept + KV compaction), tree_build (device EAGLE-2 builder and
pruning), select (shared-budget choice and graft placement), retrieval (the GPU n-gram
drafter grafting uses), synthetic (acceptance-model-driven target tokens), draws (common random
numbers), graphs (phase CUDA graphs), session (one GPU session),
calibrate (the GPU side of calibration: micro-benchmarks and timed runs), tp (tensor
parallelism: sharded target and drafter), collectives (the TP group, its collectives and their
sweep), tp_jobs (what the ranks of a --tp command run). Every Triton kernel a
forward runs, its planning and the CUDA-event timers are in spectune.kernels. The CPU side of
measurement (measurement documents, check, the calibration fit) is spectune.validate. This
package's __init__ imports nothing, so importing it costs nothing until a GPU part is used.
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
    "TPDecoder": "tp",
    "TPSession": "tp",
    "TPGroup": "collectives",
    "launch": "collectives",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Import the defining module on first use (torch comes in only with the GPU parts)."""
    if name not in _EXPORTS:
        raise AttributeError(f"module 'spectune.executor' has no attribute {name!r}")
    return getattr(importlib.import_module(f"spectune.executor.{_EXPORTS[name]}"), name)
