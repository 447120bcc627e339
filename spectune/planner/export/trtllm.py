"""TensorRT-LLM: an Eagle3 speculative_config YAML (draft_len_schedule, dynamic-tree limits or
eagle_choices), written by hand: no YAML dependency in the core."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spectune.planner.export.base import (
    Evaluate,
    Export,
    TreeShaper,
    all_off,
    batch_plan,
    check_choices,
    engine_shape,
    header,
    primary_policy,
    range_label,
    tree_choices,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import PolicyTable, TreePolicy


def check_trtllm(cfg: Mapping[str, Any]) -> None:
    """TensorRT-LLM's rules for an Eagle3 speculative_config."""
    d = cfg["max_draft_len"]
    if d < 1:
        raise SpecError("trtllm: max_draft_len must be > 0 for Eagle")
    sched = cfg.get("draft_len_schedule")
    if sched:
        if min(sched) < 1 or min(sched.values()) < 0:
            raise SpecError("trtllm: draft_len_schedule keys must be >= 1 and values >= 0")
        if 1 not in sched:
            raise SpecError("trtllm: draft_len_schedule must include batch size 1")
        if sched[min(sched)] != d:
            raise SpecError(
                f"trtllm: draft_len_schedule[{min(sched)}] must equal max_draft_len {d}"
            )
        if max(sched.values()) > d:
            raise SpecError(f"trtllm: draft_len_schedule values must be <= max_draft_len {d}")
    choices = cfg.get("eagle_choices")
    if choices is not None:
        if cfg.get("use_dynamic_tree"):
            raise SpecError("trtllm: eagle_choices and use_dynamic_tree are mutually exclusive")
        check_choices(choices)
        if max(len(c) for c in choices) != d:
            raise SpecError("trtllm: the deepest eagle_choices path must equal max_draft_len")
    if cfg.get("use_dynamic_tree"):
        k = cfg["dynamic_tree_max_topK"]
        t = cfg["max_total_draft_tokens"]
        if k < 1:
            raise SpecError("trtllm: dynamic_tree_max_topK must be >= 1")
        if not d <= t <= k * d:
            raise SpecError(
                f"trtllm: need max_draft_len ({d}) <= max_total_draft_tokens ({t}) <= "
                f"dynamic_tree_max_topK * max_draft_len ({k * d})"
            )


def export_trtllm(
    table: PolicyTable,
    *,
    context: int | None = None,
    static_tree: bool | None = None,
    shaper: TreeShaper | None = None,
    evaluate: Evaluate | None = None,
) -> Export:
    rows, notes = batch_plan(table, context)
    p = primary_policy(rows)
    if p is None:
        notes.append(
            "speculation is off for every batch size: run TensorRT-LLM without speculative_config"
        )
        text = header(table, "trtllm", notes, "# ") + "{}\n"
        return Export("trtllm", {"trtllm_extra_llm_api_options.yaml": text}, tuple(notes))
    use_static = p.builder == "static" if static_tree is None else static_tree
    if use_static and shaper is None:
        notes.append("no tree shaper available for eagle_choices: exported a dynamic tree")
        use_static = False
    shape, shape_notes = engine_shape(
        rows, p, None if use_static else evaluate, "trtllm", cap_by_first=True
    )
    notes += shape_notes
    if max(shape.depths) == 0:
        return export_trtllm(all_off(table), context=context)
    depths = list(shape.depths)
    d_max = depths[0] if depths[0] > 0 else max(depths)
    if depths[0] == 0:
        notes.append(
            "batch 1 plans no speculation, but TensorRT-LLM maps the smallest schedule "
            f"key to max_draft_len: batch {range_label(rows[0])} speculates {d_max} tokens"
        )
    clamped = [f"{range_label(b)} ({d})" for b, d in zip(rows, depths, strict=True) if d > d_max]
    if clamped:
        notes.append(
            f"draft lengths above the batch-1 value {d_max} were cut to it: " + ", ".join(clamped)
        )
    sched_vals = [min(d, d_max) for d in depths]
    sched_vals[0] = d_max
    keys_vals: list[tuple[int, int]] = []
    for b, v in zip(rows, sched_vals, strict=True):
        if keys_vals and keys_vals[-1][1] == v:
            keys_vals[-1] = (b.batch[1], v)
        else:
            keys_vals.append((b.batch[1], v))
    schedule = dict(keys_vals)
    if 1 not in schedule:
        schedule = {1: sched_vals[0], **schedule}
    if keys_vals[-1][1] > 0:
        notes.append(
            f"batches above {keys_vals[-1][0]} get 0 draft tokens in TensorRT-LLM's "
            "draft_len_schedule (the table would keep the last bucket's policy)"
        )
    cfg: dict[str, Any] = {
        "decoding_type": "Eagle3",
        "speculative_model_dir": table.drafter,
        "max_draft_len": d_max,
    }
    if use_static:
        assert shaper is not None
        shape_policy = TreePolicy("static", d_max, p.topk, p.budget)
        choices = tree_choices(shaper(shape_policy))
        cfg["max_draft_len"] = max(len(c) for c in choices)
        schedule = {k: min(v, cfg["max_draft_len"]) for k, v in schedule.items()}
        schedule[1] = cfg["max_draft_len"]
        cfg["eagle_choices"] = choices
        notes.append(
            f"one static tree (eagle_choices, {len(choices)} draft tokens) for every "
            "batch size; TensorRT-LLM marks eagle_choices deprecated"
        )
    elif shape.topk > 1:
        t = min(max(shape.budget - 1, d_max), shape.topk * d_max)
        if t != shape.budget - 1:
            notes.append(
                f"max_total_draft_tokens {shape.budget - 1} moved to {t} to satisfy "
                "max_draft_len <= max_total_draft_tokens <= topK * max_draft_len"
            )
        cfg.update(
            use_dynamic_tree=True, dynamic_tree_max_topK=shape.topk, max_total_draft_tokens=t
        )
    cfg["draft_len_schedule"] = schedule
    check_trtllm(cfg)
    text = header(table, "trtllm", notes, "# ") + to_yaml({"speculative_config": cfg})
    return Export("trtllm", {"trtllm_extra_llm_api_options.yaml": text}, tuple(notes), cfg)


def to_yaml(obj: Any, indent: int = 0) -> str:
    """A small YAML writer for nested mappings of scalars and lists (no dependency)."""
    pad = "  " * indent
    out = []
    for k, v in obj.items():
        if isinstance(v, Mapping):
            out.append(f"{pad}{k}:\n{to_yaml(v, indent + 1)}")
        else:
            out.append(f"{pad}{k}: {_yaml_scalar(v)}\n")
    return "".join(out)


def _yaml_scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_yaml_scalar(x) for x in v) + "]"
    return json.dumps(str(v))  # a JSON string is a valid YAML double-quoted scalar
