"""TensorRT-LLM: `trtllm-serve MODEL --extra_llm_api_options FILE` with an Eagle3
speculative_config (draft_len_schedule, dynamic-tree limits or eagle_choices), written by hand
(no YAML dependency in the core), in the semantics of the profile's version:

  trtllm, trtllm-1.4   draft_len_schedule keys are upper bounds (batch <= key gets the value),
                       batches above the largest key get 0; the smallest key maps to
                       max_draft_len. trtllm-1.4 has no eagle_choices.
  trtllm-stage1        keys are lower bounds (the largest key <= batch); the schedule drives
                       the two-model drafter (eagle3_one_model: false), which drafts chains.

The YAML also sets max_batch_size (the plan's largest batch: every batch the schedule sees is
covered) and tensor_parallel_size.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from spectune.planner.export.base import (
    HERE,
    Export,
    TreeShaper,
    batch_plan,
    check_choices,
    engine_shape,
    header,
    launch_script,
    max_batch,
    model_paths,
    range_label,
    tree_choices,
)
from spectune.planner.space import check_engine_drafter, check_engine_policy
from spectune.specs.engine import EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy

YAML_FILE = "trtllm_extra_llm_api_options.yaml"
DECODING_TYPES = {
    "eagle3": "Eagle3",
    "eagle": "Eagle",
    "mtp": "MTP",
    "draft-model": "Draft_Target",
    "ngram": "NGram",
}


def check_trtllm(cfg: Mapping[str, Any], profile: EngineProfile | str = "trtllm") -> None:
    """TensorRT-LLM's rules for an Eagle3 speculative_config (llm_args.py at the profile's
    revision)."""
    prof = load_engine(profile)
    d = cfg["max_draft_len"]
    if d < 1:
        raise SpecError("trtllm: max_draft_len must be > 0 for Eagle")
    sched = cfg.get("draft_len_schedule")
    if sched:
        if min(sched) < 1 or min(sched.values()) < 0:
            raise SpecError("trtllm: draft_len_schedule keys must be >= 1 and values >= 0")
        if 1 not in sched and prof.schedule == "lower-bound":
            raise SpecError("trtllm: a lower-bound draft_len_schedule must include batch size 1")
        if sched[min(sched)] != d:
            raise SpecError(
                f"trtllm: draft_len_schedule[{min(sched)}] must equal max_draft_len {d}"
            )
        if max(sched.values()) > d:
            raise SpecError(f"trtllm: draft_len_schedule values must be <= max_draft_len {d}")
    choices = cfg.get("eagle_choices")
    if choices is not None:
        if not prof.static_tree_choices:
            raise SpecError(
                f"trtllm: {prof.name} ({prof.versions}) has no eagle_choices; use a dynamic tree"
            )
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


def schedule_for(
    rows: Sequence[Bucket], lengths: Sequence[int], profile: EngineProfile, m: int
) -> dict[int, int]:
    """draft_len_schedule for per-range draft lengths (batch order; lengths[0] is the global
    max_draft_len), in the key semantics of `profile`: upper bounds (each run of equal
    lengths keyed by its last batch; the last run keyed by the max batch `m`, so no batch the
    server admits falls past the largest key) or lower bounds (keyed by its first batch)."""
    runs: list[tuple[int, int, int]] = []
    for b, v in zip(rows, lengths, strict=True):
        if runs and runs[-1][2] == v:
            runs[-1] = (runs[-1][0], b.batch[1], v)
        else:
            runs.append((b.batch[0], b.batch[1], v))
    if profile.schedule == "lower-bound":
        return {lo: v for lo, _, v in runs}
    out = {hi: v for _, hi, v in runs}
    if runs[-1][2] == 0:  # batches past the largest key get 0 anyway
        out.pop(runs[-1][1])
        if not out:
            return {}
    else:
        out[m] = out.pop(runs[-1][1])
    return out


def export_trtllm(
    table: PolicyTable,
    *,
    context: int | None = None,
    static_tree: bool | None = None,
    shaper: TreeShaper | None = None,
    notes: Sequence[str] = (),
    profile: EngineProfile | str = "trtllm",
    model_path: str | None = None,
    draft_model_path: str | None = None,
) -> Export:
    """`notes`: what was given up before (export_policy's fit), first in the list."""
    prof = load_engine(profile)
    rows, more = batch_plan(table, context)
    notes = [*notes, *more]
    paths = model_paths(table, model_path, draft_model_path)
    check_engine_drafter(paths.drafter_kind, prof)
    m = max_batch(rows)
    for b in rows:
        check_engine_policy(b.policy, prof)
    argv = ["trtllm-serve", paths.target, "--backend", "pytorch", "--tp_size", str(table.tp)]
    argv += ["--max_batch_size", str(m), "--extra_llm_api_options", f"{HERE}/{YAML_FILE}"]
    doc: dict[str, Any] = {"tensor_parallel_size": table.tp, "max_batch_size": m}
    cfg = _spec_config(rows, prof, paths.drafter, paths.drafter_kind, m, notes, static_tree, shaper)
    if cfg is not None:
        check_trtllm(cfg, prof)
        doc["speculative_config"] = cfg
    head = header(table, prof, notes, "# ")
    files = {"launch_trtllm.sh": launch_script(argv, head), YAML_FILE: head + to_yaml(doc)}
    return Export("trtllm", files, tuple(notes), doc, tuple(argv))


def _spec_config(
    rows: Sequence[Bucket],
    prof: EngineProfile,
    drafter: str,
    kind: str,
    m: int,
    notes: list[str],
    static_tree: bool | None,
    shaper: TreeShaper | None,
) -> dict[str, Any] | None:
    p = next((b.policy for b in rows if b.policy is not None), None)
    if p is None:
        notes.append(
            "speculation is off for every batch size: run TensorRT-LLM without speculative_config"
        )
        return None
    use_static = p.builder == "static" if static_tree is None else static_tree
    if use_static and not prof.static_tree_choices:
        notes.append(
            f"{prof.name} ({prof.versions}) has no eagle_choices (static trees): exported a "
            "dynamic tree with the same top-k and tree tokens"
        )
        use_static = False
    if use_static and shaper is None:
        notes.append("no tree shaper available for eagle_choices: exported a dynamic tree")
        use_static = False
    shape, shape_notes_ = engine_shape(rows, p, "trtllm")
    notes += shape_notes_
    if not prof.trees and shape.topk > 1:
        raise SpecError(
            f"{prof.name} ({prof.versions}) drafts chains only with a draft_len_schedule "
            f"(two-model drafter); the plan's trees need --engine trtllm"
        )
    depths = list(shape.depths)
    if max(depths) == 0:
        notes.append(
            "speculation is off for every batch size: run TensorRT-LLM without speculative_config"
        )
        return None
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
    lengths = [min(d, d_max) for d in depths]
    lengths[0] = d_max
    if prof.schedule_min_steps and 0 in lengths:
        notes.append(
            f"{prof.name} raises a draft length of 0 to {prof.schedule_min_steps}: ranges the "
            "plan turns off speculate 1 token"
        )
        lengths = [max(v, prof.schedule_min_steps) for v in lengths]
    cfg: dict[str, Any] = {"decoding_type": DECODING_TYPES[kind], "max_draft_len": d_max}
    model_key = "speculative_model_dir" if prof.schedule == "lower-bound" else "speculative_model"
    if kind != "ngram":
        cfg[model_key] = drafter
    if prof.schedule == "lower-bound" and kind == "eagle3":
        cfg["eagle3_one_model"] = False
    if use_static:
        assert shaper is not None
        choices = tree_choices(shaper(TreePolicy("static", d_max, p.topk, p.budget)))
        cfg["max_draft_len"] = d_max = max(len(c) for c in choices)
        lengths = [min(v, d_max) for v in lengths]
        lengths[0] = d_max
        cfg["eagle_choices"] = choices
        notes.append(
            f"one static tree (eagle_choices, {len(choices)} draft tokens) for every batch "
            f"size; {prof.name} marks eagle_choices deprecated (removed in 1.4)"
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
    if len(set(lengths)) > 1:
        cfg["draft_len_schedule"] = schedule_for(rows, lengths, prof, m)
    return cfg


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
