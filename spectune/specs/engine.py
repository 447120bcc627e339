"""What a serving engine can run and what it adds to each decoding iteration.

`EngineProfile` describes one engine over one version range: whether it verifies trees or only
chains, its rules on top-k / draft steps / draft tokens, whether a per-batch-size schedule
exists and what its keys mean, the caps it imposes once speculation is on (max running
requests, CUDA-graph batch sizes), the drafters it runs, its default speculative config, and
its host overheads (`EngineOverheads`, below). Presets live in spectune/specs/engine_data/, one
JSON file each, every number with the engine source file (and version) or the published figure
it comes from in the file's `cite` table; `load_engine` reads a preset name or a user file,
which may name a preset in `base` and override some of its fields.

The cost model (spectune.planner.costmodel) prices the GPU work of an iteration from the
roofline and a Calibration. A serving engine also spends host time per iteration: its scheduler,
batch preparation, sampling, speculative bookkeeping (draft-step launches, tree masks, accept and
KV bookkeeping), and more of it with more tensor-parallel ranks. Part of that host time overlaps
GPU work (overlap schedulers), and the rest is added to the step. `EngineOverheads` is that model;
`CostModel.iteration` charges `EngineOverheads.iteration_s` as the step's `engine_s` term.

    engine_s = (1 - overlap) * (iteration_s + per_request_s * batch
                                + speculating * (spec_iteration_s + per_draft_step_s * steps
                                                 + tree_s * is_tree
                                                 + drafter_iteration_s[kind]
                                                 + drafter_step_s[kind] * steps))
               * (1 + tp_growth * log2(tp))

`kind` is the drafter's kind (ModelSpec.drafter_kind: eagle3, eagle, mtp, draft-model, ...);
a kind the two tables do not list adds nothing. They hold what an engine does for one drafter
kind only, outside its captured graphs, e.g. vLLM's EAGLE-3 path (vllm 0.33.0): per draft step
`Eagle3LlamaForCausalLM.compute_logits` (model_executor/models/llama_eagle3.py) maps a reduced
draft vocabulary onto the target's (an arange, an add, a [batch, target vocab] fill with -inf,
an index_put scatter) before `_greedy_sample`'s argmax over the whole target vocabulary
(v1/spec_decode/llm_base_proposer.py), all eager; per iteration `propose` runs
`combine_hidden_states` (the fc over the target's 3 concatenated auxiliary hidden states)
eagerly before the drafter's first pass. The preset's `cite` says which are fitted and to what.

The zero profile (every field 0) is spectune's own executor, whose per-step host costs are
already in its Calibration (step_overhead_s, draft_step_s, ...).

What turning speculation on costs before any step is priced (the drafter's weights and KV,
`spec_extra_hbm_bytes`, the `spec_max_running` cap, the `cuda_graph_batches` a batch pads to) is
applied by the planner's capacity logic (spectune.planner.capacity) and its objective.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from spectune.specs.errors import SpecError, unknown_name_error
from spectune.specs.io import from_mapping, help_field, read_mapping


@dataclass(frozen=True)
class EngineOverheads:
    """Host-side seconds an engine adds per decoding iteration (see the module docstring)."""

    iteration_s: float = help_field(
        0.0, help="fixed host cost per iteration, speculation on or off (scheduler, batch prep), s"
    )
    per_request_s: float = help_field(
        0.0, help="host cost per running request per iteration (input prep, detokenize), s"
    )
    spec_iteration_s: float = help_field(
        0.0,
        help="extra fixed host cost per iteration when speculating (verify/accept bookkeeping, "
        "draft-extend setup, KV slot moves), s",
    )
    per_draft_step_s: float = help_field(
        0.0, help="host cost per draft step (launches and syncs the engine does per step), s"
    )
    tree_s: float = help_field(
        0.0, help="extra host cost per iteration of a tree (topk > 1: masks, positions), s"
    )
    overlap: float = help_field(
        0.0,
        help="fraction 0..1 of the host cost hidden behind GPU work (overlap scheduler); "
        "the rest adds to the step",
    )
    tp_growth: float = help_field(
        0.0, help="relative growth of the host cost per doubling of tensor-parallel ranks"
    )
    drafter_iteration_s: Mapping[str, float] = field(
        default_factory=dict,
        metadata={
            "help": "extra cost per speculative iteration for one drafter kind (ModelSpec."
            "drafter_kind -> s; kinds not listed add 0), e.g. eager per-iteration work the engine "
            "runs only for that drafter"
        },
    )
    drafter_step_s: Mapping[str, float] = field(
        default_factory=dict,
        metadata={
            "help": "extra cost per draft step for one drafter kind (ModelSpec.drafter_kind -> "
            "s; kinds not listed add 0), e.g. eager per-step work outside the drafter's graph"
        },
    )

    def __post_init__(self) -> None:
        for name in (
            "iteration_s",
            "per_request_s",
            "spec_iteration_s",
            "per_draft_step_s",
            "tree_s",
            "tp_growth",
        ):
            v = getattr(self, name)
            if not isinstance(v, int | float) or not (0.0 <= float(v) < 1.0):
                raise SpecError(f"EngineOverheads.{name} must be in [0, 1) seconds, got {v!r}")
        if not isinstance(self.overlap, int | float) or not (0.0 <= float(self.overlap) <= 1.0):
            raise SpecError(f"EngineOverheads.overlap must be in [0, 1], got {self.overlap!r}")
        for name in ("drafter_iteration_s", "drafter_step_s"):
            table = getattr(self, name)
            if not isinstance(table, Mapping):
                raise SpecError(
                    f"EngineOverheads.{name} must be a table of drafter kind -> seconds, "
                    f"got {table!r}"
                )
            for kind, v in table.items():
                if kind not in DRAFTERS:
                    raise SpecError(
                        f"EngineOverheads.{name}: unknown drafter kind {kind!r}; known: "
                        f"{', '.join(DRAFTERS)}"
                    )
                if isinstance(v, bool) or not isinstance(v, int | float) or not 0.0 <= v < 1.0:
                    raise SpecError(
                        f"EngineOverheads.{name}[{kind!r}] must be in [0, 1) seconds, got {v!r}"
                    )

    def iteration_s_for(
        self,
        batch: ArrayLike,
        draft_steps: ArrayLike,
        tree: ArrayLike,
        tp: int = 1,
        drafter_kind: str = "",
    ) -> np.ndarray:
        """Seconds added to one iteration of `batch` requests (float64, broadcast): with
        `draft_steps` > 0 the iteration speculates (draft_steps drafter steps), `tree` (bool)
        marks a tree (topk > 1) rather than a chain, `drafter_kind` (ModelSpec.drafter_kind;
        '' none) picks the drafter's own terms."""
        b = np.asarray(batch, dtype=np.float64)
        d = np.asarray(draft_steps, dtype=np.float64)
        is_tree = np.asarray(tree, dtype=np.float64)
        fixed = self.spec_iteration_s + self.drafter_iteration_s.get(drafter_kind, 0.0)
        per_step = self.per_draft_step_s + self.drafter_step_s.get(drafter_kind, 0.0)
        spec = np.where(d > 0, fixed + per_step * d + self.tree_s * is_tree, 0.0)
        host = self.iteration_s + self.per_request_s * b + spec
        scale = 1.0 + self.tp_growth * np.log2(max(int(tp), 1))
        return np.asarray((1.0 - self.overlap) * host * scale, dtype=np.float64)


NO_OVERHEADS = EngineOverheads()
"""spectune's own executor: its host costs are in the Calibration."""


ENGINES = ("sglang", "vllm", "trtllm", "spectune")
DRAFTERS = ("eagle3", "eagle", "mtp", "draft-model", "ngram")
TOKEN_RULES = ("eagle2", "topk-x-steps", "chain", "free")
SCHEDULES = ("none", "adaptive", "ranges", "upper-bound", "lower-bound", "any")
BEYOND = ("last", "off")
ENGINE_DATA_DIR = Path(__file__).with_name("engine_data")


@dataclass(frozen=True)
class EngineProfile:
    """What one serving engine (over one version range) can run, and what it costs."""

    name: str = help_field(help="preset name, e.g. sglang, vllm, trtllm-1.4")
    engine: str = help_field(help=f"engine family: one of {', '.join(ENGINES)}")
    versions: str = help_field(help="version range this profile describes, e.g. '>=0.5.23,<0.6'")
    read_at: str = help_field(help="the release or revision whose source the rules were read from")
    trees: bool = help_field(help="verifies draft trees (top-k > 1); false: chains only")
    max_topk: int = help_field(0, help="largest top-k per draft step (0: no limit)")
    max_steps: int = help_field(0, help="largest number of draft steps (0: no limit)")
    draft_tokens_rule: str = help_field(
        "eagle2",
        help="upper bound on draft tokens (tree tokens - 1) for steps S and top-k K: 'eagle2' "
        "K + (S-1)K^2, 'topk-x-steps' K*S, 'chain' S, 'free' no bound; top-k 1 always means "
        "draft tokens = S",
    )
    schedule: str = help_field(
        "none",
        help="per-batch-size schedule: 'none'; 'adaptive' (SGLang: keys are batch-size lower "
        "bounds, candidate steps per key); 'ranges' (vLLM: inclusive [lo, hi, K]); "
        "'upper-bound' (batch <= key gets the value); 'lower-bound' (largest key <= batch); "
        "'any' (spectune's own table)",
    )
    schedule_varies: str = help_field(
        "steps", help="what the schedule changes per batch range: 'steps' (draft length) or 'all'"
    )
    schedule_topk1_only: bool = help_field(
        False, help="the schedule runs only with top-k 1 (else the engine falls back to static)"
    )
    schedule_min_steps: int = help_field(
        0, help="smallest draft length a schedule entry runs (0: an entry can turn speculation off)"
    )
    schedule_first_is_max: bool = help_field(
        False, help="the smallest schedule key must map to the global maximum draft length"
    )
    schedule_beyond: str = help_field(
        "last", help="batches past the last key/range: 'last' (keep its value) or 'off'"
    )
    schedule_pads_to_cuda_graph: bool = help_field(
        False,
        help="the engine pads the batch to its CUDA-graph batch size before looking up the "
        "schedule (SGLang adaptive)",
    )
    static_tree_choices: bool = help_field(
        False, help="accepts a static tree as a list of paths (eagle_choices, token tree)"
    )
    dynamic_tree: bool = help_field(False, help="grows EAGLE-2 dynamic top-k trees")
    drafters: tuple[str, ...] = help_field(
        ("eagle3",), help=f"drafters the engine runs: subset of {', '.join(DRAFTERS)}"
    )
    default_steps: int = help_field(
        0, help="draft steps when the user sets nothing (0: the engine requires a value)"
    )
    default_topk: int = help_field(0, help="top-k when the user sets nothing (0: none)")
    default_draft_tokens: int = help_field(
        0, help="draft tokens (verify tokens incl. root for SGLang) when unset (0: none)"
    )
    spec_max_running: int = help_field(
        0,
        help="max running requests the engine imposes once speculation is on and the user set "
        "none (0: no speculative cap)",
    )
    default_max_running: int = help_field(
        0, help="the engine's max running requests/batch size default on an 80-141 GB GPU"
    )
    cuda_graph_max_batch: int = help_field(
        0, help="largest decode batch captured in a CUDA graph by default (0: none)"
    )
    cuda_graph_batches: tuple[int, ...] = help_field(
        (), help="decode CUDA-graph batch sizes captured by default (speculation on)"
    )
    spec_extra_hbm_bytes: float = help_field(
        0.0,
        help="engine-specific HBM per GPU for speculation beyond draft weights and draft KV "
        "(which the planner's KV budget holds: planner.capacity), e.g. draft CUDA graphs, bytes; "
        "0: not measured",
    )
    overheads: EngineOverheads = field(
        default_factory=EngineOverheads,
        metadata={"help": "host seconds per iteration (EngineOverheads)"},
    )
    cite: Mapping[str, str] = field(
        default_factory=dict,
        metadata={"help": "field -> source (engine file and version, or published figure)"},
    )
    source: str = help_field("user-provided", help="where this profile comes from")

    def __post_init__(self) -> None:
        if not self.name:
            raise SpecError("field 'name' must be a non-empty string")
        choices = (
            ("engine", ENGINES),
            ("draft_tokens_rule", TOKEN_RULES),
            ("schedule", SCHEDULES),
            ("schedule_beyond", BEYOND),
            ("schedule_varies", ("steps", "all")),
        )
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise SpecError(
                    f"field {name!r} must be one of {', '.join(allowed)}, "
                    f"got {getattr(self, name)!r}"
                )
        for d in self.drafters:
            if d not in DRAFTERS:
                raise SpecError(f"field 'drafters': unknown drafter {d!r}; known: {DRAFTERS}")
        for fld in dataclasses.fields(self):
            v = getattr(self, fld.name)
            if isinstance(v, int | float) and not isinstance(v, bool) and v < 0:
                raise SpecError(f"field {fld.name!r} must be >= 0, got {v!r}")
        if not self.trees and (self.dynamic_tree or self.max_topk > 1):
            raise SpecError(
                "a chain-only profile (trees=false) cannot set dynamic_tree or max_topk > 1"
            )
        if self.schedule_min_steps > 1:
            raise SpecError("field 'schedule_min_steps' must be 0 or 1")
        if list(self.cuda_graph_batches) != sorted(set(self.cuda_graph_batches)):
            raise SpecError("field 'cuda_graph_batches' must be strictly increasing")
        unknown = [k for k in self.cite if k not in _FIELD_NAMES and not k.startswith("overheads")]
        if unknown:
            raise SpecError(f"field 'cite' names unknown field {unknown[0]!r}")

    # ---- what the engine can run ----------------------------------------------------------
    def max_draft_tokens(self, steps: int, topk: int) -> int:
        """Most draft tokens (tree tokens minus the root) `steps` steps of top-k `topk` may
        verify under this engine's rule; top-k 1 is always a chain of `steps` tokens."""
        if topk == 1 or self.draft_tokens_rule == "chain":
            return steps
        if self.draft_tokens_rule == "eagle2":
            return topk + (steps - 1) * topk * topk
        if self.draft_tokens_rule == "topk-x-steps":
            return topk * steps
        return 1 << 20

    @property
    def has_schedule(self) -> bool:
        return self.schedule != "none"

    def cuda_graph_batch(self, batch: int) -> int:
        """The CUDA-graph batch a decode batch of `batch` requests is padded to (itself above
        the largest captured size or when the profile lists none)."""
        for b in self.cuda_graph_batches:
            if b >= batch:
                return b
        return batch


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(EngineProfile))


def _profile_from_mapping(
    data: Mapping[str, Any], where: str, presets: Mapping[str, EngineProfile] | None = None
) -> EngineProfile:
    """Build an EngineProfile from a mapping (a preset or a user file); `base` names a preset
    (of `presets`, default ENGINE_PRESETS) whose fields the mapping overrides, `overheads` is
    a table of EngineOverheads fields, `fit` (optional) records how a fitted profile was made
    (`spectune fit-engine`: data, fitted values and uncertainties) and is not read."""
    data = dict(data)
    base_name = data.pop("base", None)
    fit = data.pop("fit", None)  # provenance of a fitted profile (spectune fit-engine): not read
    if fit is not None and not isinstance(fit, Mapping):
        raise SpecError(f"{where}: field 'fit' must be a table (the fit's provenance)")
    merged: dict[str, Any] = {}
    if base_name is not None:
        if not isinstance(base_name, str):
            raise SpecError(f"{where}: field 'base' must name an engine preset")
        known = ENGINE_PRESETS if presets is None else presets
        if base_name.lower() not in known:
            raise unknown_name_error("engine", base_name, known)
        base = known[base_name.lower()]
        merged = {f: getattr(base, f) for f in _FIELD_NAMES}
        merged["overheads"] = dataclasses.asdict(base.overheads)
        merged["cite"] = dict(base.cite)
        merged["source"] = f"{base.source}; overridden by {where}"
    over = data.pop("overheads", None)
    cite = data.pop("cite", None)
    if over is not None:
        if not isinstance(over, Mapping):
            raise SpecError(f"{where}: field 'overheads' must be a table of EngineOverheads fields")
        merged["overheads"] = {**merged.get("overheads", {}), **over}
    if cite is not None:
        if not isinstance(cite, Mapping) or not all(isinstance(v, str) for v in cite.values()):
            raise SpecError(f"{where}: field 'cite' must map field names to source strings")
        merged["cite"] = {**merged.get("cite", {}), **cite}
    merged.update(data)
    oh = merged.pop("overheads", {})
    cites = merged.pop("cite", {})
    overheads = from_mapping(EngineOverheads, oh, f"{where}: field 'overheads'")
    profile = from_mapping(EngineProfile, merged, where)
    try:
        return dataclasses.replace(profile, overheads=overheads, cite=dict(cites))
    except SpecError as e:
        raise SpecError(f"{where}: {e}") from e


def _load_presets() -> dict[str, EngineProfile]:
    """Every engine_data/*.json; files without `base` first, so the others can name them."""
    out: dict[str, EngineProfile] = {}
    files = [(p, json.loads(p.read_text(encoding="utf-8"))) for p in ENGINE_DATA_DIR.glob("*.json")]
    for path, data in sorted(files, key=lambda f: ("base" in f[1], f[0].name)):
        prof = _profile_from_mapping(data, str(path), out)
        out[prof.name.lower()] = prof
    return out


ENGINE_PRESETS: dict[str, EngineProfile] = _load_presets()


def engine_preset(name: str) -> EngineProfile:
    """The preset called `name` (case-insensitive); unknown names list the closest presets."""
    key = name.lower()
    if key not in ENGINE_PRESETS:
        raise unknown_name_error("engine", name, ENGINE_PRESETS)
    return ENGINE_PRESETS[key]


def load_engine(name_or_path: str | os.PathLike[str] | EngineProfile) -> EngineProfile:
    """A preset name, an EngineProfile, or the path of a JSON/TOML file with EngineProfile's
    fields (`overheads` a table of EngineOverheads fields; `base` a preset to override)."""
    if isinstance(name_or_path, EngineProfile):
        return name_or_path
    s = str(name_or_path)
    if s.lower().endswith((".json", ".toml")) or os.sep in s:
        return _profile_from_mapping(read_mapping(s), str(Path(s)))
    return engine_preset(s)
