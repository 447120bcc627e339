"""Engine measurement points that spectune can price, and the price of each.

The fit of engine overheads (validate.engine_fit), `spectune check` and the engine benchmark
read the same thing out of a spectune.engine-measurement/v1 document: per measured point, the
configuration the cost model needs (GPU, target, drafter, TP, batch, context, draft steps,
top-k, tree tokens, accept length) and the measured output tokens per second of the whole
batch. `points_from_document` turns a document into `EnginePoint`s, and each point it cannot
price into a `Skipped` that says why (a GPU without a HardwareSpec preset, a model without a
ModelSpec preset, no throughput figure, a speculative configuration neither stated nor
defaulted by the engine).

A point's step time is what its throughput implies:

    measured_step_s = batch * accept_length / tokens_per_s       (accept_length 1: no speculation)

and `gpu_step_s` prices the same step with CostModel.iteration on engine-free host costs (the
engine's own host time is what the fit adds back: engine_s = EngineOverheads.iteration_s_for).
A point's accept length is the measured one where the document has it, else the acceptance
model's expectation for the tree under the document's workload (`accept_measured` False).

Resolution rules (stated, since published figures leave things out):
- target / drafter: the document's `target_preset` / `drafter_preset`, else the ModelSpec
  preset whose `hf_repo` equals the document's `target` / `drafter`;
- batch: the point's batch; else, for a mean-TPOT figure (tokens_per_s_per_user) of a document
  whose `serving_benchmark` the run replays (validate.serving_bench) with the point's
  `num_prompts` and `concurrency` cap, the request-weighted mean decode batch of that run
  (rounded), which is what a mean over requests of their TPOT reflects; else its concurrency (a
  serving benchmark's cap); else 1;
- context: the point's `context`, else input_len + output_len / 2, else the workload's mean
  prompt + half its mean output;
- steps / top-k / tree tokens: the document's spec, else the engine profile's defaults; top-k 1
  verifies a chain of steps + 1 tokens.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from spectune.specs import SpecError, TreePolicy
from spectune.specs.engine import EngineProfile
from spectune.specs.hardware import HARDWARE_PRESETS
from spectune.specs.model import MODEL_PRESETS, ModelSpec
from spectune.specs.workload import Workload, load_workload
from spectune.validate.serving_bench import (
    ServingBenchmark,
    mean_tpot_batch,
    random_lengths,
    serving_benchmark,
)

if TYPE_CHECKING:
    from spectune.validate.engine_logs import EngineObservation
    from spectune.validate.engine_measure import EngineRun

DEFAULT_WORKLOAD = "mt-bench"
ACCEPT_SAMPLES = 2000
"""Trees averaged per predicted accept length (spread about 0.3% of the value)."""


@dataclass(frozen=True)
class EnginePoint:
    """One measured step configuration and its measured throughput."""

    source: str  # the document (file) the point comes from: the unit of leave-one-source-out
    where: str  # document point or file:line
    engine: str
    gpu: str  # HardwareSpec preset
    target: str  # ModelSpec preset
    drafter: str | None  # ModelSpec preset; None with speculation off or for n-gram
    tp: int
    batch: int  # requests decoded together
    context_tokens: float  # cached tokens per request
    steps: int  # draft steps per iteration; 0: speculation off
    topk: int
    tree_tokens: int  # tokens verified per request, root included (1: speculation off)
    accept_length: float  # tokens per request per step, bonus included (1: speculation off)
    accept_measured: bool  # False: predicted by the workload's acceptance model
    tokens_per_s: float  # output tokens/s of the whole batch, measured
    workload: str
    per_position_accept: tuple[float, ...] = ()
    drafts: int | None = None
    drafter_kind: str = ""  # ModelSpec.drafter_kind of the drafter ('' with speculation off)
    miss_cause: str = ""  # the document's stated cause of this figure's miss ('' none)

    @property
    def speculative(self) -> bool:
        return self.steps > 0

    @property
    def tree(self) -> bool:
        return self.topk > 1

    @property
    def measured_step_s(self) -> float:
        """Seconds per iteration the measured throughput implies."""
        return self.batch * self.accept_length / self.tokens_per_s

    @property
    def policy(self) -> TreePolicy | None:
        """The tree the engine verifies (dynamic top-k: SGLang's and TensorRT-LLM's EAGLE trees;
        top-k 1 is a chain), None with speculation off."""
        if not self.speculative:
            return None
        return TreePolicy("dynamic-topk", depth=self.steps, topk=self.topk, budget=self.tree_tokens)

    @property
    def label(self) -> str:
        spec = f"{self.steps}/{self.topk}/{self.tree_tokens}" if self.speculative else "off"
        return f"B={self.batch} tp{self.tp} spec {spec} al {self.accept_length:.2f}"


@dataclass(frozen=True)
class Skipped:
    """A point (or a whole document) spectune cannot price, and why."""

    where: str
    reason: str


def _by_repo(name: str | None, *, drafter: bool = False) -> ModelSpec | None:
    if not name:
        return None
    key = name.lower()
    if key in MODEL_PRESETS:
        return MODEL_PRESETS[key]
    hits = [m for m in MODEL_PRESETS.values() if m.hf_repo and m.hf_repo.lower() == key]
    # a repo shared by a target and its MTP module: the module is the drafter
    pick = [m for m in hits if m.is_head == drafter] or hits
    return pick[0] if pick and len(hits) <= 2 else None


def resolve_models(doc: Mapping[str, Any]) -> tuple[ModelSpec | None, ModelSpec | None, str]:
    """(target, drafter, problem): the ModelSpec presets of a document, '' when both resolve
    (a document without speculation, or an n-gram one, needs no drafter)."""
    t_name = doc.get("target_preset") or doc.get("target")
    target = _by_repo(t_name)
    if target is None or target.is_head:
        return None, None, f"target {t_name!r} has no ModelSpec preset (set 'target_preset')"
    spec = doc.get("spec")
    if spec is None or str(spec.get("method", "")).lower() in ("ngram", "n-gram"):
        return target, None, ""
    d_name = doc.get("drafter_preset") or doc.get("drafter")
    drafter = _by_repo(d_name, drafter=True)
    if drafter is None:
        return target, None, f"drafter {d_name!r} has no ModelSpec preset (set 'drafter_preset')"
    return target, drafter, ""


def _spec_shape(doc: Mapping[str, Any], profile: EngineProfile) -> tuple[int, int, int] | str:
    """(steps, topk, tree tokens incl. root) of a speculative document, or why not known."""
    spec = doc["spec"]
    steps = spec.get("num_steps") or profile.default_steps
    topk = spec.get("topk") or profile.default_topk or 1
    if not steps:
        return f"spec.num_steps not stated and {profile.name} has no default draft length"
    if topk == 1:
        return steps, 1, steps + 1
    tokens = spec.get("num_draft_tokens") or profile.default_draft_tokens
    if not tokens:
        return f"spec.num_draft_tokens not stated and {profile.name} has no default"
    # SGLang counts the root in num_draft_tokens; a tree verifies at least 2 tokens
    return steps, topk, max(int(tokens), 2)


def _context(p: Mapping[str, Any], wl: Workload) -> float:
    if p.get("context") is not None:
        return float(p["context"])
    if p.get("input_len") is not None:
        return float(p["input_len"]) + 0.5 * float(p.get("output_len") or 0)
    return wl.prompt_len_mean_tokens + 0.5 * wl.output_len_mean_tokens


def _batch(p: Mapping[str, Any], bench: ServingBenchmark | None) -> int:
    """The decode batch of a point (module docstring, resolution rules)."""
    if p.get("batch"):
        return int(p["batch"])
    cap, prompts = p.get("concurrency"), p.get("num_prompts")
    if bench is not None and cap and prompts and p.get("tokens_per_s_per_user") is not None:
        _, outputs = random_lengths(bench, int(prompts))
        return max(1, round(mean_tpot_batch(outputs, int(cap))))
    return int(cap or 1)


def predicted_accept_length(
    policy: TreePolicy, workload: str, target: ModelSpec, drafter: ModelSpec | None
) -> float:
    """Expected tokens per step (bonus included) of `policy` under the (target, drafter) pair's
    acceptance on `workload` (warnings of a nearest-preset pair are the caller's to show)."""
    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import expected_tokens_for_policy

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wl = load_workload(workload, target=target, drafter=drafter)
    return float(expected_tokens_for_policy(policy, acceptance_model(wl), samples=ACCEPT_SAMPLES))


def points_from_document(
    doc: Mapping[str, Any], source: str, profile: EngineProfile
) -> tuple[list[EnginePoint], list[Skipped]]:
    """The priced points of one validated engine-measurement document, and what was skipped.

    A point with `baseline_tokens_per_s` also yields a speculation-off point at the same batch.
    Points without tokens_per_s (or tokens_per_s_per_user at a known batch) are skipped."""
    target, drafter, problem = resolve_models(doc)
    gpu = str(doc["gpu"]).lower()
    if gpu not in HARDWARE_PRESETS:
        return [], [Skipped(source, f"GPU {doc['gpu']!r} has no HardwareSpec preset")]
    if target is None or problem:
        return [], [Skipped(source, problem)]
    wl_name = doc.get("workload") or DEFAULT_WORKLOAD
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            wl = load_workload(wl_name, target=target, drafter=drafter)
    except SpecError:
        wl_name = DEFAULT_WORKLOAD
        wl = load_workload(wl_name)
    steps, topk, tokens = 0, 1, 1
    if doc.get("spec") is not None:
        shape = _spec_shape(doc, profile)
        if isinstance(shape, str):
            return [], [Skipped(source, shape)]
        steps, topk, tokens = shape
    tp = int(doc["tp"])
    points: list[EnginePoint] = []
    skipped: list[Skipped] = []
    accept_cache: dict[TreePolicy, float] = {}
    bench = serving_benchmark(doc, source)
    for i, p in enumerate(doc["points"]):
        where = p.get("where") or f"{source}: points[{i}]"
        batch = _batch(p, bench)
        tps = p.get("tokens_per_s")
        if tps is None and p.get("tokens_per_s_per_user") is not None:
            tps = float(p["tokens_per_s_per_user"]) * batch
        common: dict[str, Any] = dict(
            source=source,
            engine=doc["engine"],
            gpu=gpu,
            target=target.name,
            tp=tp,
            batch=batch,
            context_tokens=_context(p, wl),
            workload=wl_name,
        )
        if p.get("baseline_tokens_per_s") is not None:
            points.append(
                EnginePoint(
                    where=f"{where} (baseline)",
                    drafter=None,
                    steps=0,
                    topk=1,
                    tree_tokens=1,
                    accept_length=1.0,
                    accept_measured=True,
                    tokens_per_s=float(p["baseline_tokens_per_s"]),
                    miss_cause=str(p.get("baseline_miss_cause", "")),
                    **common,
                )
            )
        if tps is None:
            skipped.append(Skipped(where, "no tokens_per_s figure (a speedup alone)"))
            continue
        if steps == 0:
            al, measured = 1.0, True
        elif p.get("accept_length") is not None:
            al, measured = float(p["accept_length"]), True
        else:
            pol = TreePolicy("dynamic-topk", depth=steps, topk=topk, budget=tokens)
            if pol not in accept_cache:
                accept_cache[pol] = predicted_accept_length(pol, wl_name, target, drafter)
            al, measured = accept_cache[pol], False
        if not math.isfinite(al) or al < 1:
            skipped.append(Skipped(where, f"accept length {al!r} out of range"))
            continue
        points.append(
            EnginePoint(
                where=where,
                drafter=drafter.name if drafter is not None and steps else None,
                drafter_kind=drafter.drafter_kind if drafter is not None and steps else "",
                steps=steps,
                topk=topk,
                tree_tokens=tokens,
                accept_length=al,
                accept_measured=measured,
                tokens_per_s=float(tps),
                per_position_accept=tuple(p.get("per_position_accept", ())),
                miss_cause=str(p.get("miss_cause", "")),
                **common,
            )
        )
    return points, skipped


class GpuPricer:
    """Engine-free step prices of points: one CostModel per (gpu, target, drafter, tp)."""

    def __init__(self) -> None:
        self._models: dict[tuple[str, str, str | None, int], Any] = {}

    def step_s(self, p: EnginePoint) -> float:
        """CostModel.iteration(...).total_s of the point's step with no engine host time, the
        draft extend over the accept length (an unpadded pass, as the objective prices it)."""
        from spectune.planner.costmodel import CostModel
        from spectune.specs import load_hardware, load_model

        key = (p.gpu, p.target, p.drafter, p.tp)
        cm = self._models.get(key)
        if cm is None:
            drafter = load_model(p.drafter) if p.drafter else None
            cm = CostModel(load_hardware(p.gpu), load_model(p.target), drafter, tp=p.tp)
            self._models[key] = cm
        pol = p.policy
        if pol is None:
            t = cm.iteration(None, p.batch, p.context_tokens).total_s
        else:
            t = cm.iteration(
                pol, p.batch, p.context_tokens, tokens=p.tree_tokens, accepted=p.accept_length
            ).total_s
        return float(t.reshape(-1)[0]) if t.ndim else float(t)


def points_from_files(
    files: Sequence[str],
    baseline: Sequence[str],
    run: EngineRun,
    profile: EngineProfile,
    *,
    target: ModelSpec,
    drafter: ModelSpec | None,
) -> tuple[list[EngineObservation], list[dict[str, Any]], list[EnginePoint], list[Skipped]]:
    """(observations, engine measurement documents, priced points, skipped) of engine output
    files (each must hold speculative records) and speculation-off `baseline` files, read as
    streams and merged per configuration and batch size (engine_logs.aggregate: memory grows
    with the configurations a log holds, not its length). The documents name `target` /
    `drafter` as their presets. A run without a stated target takes the target preset's
    hf_repo (else its name)."""
    from spectune.validate.engine_logs import iter_observations
    from spectune.validate.engine_logs.aggregate import aggregate
    from spectune.validate.engine_measure import engine_measurement_docs

    obs = aggregate(iter_observations(files, require_speculative=True))
    if baseline:
        obs += aggregate(iter_observations(baseline, require_speculative=False))
    if run.target is None and not any(o.config.target_model for o in obs):
        run = dataclasses.replace(run, target=target.hf_repo or target.name)
    docs = engine_measurement_docs(obs, run, notes="spectune fit-engine")
    points: list[EnginePoint] = []
    skipped: list[Skipped] = []
    for i, d in enumerate(docs):
        d["target_preset"] = target.name
        if d["spec"] is not None and drafter is not None:
            d["drafter_preset"] = drafter.name
        pts, sk = points_from_document(d, f"{', '.join(d['source']['files'])} [{i}]", profile)
        points += pts
        skipped += sk
    return obs, docs, points, skipped
