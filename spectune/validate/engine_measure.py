"""Engine measurement documents: what a serving engine measured, in one schema a fit can read.

A document (schema spectune.engine-measurement/v1) holds one engine configuration and the points
measured with it, from parsed engine output (validate.engine_logs) or from a figure an engine
project published:

    {"schema": "spectune.engine-measurement/v1",
     "engine": "sglang" | "vllm" | "trtllm", "engine_version": str | null,
     "target": model name or path, "drafter": str | null (null: no separate drafter, e.g. MTP),
     "gpu": HardwareSpec preset name where one exists (h100-sxm, h200, a100-80g, mi300x), else
            the GPU as published (b200, ...), "gpu_count": int (GPUs per replica, >= tp),
     "tp": int, "spec": {"method": str, "num_steps": int | null, "topk": int | null,
                         "num_draft_tokens": int | null} | null (speculation off),
     "workload": str | null (data set or preset name),
     "target_preset", "drafter_preset": ModelSpec preset names, optional (where `target` /
            `drafter` name no preset's hf_repo),
     "source": {"kind": "log" | "metrics" | "benchmark" | "published",
                "files": [str] (parsed), "url": str, "title": str (published)},
     "points": [{"batch": int | null (requests decoded together), "concurrency": int | null
                 (benchmark's max requests in flight), "tokens_per_s": all requests' output
                 tokens/s, "tokens_per_s_per_user": one request's output tokens/s,
                 "accept_length": tokens per verify step incl. the bonus (>= 1),
                 "accept_rate": 0..1, "per_position_accept": [0..1], "baseline_tokens_per_s":
                 the same setup without speculation, "speedup": over that baseline,
                 "input_len": int, "output_len": int, "context": cached tokens per request
                 (SGLang's #token / #running-req), "tpot_ms": float, "ttft_ms": float,
                 "where": "file:line" (parsed), "quote": the published sentence (published),
                 "num_prompts": int (the benchmark's requests), "miss_cause" /
                 "baseline_miss_cause": str (why this figure / its baseline is known to miss;
                 it stays in the fit, and a miss prints this as its cause)}],
     "serving_benchmark": {"tool": "sglang.bench_serving", "random_input_len": int,
                           "random_output_len": int, "random_range_ratio": 0..1, "seed": int}
            (optional: the benchmark run behind the points, whose request lengths
            validate.serving_bench reproduces),
     "notes": str,
     "known_miss": str (optional: why spectune cannot predict this document; check reports its
                   points without gating on them, the preset fit leaves it out)}

Every number is finite and in range; a point has at least one of tokens_per_s,
tokens_per_s_per_user, accept_length or speedup. Errors name the field and the file.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from spectune.specs import SpecError, write_json_atomic
from spectune.specs.io import help_field, read_mapping
from spectune.specs.scenario import Scenario
from spectune.validate.engine_logs import EngineObservation
from spectune.validate.serving_bench import MAX_PROMPTS, serving_benchmark

SCHEMA = "spectune.engine-measurement/v1"
ENGINES = ("sglang", "vllm", "trtllm")
SOURCE_KINDS = ("log", "metrics", "benchmark", "published")
_POINT_INTS = ("batch", "concurrency", "input_len", "output_len", "num_prompts")
_POINT_TEXTS = ("miss_cause", "baseline_miss_cause")
_POINT_POSITIVE = (
    "tokens_per_s",
    "tokens_per_s_per_user",
    "baseline_tokens_per_s",
    "speedup",
    "tpot_ms",
    "ttft_ms",
    "context",
)
_POINT_FIGURES = ("tokens_per_s", "tokens_per_s_per_user", "accept_length", "speedup")
_SPEC_INTS = ("num_steps", "topk", "num_draft_tokens")


@dataclass(frozen=True)
class EngineRun:
    """What the user knows about the run the files came from; fills what the files do not state
    and must agree with what they do."""

    engine: str = help_field(help="engine: sglang, vllm or trtllm")
    gpu: str = help_field(help="GPU: HardwareSpec preset name (h100-sxm, h200, ...)")
    engine_version: str | None = help_field(None, help="engine version, e.g. 0.5.10")
    target: str | None = help_field(None, help="target model name or path")
    drafter: str | None = help_field(None, help="drafter model name or path; None: none")
    tp: int | None = help_field(None, help="tensor-parallel degree")
    method: str | None = help_field(None, help="speculative method as the engine names it")
    num_steps: int | None = help_field(None, help="draft steps per iteration")
    topk: int | None = help_field(None, help="branching per draft step")
    num_draft_tokens: int | None = help_field(None, help="tokens verified per request per step")
    workload: str | None = help_field(None, help="data set or workload preset name")
    batch: int | None = help_field(
        None, help="batch size of a one-batch benchmark whose file does not record it"
    )
    input_len: int | None = help_field(None, help="prompt tokens per request, when not recorded")
    output_len: int | None = help_field(None, help="output tokens per request, when not recorded")

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise SpecError(
                f"engine run: engine must be one of {', '.join(ENGINES)}, got {self.engine!r}"
            )
        for name in (
            "tp",
            "num_steps",
            "topk",
            "num_draft_tokens",
            "batch",
            "input_len",
            "output_len",
        ):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SpecError(f"engine run: {name} must be a positive integer, got {v!r}")

    @classmethod
    def from_scenario(cls, scenario: Scenario, **fields: Any) -> EngineRun:
        """The run of a Scenario (engine, target, drafter, gpu, tp) plus `fields`."""
        base = dict(
            engine=scenario.engine,
            target=scenario.target,
            drafter=scenario.drafter,
            gpu=scenario.gpu,
            tp=scenario.tp,
            workload=scenario.workload,
        )
        return cls(**{**base, **fields})


def _agree(name: str, given: Any, stated: Any, where: str) -> Any:
    if given is not None and stated is not None and str(given) != str(stated):
        raise SpecError(
            f"{where}: the file states {name} = {stated!r}, the run says {given!r}; fix the run"
        )
    return stated if stated is not None else given


def _resolve(run: EngineRun, o: EngineObservation) -> EngineRun:
    """`run` with what observation `o` states, SpecError where the two disagree."""
    c, w = o.config, o.where
    if o.engine != run.engine:
        raise SpecError(f"{w}: a {o.engine} file for a {run.engine} run")
    return replace(
        run,
        engine_version=_agree("engine_version", run.engine_version, c.engine_version, w),
        target=_agree("target", run.target, c.target_model, w),
        drafter=_agree("drafter", run.drafter, c.draft_model, w),
        tp=_agree("tp", run.tp, c.tp, w),
        method=_agree("method", run.method, c.method, w),
        num_steps=_agree("num_steps", run.num_steps, c.num_steps, w),
        topk=_agree("topk", run.topk, c.topk, w),
        num_draft_tokens=_agree("num_draft_tokens", run.num_draft_tokens, c.num_draft_tokens, w),
    )


def _point(o: EngineObservation, run: EngineRun) -> dict[str, Any]:
    batch = o.batch if o.batch is not None else run.batch
    out_len = o.output_len_tokens if o.output_len_tokens is not None else run.output_len
    tps = o.gen_tokens_per_s
    kv = dict(o.extra).get("#token")  # SGLang: KV tokens of the running requests
    context = float(kv) / o.batch if kv and kv.isdigit() and int(kv) > 0 and o.batch else None
    if tps is None and o.latency_s and batch and out_len:
        tps = batch * out_len / o.latency_s  # one-batch latency run: the whole batch's output
    p: dict[str, Any] = {
        "batch": batch,
        "concurrency": o.concurrency,
        "tokens_per_s": tps,
        "accept_length": o.accept_length,
        "accept_rate": o.accept_rate,
        "per_position_accept": list(o.per_position_accept),
        "input_len": o.input_len_tokens if o.input_len_tokens is not None else run.input_len,
        "output_len": out_len,
        "context": context,
        "tpot_ms": o.mean_tpot_ms,
        "ttft_ms": o.mean_ttft_ms,
        "where": o.where,
    }
    return {k: v for k, v in p.items() if v is not None and v != []}


_KIND = {"interval": "log", "counters": "metrics", "benchmark": "benchmark"}


def engine_measurement_docs(
    observations: Iterable[EngineObservation], run: EngineRun, *, notes: str = ""
) -> list[dict[str, Any]]:
    """Documents from parsed observations: one per (format, resolved configuration), points in
    file order. Observations without a figure (no throughput, accept length or latency) are left
    out. SpecError when the target stays unknown or a file contradicts the run."""
    groups: dict[tuple[Any, ...], dict[str, Any]] = {}
    for o in observations:
        r = _resolve(run, o)
        if r.target is None:
            raise SpecError(f"{o.where}: the file does not name the target model; pass it")
        point = _point(o, r)
        if not any(k in point for k in _POINT_FIGURES):
            continue
        spec = None
        if o.speculative:
            spec = {k: getattr(r, k) for k in ("method", *_SPEC_INTS)}
            spec["method"] = spec["method"] or "unknown"
        key = (o.format, r, o.speculative)
        doc = groups.get(key)
        if doc is None:
            doc = groups[key] = {
                "schema": SCHEMA,
                "engine": r.engine,
                "engine_version": r.engine_version,
                "target": r.target,
                "drafter": r.drafter if spec else None,
                "gpu": r.gpu,
                "tp": r.tp or 1,
                "spec": spec,
                "workload": r.workload,
                "source": {"kind": _KIND[o.kind], "format": o.format, "files": []},
                "points": [],
                "notes": notes,
            }
        if o.file not in doc["source"]["files"]:
            doc["source"]["files"].append(o.file)
        doc["points"].append(point)
    docs = list(groups.values())
    for d in docs:
        validate_engine_measurement(d, "engine measurement")
    return docs


def _number(v: Any, where: str, name: str) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        raise SpecError(f"{where}: field {name!r} must be a finite number, got {v!r}")
    return float(v)


def _check_point(p: Any, w: str, published: bool) -> None:
    if not isinstance(p, dict):
        raise SpecError(f"{w}: expected an object")
    for k in _POINT_INTS:
        v = p.get(k)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise SpecError(f"{w}: field {k!r} must be a positive integer, got {v!r}")
    for k in _POINT_POSITIVE:
        if p.get(k) is not None and _number(p[k], w, k) <= 0:
            raise SpecError(f"{w}: field {k!r} must be positive, got {p[k]!r}")
    if p.get("accept_length") is not None and _number(p["accept_length"], w, "accept_length") < 1:
        raise SpecError(f"{w}: field 'accept_length' counts the bonus token: must be >= 1")
    if (
        p.get("accept_rate") is not None
        and not 0 <= _number(p["accept_rate"], w, "accept_rate") <= 1
    ):
        raise SpecError(f"{w}: field 'accept_rate' must be in [0, 1]")
    pos = p.get("per_position_accept", [])
    if not isinstance(pos, list) or any(
        not 0 <= _number(x, w, "per_position_accept") <= 1 for x in pos
    ):
        raise SpecError(f"{w}: field 'per_position_accept' must be a list of numbers in [0, 1]")
    if not any(p.get(k) is not None for k in _POINT_FIGURES):
        raise SpecError(f"{w}: a point needs one of {', '.join(_POINT_FIGURES)}")
    for k in _POINT_TEXTS:
        if k in p and not (isinstance(p[k], str) and p[k]):
            raise SpecError(f"{w}: field {k!r} must be a non-empty string (the cause)")
    if "baseline_miss_cause" in p and p.get("baseline_tokens_per_s") is None:
        raise SpecError(f"{w}: field 'baseline_miss_cause' without a 'baseline_tokens_per_s'")
    need = "quote" if published else "where"
    if not isinstance(p.get(need), str) or not p[need]:
        raise SpecError(f"{w}: field {need!r} must be a non-empty string")


def validate_engine_measurement(doc: Any, where: str = "engine measurement") -> None:
    """SpecError, naming the field and `where`, unless `doc` is a valid engine measurement."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise SpecError(f"{where}: not a {SCHEMA} document")
    for key in ("engine", "target", "gpu"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise SpecError(f"{where}: field {key!r} must be a non-empty string")
    if doc["engine"] not in ENGINES:
        raise SpecError(f"{where}: field 'engine' must be one of {', '.join(ENGINES)}")
    if "known_miss" in doc and not (isinstance(doc["known_miss"], str) and doc["known_miss"]):
        raise SpecError(f"{where}: field 'known_miss' must be a non-empty string (the cause)")
    for key in ("engine_version", "drafter", "workload", "target_preset", "drafter_preset"):
        if doc.get(key) is not None and not isinstance(doc[key], str):
            raise SpecError(f"{where}: field {key!r} must be a string or null")
    tp = doc.get("tp")
    if isinstance(tp, bool) or not isinstance(tp, int) or not 1 <= tp <= 64:
        raise SpecError(f"{where}: field 'tp' must be an integer in 1..64, got {tp!r}")
    gc = doc.get("gpu_count", tp)
    if isinstance(gc, bool) or not isinstance(gc, int) or gc < tp:
        raise SpecError(f"{where}: field 'gpu_count' must be an integer >= tp, got {gc!r}")
    spec = doc.get("spec")
    if spec is not None:
        if not isinstance(spec, dict) or not isinstance(spec.get("method"), str):
            raise SpecError(f"{where}: field 'spec' must be null or an object with a 'method'")
        for k in _SPEC_INTS:
            v = spec.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SpecError(f"{where}: field 'spec.{k}' must be a positive integer, got {v!r}")
    serving_benchmark(doc, where)
    src = doc.get("source")
    if not isinstance(src, dict) or src.get("kind") not in SOURCE_KINDS:
        raise SpecError(f"{where}: field 'source.kind' must be one of {', '.join(SOURCE_KINDS)}")
    published = src["kind"] == "published"
    if published and not str(src.get("url", "")).startswith("https://"):
        raise SpecError(f"{where}: field 'source.url' must be an https URL for a published figure")
    if not published and not (isinstance(src.get("files"), list) and src["files"]):
        raise SpecError(f"{where}: field 'source.files' must list the files parsed")
    points = doc.get("points")
    if not isinstance(points, list) or not points:
        raise SpecError(f"{where}: field 'points' must be a non-empty list")
    for i, p in enumerate(points):
        _check_point(p, f"{where}: points[{i}]", published)
        if p.get("num_prompts") is not None and p["num_prompts"] > MAX_PROMPTS:
            raise SpecError(
                f"{where}: points[{i}]: field 'num_prompts' must be at most {MAX_PROMPTS}"
            )
        if spec is None and p.get("accept_length") not in (None, 1, 1.0):
            raise SpecError(f"{where}: points[{i}]: an accept length without a 'spec'")


def load_engine_measurement(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate one document; errors name the file."""
    doc = read_mapping(path)
    validate_engine_measurement(doc, str(path))
    return doc


def write_engine_measurement(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Validate and write one document atomically."""
    validate_engine_measurement(dict(doc), str(path))
    write_json_atomic(path, dict(doc))
