"""SGLang: server arguments and the adaptive config (candidate steps per batch-size lower bound)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spectune.planner.export.base import (
    Evaluate,
    Export,
    all_off,
    batch_plan,
    engine_shape,
    header,
    primary_policy,
    sidecar,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import PolicyTable


def check_sglang(args: Mapping[str, Any], adaptive: Mapping[str, Any] | None) -> None:
    """SGLang's rules for EAGLE arguments and the adaptive config."""
    steps = args["speculative_num_steps"]
    topk = args["speculative_eagle_topk"]
    tokens = args["speculative_num_draft_tokens"]
    if steps < 1 or topk < 1 or tokens < 2:
        raise SpecError("sglang: steps and top-k must be >= 1 and num_draft_tokens >= 2")
    if topk == 1 and tokens != steps + 1:
        raise SpecError(
            f"sglang: with --speculative-eagle-topk 1, --speculative-num-draft-tokens must be "
            f"steps + 1 = {steps + 1}, got {tokens}"
        )
    if tokens - 1 > topk + (steps - 1) * topk * topk:
        raise SpecError(
            f"sglang: {tokens - 1} draft tokens exceed what {steps} steps of top-k {topk} draft"
        )
    if adaptive is None:
        return
    keys = [k for k in adaptive if k != "strategy"]
    if "1" not in keys:
        raise SpecError(
            "sglang adaptive config: keys are batch-size lower bounds and must include '1'"
        )
    for k in keys:
        if not k.isdigit() or int(k) < 1:
            raise SpecError(f"sglang adaptive config: key {k!r} is not a batch size >= 1")
        cand = adaptive[k].get("candidate_steps")
        if not isinstance(cand, list) or not cand or cand != sorted(set(cand)):
            raise SpecError(
                f"sglang adaptive config[{k}]: candidate_steps must be a sorted non-empty list"
            )
        if min(cand) < 0 or max(cand) > steps:
            raise SpecError(
                f"sglang adaptive config[{k}]: candidate_steps must lie in 0..{steps} "
                f"(--speculative-num-steps), got {cand}"
            )


def export_sglang(
    table: PolicyTable, *, context: int | None = None, evaluate: Evaluate | None = None
) -> Export:
    rows, notes = batch_plan(table, context)
    p = primary_policy(rows)
    if p is None:
        notes.append(
            "speculation is off for every batch size: run SGLang without --speculative-algorithm"
        )
        text = header(table, "sglang", notes, "# ") + "# (no speculative arguments)\n"
        return Export(
            "sglang",
            {"sglang_args.txt": text, "sglang.spectune.json": sidecar(table, "sglang", notes, {})},
            tuple(notes),
        )
    shape, shape_notes = engine_shape(rows, p, evaluate, "sglang")
    notes += shape_notes
    steps = max(shape.depths)
    if steps == 0:  # the fit turned every range off
        return export_sglang(all_off(table), context=context)
    topk = shape.topk
    tokens = steps + 1 if topk == 1 else shape.budget
    if topk == 1 and shape.budget not in (0, steps + 1):
        notes.append(f"top-k 1 forces num_draft_tokens = steps + 1 = {steps + 1}")
    adaptive: dict[str, Any] = {"strategy": "ema"}
    for b, d in zip(rows, shape.depths, strict=True):
        adaptive[str(b.batch[0])] = {"candidate_steps": [d]}
    varying = len({d for d in shape.depths})
    args = {
        "speculative_algorithm": "EAGLE3",
        "speculative_draft_model_path": table.drafter,
        "speculative_num_steps": steps,
        "speculative_eagle_topk": topk,
        "speculative_num_draft_tokens": tokens,
    }
    use_adaptive = varying > 1
    check_sglang(args, adaptive if use_adaptive else None)
    argv = [f"--{k.replace('_', '-')} {v}" for k, v in args.items()]
    if use_adaptive:
        argv += ["--speculative-adaptive", "--speculative-adaptive-config sglang_adaptive.json"]
        notes.append(
            "adaptive mode: one candidate step count per batch range, so the EMA "
            "controller keeps the planned depth (0 = off)"
        )
    text = header(table, "sglang", notes, "# ") + " \\\n  ".join(argv) + "\n"
    files = {"sglang_args.txt": text}
    if use_adaptive:
        files["sglang_adaptive.json"] = json.dumps(adaptive, indent=2) + "\n"
    config = {"server_args": args, "adaptive": adaptive if use_adaptive else None}
    files["sglang.spectune.json"] = sidecar(table, "sglang", notes, config)
    return Export("sglang", files, tuple(notes), config)
