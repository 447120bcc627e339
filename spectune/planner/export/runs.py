"""What an engine runs per batch size, read back from an export's resolved config.

An export (planner.export) turns a PolicyTable into one engine config; engines hold one tree
shape and key speculation by batch size only, so what they run differs from the table. This
module reads the config an exporter resolved (`Export.config`, also the `config` of the sidecar
`*.spectune.json` that SGLang and vLLM exports carry) back into the policy each batch range runs,
in the engine's own semantics:

  sglang  server_args (steps, top-k, draft tokens) for every batch up to max_running_requests,
          or with an adaptive config, a chain of candidate_steps per batch-size lower bound
          (0 = off)
  vllm    no speculative_config: off; speculative_token_tree: one static tree of its paths;
          num_speculative_tokens_per_batch_size: a chain of K per inclusive range (0 = off),
          else num_speculative_tokens for every batch up to max_num_seqs
  trtllm  draft_len_schedule keys as upper bounds (batches past the largest key: 0) or lower
          bounds by the profile; the draft length grows a dynamic tree (dynamic_tree_max_topK,
          max_total_draft_tokens), the eagle_choices static tree, or a chain

`spectune plan` prices these runs to predict each engine's gain; `spectune simulate --policy`
serves an export's sidecar as the PolicyTable `export_table_of` makes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from spectune.planner.export.base import EngineShape
from spectune.specs.engine import EngineProfile, load_engine
from spectune.specs.errors import SpecError
from spectune.specs.io import loads_json, read_bytes_bounded
from spectune.specs.policy import Bucket, PolicyTable, TreePolicy
from spectune.specs.scenario import NO_DRAFTER, Scenario

SIDECAR_SCHEMA = "spectune.export/v1"
ANY_CONTEXT = (0, 1 << 24)
"""Engines key speculation by batch size only: a run holds at every context."""


@dataclass(frozen=True)
class EngineRun:
    """The policy an engine runs for a batch-size range (inclusive; None: speculation off)."""

    batch: tuple[int, int]
    policy: TreePolicy | None


def _chain(depth: int) -> TreePolicy | None:
    return None if depth <= 0 else TreePolicy("dynamic-topk", depth, 1, depth + 1)


MAX_COUNT = 1 << 20
"""Largest batch size, draft length or token count a config may name."""


def _count(v: Any, what: str, where: str, lo: int = 0, *, key: bool = False) -> int:
    """An integer in lo..MAX_COUNT; a mapping `key` may also be its decimal string (JSON keys
    are strings)."""
    if key and isinstance(v, str) and v.isdigit() and len(v) <= 8:
        v = int(v)
    if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= MAX_COUNT:
        raise SpecError(f"{where}: {what} must be an integer in {lo}..{MAX_COUNT}, got {v!r}")
    return v


def _int(cfg: Mapping[str, Any], key: str, where: str, lo: int = 0) -> int:
    return _count(cfg.get(key), f"field {key!r}", where, lo)


def _paths(v: Any, what: str, where: str) -> list[tuple[int, ...]]:
    """Tree paths of sibling ranks: a non-empty list of non-empty lists of ranks."""
    if not isinstance(v, list | tuple) or not v or len(v) > MAX_COUNT:
        raise SpecError(f"{where}: {what} must be a non-empty list of paths")
    out = []
    for p in v:
        if not isinstance(p, list | tuple) or not p:
            raise SpecError(f"{where}: {what} holds {p!r}, not a path of sibling ranks")
        out.append(tuple(_count(r, what, where) for r in p))
    return out


def _ranges(lows: Sequence[int], top: int) -> list[tuple[int, int]]:
    """Inclusive ranges from sorted lower bounds, the last ending at `top`."""
    ends = [lo - 1 for lo in lows[1:]] + [max(top, lows[-1])]
    return list(zip(lows, ends, strict=True))


def _merge(runs: Sequence[EngineRun]) -> tuple[EngineRun, ...]:
    out: list[EngineRun] = []
    for r in runs:
        if r.batch[0] > r.batch[1]:
            continue
        if out and out[-1].policy == r.policy and out[-1].batch[1] + 1 == r.batch[0]:
            out[-1] = EngineRun((out[-1].batch[0], r.batch[1]), r.policy)
        else:
            out.append(r)
    return tuple(out)


def _sglang(config: Mapping[str, Any], where: str) -> tuple[EngineRun, ...]:
    m = _int(config, "max_running_requests", where, 1)
    args = config.get("server_args") or {}
    if not isinstance(args, Mapping):
        raise SpecError(f"{where}: field 'server_args' must be an object")
    if not args:
        return (EngineRun((1, m), None),)
    steps = _int(args, "speculative_num_steps", where, 1)
    topk = _int(args, "speculative_eagle_topk", where, 1)
    tokens = _int(args, "speculative_num_draft_tokens", where, 2)
    adaptive = config.get("adaptive")
    if not adaptive:
        return (EngineRun((1, m), TreePolicy("dynamic-topk", steps, topk, tokens)),)
    if not isinstance(adaptive, Mapping):
        raise SpecError(f"{where}: field 'adaptive' must map batch sizes to candidate_steps")
    by_lo: dict[int, int] = {}
    for k, entry in adaptive.items():
        lo = _count(k, "an adaptive key (batch size)", where, 1, key=True)
        cand = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        if not isinstance(cand, list) or not cand:
            raise SpecError(f"{where}: adaptive[{k}].candidate_steps must be a non-empty list")
        by_lo[lo] = max(_count(c, f"adaptive[{k}].candidate_steps", where) for c in cand)
    lows = sorted(by_lo)
    runs = [EngineRun((lo, hi), _chain(by_lo[lo])) for lo, hi in _ranges(lows, m)]
    return _merge(runs)


def _vllm(config: Mapping[str, Any], where: str) -> tuple[EngineRun, ...]:
    m = _int(config, "max_num_seqs", where, 1)
    cfg = config.get("speculative_config")
    if not cfg:
        return (EngineRun((1, m), None),)
    if not isinstance(cfg, Mapping):
        raise SpecError(f"{where}: field 'speculative_config' must be an object or null")
    k_max = _int(cfg, "num_speculative_tokens", where, 1)
    tree = cfg.get("speculative_token_tree")
    if tree:
        import ast

        text = str(tree)
        try:
            parsed = ast.literal_eval(text) if len(text) <= 1 << 16 else None
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            parsed = None
        paths = _paths(parsed, "speculative_token_tree", where)
        topk = 1 + max(max(p) for p in paths)
        return (EngineRun((1, m), TreePolicy("static", k_max, topk, len(paths) + 1)),)
    ranges = cfg.get("num_speculative_tokens_per_batch_size")
    if not ranges:
        return (EngineRun((1, m), _chain(k_max)),)
    what = "num_speculative_tokens_per_batch_size"
    if not isinstance(ranges, list | tuple):
        raise SpecError(f"{where}: {what} must be a list of [lo, hi, K]")
    runs = []
    for r in ranges:
        if not isinstance(r, list | tuple) or len(r) != 3:
            raise SpecError(f"{where}: {what} entry {r!r} is not [lo, hi, K]")
        lo, hi, k = (_count(x, what, where) for x in r)
        runs.append(EngineRun((lo, min(hi, m)), _chain(min(k, k_max))))
    if runs[-1].batch[1] < m:  # the last range's value carries past its end
        runs.append(EngineRun((runs[-1].batch[1] + 1, m), runs[-1].policy))
    return _merge(runs)


def _trtllm(config: Mapping[str, Any], profile: EngineProfile, where: str) -> tuple[EngineRun, ...]:
    m = _int(config, "max_batch_size", where, 1)
    cfg = config.get("speculative_config")
    if not cfg:
        return (EngineRun((1, m), None),)
    if not isinstance(cfg, Mapping):
        raise SpecError(f"{where}: field 'speculative_config' must be an object or null")
    d_max = _int(cfg, "max_draft_len", where, 1)
    choices = cfg.get("eagle_choices")
    if choices is not None:
        choices = _paths(choices, "eagle_choices", where)

    def policy(d: int) -> TreePolicy | None:
        if d <= 0:
            return None
        if choices:
            topk = 1 + max(max(c) for c in choices)
            return TreePolicy("static", d, topk, len(choices) + 1)
        if cfg.get("use_dynamic_tree"):
            topk = _int(cfg, "dynamic_tree_max_topK", where, 1)
            total = _int(cfg, "max_total_draft_tokens", where, 1)
            return EngineShape(topk, total + 1, ()).policy(d)
        return _chain(d)

    sched = cfg.get("draft_len_schedule")
    if not sched:
        return (EngineRun((1, m), policy(d_max)),)
    if not isinstance(sched, Mapping):
        raise SpecError(f"{where}: field 'draft_len_schedule' must map batch sizes to lengths")
    value = {
        _count(k, "a draft_len_schedule key", where, 1, key=True): _count(
            v, "a draft length", where
        )
        for k, v in sched.items()
    }
    keys = sorted(value)
    floor = profile.schedule_min_steps
    runs: list[EngineRun] = []
    if profile.schedule == "lower-bound":
        if keys[0] > 1:
            runs.append(EngineRun((1, keys[0] - 1), policy(d_max)))
        for lo, hi in _ranges(keys, m):
            runs.append(EngineRun((lo, min(hi, m)), policy(max(value[lo], floor))))
    else:  # upper bounds: batch <= key gets the value; past the largest key, 0
        lo = 1
        for k in keys:
            runs.append(EngineRun((lo, min(k, m)), policy(max(value[k], floor))))
            lo = k + 1
        if lo <= m:
            runs.append(EngineRun((lo, m), policy(floor)))
    return _merge(runs)


def engine_runs(
    engine: str,
    config: Mapping[str, Any],
    profile: EngineProfile | str | None = None,
    *,
    where: str = "export config",
) -> tuple[EngineRun, ...]:
    """The policy per batch range (ascending, contiguous from batch 1) that `engine` runs with
    an exporter's resolved `config` (Export.config); `profile` gives TensorRT-LLM's schedule
    semantics (default: the engine's preset). A malformed config is a SpecError naming `where`."""
    if not isinstance(config, Mapping):
        raise SpecError(f"{where}: the config must be an object")
    if engine == "sglang":
        runs = _sglang(config, where)
    elif engine == "vllm":
        runs = _vllm(config, where)
    elif engine == "trtllm":
        runs = _trtllm(config, load_engine(profile or "trtllm"), where)
    else:
        raise SpecError(f"{where}: engine {engine!r} has no export (sglang, vllm, trtllm)")
    if not runs or runs[0].batch[0] != 1:
        raise SpecError(f"{where}: the {engine} config does not cover batch size 1")
    for a, b in pairwise(runs):
        if b.batch[0] != a.batch[1] + 1:
            raise SpecError(f"{where}: batch ranges {a.batch} and {b.batch} leave a gap or overlap")
    return runs


def runs_table(runs: Sequence[EngineRun], base: PolicyTable) -> PolicyTable:
    """The runs as a PolicyTable for `base`'s scenario (its target, drafter, GPU, TP, workload),
    one bucket per batch range at every context (what simulate and the objective read).
    A sidecar's scenario runs on its engine: its profile's host overheads price every step."""
    for a, b in pairwise(runs):
        if b.batch[0] != a.batch[1] + 1:
            raise SpecError(f"engine runs {a.batch} and {b.batch} leave a gap or overlap")
    buckets = tuple(Bucket(r.batch, ANY_CONTEXT, r.policy) for r in runs)
    return PolicyTable(
        target=base.target,
        drafter=base.drafter,
        hardware=base.hardware,
        buckets=buckets,
        tp=base.tp,
        workload=base.workload,
        temperature=base.temperature,
        provenance=dict(base.provenance),
        scenario=base.scenario,
    )


def is_sidecar(doc: Any) -> bool:
    """Whether a parsed JSON document is an export's sidecar (schema spectune.export/v1)."""
    return isinstance(doc, Mapping) and doc.get("schema") == SIDECAR_SCHEMA


def sidecar_table(doc: Mapping[str, Any], where: str) -> PolicyTable:
    """The PolicyTable an export's sidecar runs: its source scenario (target, drafter, GPU, TP,
    workload) and the engine's runs of its config."""
    src = doc.get("source")
    if not isinstance(src, Mapping):
        raise SpecError(f"{where}: field 'source' must be an object")
    names = {}
    for key in ("target", "drafter", "hardware", "workload"):
        v = src.get(key)
        if not isinstance(v, str):
            raise SpecError(f"{where}: field 'source.{key}' must be a string, got {v!r}")
        names[key] = v
    tp = _int(src, "tp", where, 1)
    engine = doc.get("engine")
    profile = doc.get("profile")
    if not isinstance(engine, str) or not isinstance(profile, str):
        raise SpecError(f"{where}: fields 'engine' and 'profile' must be strings")
    base = PolicyTable(
        target=names["target"],
        drafter=names["drafter"],
        hardware=names["hardware"],
        buckets=(Bucket((1, 1), ANY_CONTEXT, None),),
        tp=tp,
        workload=names["workload"],
        provenance={"export": where, "engine": profile},
        scenario=Scenario(
            target=names["target"],
            drafter=names["drafter"] or NO_DRAFTER,
            gpu=names["hardware"],
            tp=tp,
            workload=names["workload"],
            engine=profile,
        ),
    )
    config = _sidecar_config(engine, doc)
    return runs_table(engine_runs(engine, config, profile, where=where), base)


def _sidecar_config(engine: str, doc: Mapping[str, Any]) -> Mapping[str, Any]:
    """A sidecar's `config` as the exporter's resolved config: SGLang's sidecar holds it
    whole; vLLM's holds the speculative_config, its max_num_seqs is in the launch argv."""
    config = doc.get("config")
    if engine != "vllm":
        return config if isinstance(config, Mapping) else {}
    launch = doc.get("launch")
    argv = [str(a) for a in launch] if isinstance(launch, list) else []
    m = 1 << 20
    if "--max-num-seqs" in argv[:-1]:
        text = argv[argv.index("--max-num-seqs") + 1]
        m = int(text) if text.isdigit() else m
    return {"speculative_config": config, "max_num_seqs": m}


def load_export(path: str | os.PathLike[str]) -> PolicyTable:
    """The PolicyTable an export's sidecar file (`*.spectune.json`) runs."""
    p = Path(path)
    doc = loads_json(read_bytes_bounded(p), str(p))
    if not is_sidecar(doc):
        raise SpecError(f"{p}: not an export sidecar (schema {SIDECAR_SCHEMA})")
    return sidecar_table(doc, str(p))


__all__ = [
    "SIDECAR_SCHEMA",
    "EngineRun",
    "engine_runs",
    "is_sidecar",
    "load_export",
    "runs_table",
    "sidecar_table",
]
