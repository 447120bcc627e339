"""Acceptance presets keyed by (drafter kind, target family, dataset, temperature).

Why this exists: how many draft tokens a target accepts depends on who drafts (an EAGLE-2 head, an
EAGLE-3 head, a 1B draft model and prompt lookup differ by 2x on the same traffic), on the
target, on the prompts and on the sampling temperature. A Workload names the traffic; the pair
(target, drafter) picks the acceptance from this registry (specs.workload.workload_for_pair).

Each preset is one shape per drafter kind with one fitted scale (`acceptance_fields`):
- eagle, eagle3, draft-model: confidence-calibrated (EAGLE-2): top-1 draft probability per depth
  d = 0.. has mean min(0.97, scale * decay**d), Beta concentration 4, lower ranks sharing the rest
  geometrically (tail 0.45), identity calibration (EAGLE-2's finding: draft confidence
  approximates acceptance). decay (assumed, not fitted): 0.93 for EAGLE heads (acceptance falls
  as the head feeds on its own features), 0.98 for EAGLE-3 (training-time test keeps it nearly
  flat: EAGLE-3 paper Figure 7), 1.0 for draft models (they read real tokens);
- medusa: positional rows of Medusa's published per-head top-1..top-5 accuracies (Vicuna-7B,
  FasterDecoding/Medusa assets/medusa_acc.csv) times scale;
- mtp: positional: rank 0 at depth d accepted with scale * 0.85**(d-1) (one MTP module reused
  for further steps; the 0.85 decay is assumed), lower ranks share 0.3 of the rest, halving;
- ngram: a single chain (prompt lookup proposes one continuation), conditionals scale times
  vLLM's n-gram shape (vllm PR #24344: .81 .74 .70 .68 .66 reach, i.e. conditionals .81 .914
  .946 .971 .971, flat after); the same chain is every preset's retrieval profile (grafting);
- intermediate: the chain a hierarchical policy's intermediate model hands its target
  (planner.hierarchical, arXiv 2505.22179): a positional chain whose every token is accepted
  with the same conditional `scale` (a full model reads real tokens: no decay), capped at 0.99.
  Fitted to an 8B model drafting for its family's 70B (figures.toml); it describes an
  intermediate about a tenth of its target's size, not any draft model.

At T > 0 acceptance also depends on how the drafts were drawn (`DRAFTING`): "top-k" drafts are
the drafter's most probable tokens, each accepted with the target's probability of it (EAGLE-2 and
EAGLE-3: SafeAILab/EAGLE eagle/model/cnets.py takes torch.topk at every temperature and
utils.py evaluate_posterior accepts with qx = 1.0); "sampled" drafts are drawn from the drafter
and accepted by rejection sampling against its probabilities (EAGLE-1: its cnets.py `sample`
draws without replacement and evaluate_posterior accepts with p/q, commit 2320d52; Hugging Face
assisted generation, the SpS figures). A kind's T = 1 presets describe the drafting of the figures
they rest on (`KIND_DRAFTING`).

Within a family, acceptance also depends on the target's size (`SizeRule`): a head-kind preset
(`SIZE_RULE_KINDS`) describes the target size of the figures it rests on (`target_params_b`), and
a target of N billion parameters takes scale * (N / N_ref) ** exponent, one exponent shared by the
head kinds, fitted to the published figures of one EAGLE head at several target sizes of one
family (figures.toml role "size-fit": EAGLE and EAGLE-2 papers, LLaMA2-Chat 7B/13B/70B, Vicuna
7B/13B/33B, LLaMA3-Instruct 8B/70B; LLaMA2-Chat-7B's EAGLE-1 row is held out), at every
temperature (a temperature x size slope is fitted and tested, not applied: see
workload_data/README.md). Draft models, prompt lookup, MTP and intermediates have no size term
(no figure measures one; prompt lookup copies the text; MTP runs with its own target; an
intermediate's preset is already a tenth-size model on a 70B).

At T > 0 a (drafter kind, target) with T=1 figures of its own (figures.toml `t1_factor`: that
kind's T=1 figure beside its T = 0 partner on that target) takes its own T=1 loss instead of its
family's (`TargetT1Factor`, `for_target_t1`): the kind's T = 0 preset at the target's size times
its T=1/T=0 scale ratio there on the dataset. The loss is keyed by drafter as well as target:
on Llama-3.3-70B EAGLE-3 keeps 0.97-0.98 of its T = 0 scale and EAGLE-2 0.88-0.94, so one
drafter's ratio does not carry to another (tested and rejected: workload_data/README.md, "A
drafter's own T=1 factor on its target"). A T > 0 lookup without such a factor keeps the
family's T = 1 preset (at the target's size by the size rule); when the size rule moved it, the
note says the T=1 loss there is extrapolated (`T1_EXTRAPOLATED_ERROR`).

The published figures (workload_data/published/figures.toml) and the fitted or derived scales
and the drafters' own T=1 factors (workload_data/published/presets.json, written by `python -m
benchmarks.bench_acceptance --refit` with spectune.traces.published and .size_fits) are data;
this module only reads them. A preset with no figure of its own is derived from named presets
by a stated rule (its `rule`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from spectune.specs.errors import SpecError

DATA_DIR = Path(__file__).with_name("workload_data") / "published"
FIGURES_FILE = DATA_DIR / "figures.toml"
PRESETS_FILE = DATA_DIR / "presets.json"

DRAFTER_KINDS = ("eagle", "eagle3", "medusa", "mtp", "draft-model", "ngram", "intermediate")
#: aliases accepted where a kind is named (EAGLE-2 is the EAGLE-1 head with a dynamic tree)
KIND_ALIASES = {"eagle1": "eagle", "eagle2": "eagle", "eagle-2": "eagle", "eagle-3": "eagle3"}
DATASETS = ("mt-bench", "humaneval", "gsm8k", "alpaca", "cnn-dm")
TEMPERATURES = (0.0, 1.0)
#: families tried, in order, when a key's own family has no preset
FAMILY_ORDER = ("llama-3", "llama-2", "qwen3", "deepseek-v3")
DEFAULT_KEY = ("eagle3", "llama-3", "mt-bench", 0.0)

CONFIDENCE_DECAY = {"eagle": 0.93, "eagle3": 0.98, "draft-model": 1.0}
CONFIDENCE_LEVELS = 8
#: Medusa heads 1..5, top-1 accuracy and top-5 accuracy (FasterDecoding/Medusa medusa_acc.csv)
MEDUSA_TOP1 = (0.560, 0.316, 0.201, 0.147, 0.118)
MEDUSA_TOP5 = (0.780, 0.563, 0.417, 0.340, 0.300)
MTP_DECAY = 0.85
MTP_LEVELS = 8
#: n-gram chain conditionals: vllm PR #24344 reach .81 .74 .70 .68 .66 as a_k / a_(k-1)
NGRAM_SHAPE = (0.81, 0.74 / 0.81, 0.70 / 0.74, 0.68 / 0.70, 0.66 / 0.68)
NGRAM_LENGTH = 10
DRAFTING = ("top-k", "sampled")
#: figure roles: "fit" fixes a preset's scale, "size-fit" the size rule's exponent (with the other
#: figures of its size_series), "held-out" is predicted without being fitted (one that names a
#: size_series on its series' line, fitted without it), "reported" is shown
ROLES = ("fit", "size-fit", "held-out", "reported")
#: kinds whose acceptance follows the target size (SizeRule): heads trained on the target's own
#: features. The exponent is fitted to EAGLE heads and shared by EAGLE-3 and Medusa heads (no
#: figure measures their size dependence apart from the held-out Llama-3.3-70B EAGLE-3 T=0 rows)
SIZE_RULE_KINDS = ("eagle", "eagle3", "medusa")
#: sizes within this factor of a preset's own count as its size (no rescaling)
SIZE_RULE_TOLERANCE = 1.1
#: drafting of the figures each kind's T = 1 presets rest on (fitted or derived): SpS for draft
#: models; EAGLE-2/EAGLE-3 for the heads, whose top-k ratio also derives medusa, mtp and ngram
KIND_DRAFTING = {"draft-model": "sampled"}


def kind_drafting(kind: str) -> str:
    """How the T = 1 presets of drafter kind `kind` assume drafts are drawn (see DRAFTING)."""
    return KIND_DRAFTING.get(normalize_kind(kind), "top-k")


INTERMEDIATE_CAP = 0.99
"""Largest per-token conditional of an intermediate's chain (no model agrees with its target
always)."""


@dataclass(frozen=True)
class PresetKey:
    """What acceptance depends on: who drafts, for which target family, on what prompts."""

    drafter: str
    family: str
    dataset: str
    temperature: float

    @property
    def label(self) -> str:
        return f"{self.drafter}/{self.family}/{self.dataset}/T={self.temperature:g}"


@dataclass(frozen=True)
class FigureTree:
    """The draft tree a figure was measured with (TreePolicy terms)."""

    builder: str
    depth: int
    topk: int
    budget: int


@dataclass(frozen=True)
class PublishedFigure:
    """One published mean accepted length (tokens per step, bonus token included)."""

    id: str
    key: PresetKey
    method: str
    target: str
    tokens_per_step: float
    tree: FigureTree
    role: str  # ROLES
    source: str
    target_params_b: float  # the target's nominal parameter count, billions
    note: str = ""
    size_series: str = ""  # "size-fit" (or held-out) figures: one head at several sizes of a family
    across_datasets: bool = False  # one figure given across prompt sets (not per dataset)
    drafting: str = ""  # "top-k" | "sampled" (DRAFTING); "" = its kind's (kind_drafting)
    #: T > 0 figures: the series (one head and target line at several sizes) whose T=1/T=0
    #: scale ratios test for a temperature x size term (traces.size_fits.fit_temperature_size)
    temperature_series: str = ""
    #: T > 0 "fit" figures: fixes its drafter kind's own T=1 factor on its target and dataset
    #: (TargetT1Factor, with its T = 0 partner) instead of its key's scale
    t1_factor: bool = False

    @property
    def drafted(self) -> str:
        """How this figure's drafts were drawn: its own `drafting`, else its kind's."""
        return self.drafting or kind_drafting(self.key.drafter)


@dataclass(frozen=True)
class AcceptancePreset:
    """One preset: a drafter kind's shape at a fitted (or derived) scale."""

    key: PresetKey
    scale: float
    fitted_to: tuple[str, ...]  # figure ids this scale was fitted to ((): derived)
    rule: str  # how the scale was obtained
    target_params_b: float  # target size (billions) the scale describes (SizeRule)

    @property
    def derived(self) -> bool:
        return not self.fitted_to

    def describe(self) -> str:
        how = "fitted to " + ", ".join(self.fitted_to) if self.fitted_to else self.rule
        return (
            f"acceptance preset {self.key.label} at {self.target_params_b:g}B (scale "
            f"{self.scale:.4f}; {how})"
        )


@dataclass(frozen=True)
class SizeRule:
    """scale(N) = scale(N_ref) * (N / N_ref) ** exponent within a family, for SIZE_RULE_KINDS.

    Fitted (spectune.traces.size_fits.fit_size_rule) by least squares on log(scale) against
    log(target parameters) over the "size-fit" figures, one intercept per size_series (one head
    kind, tree, dataset and temperature at several target sizes of one family)."""

    exponent: float
    stderr: float  # standard error of the exponent (least squares)
    series_log_scale_1b: Mapping[str, float]  # per size_series: fitted log(scale) at 1B
    fitted_to: tuple[str, ...]  # the "size-fit" figure ids

    def factor(self, from_params_b: float, to_params_b: float) -> float:
        """The scale factor from a from_params_b-billion target to a to_params_b one."""
        return float((to_params_b / from_params_b) ** self.exponent)


@dataclass(frozen=True)
class TargetT1Factor:
    """One drafter kind's own T = 1 loss on one target and dataset: scale_t1 / scale_t0, the
    scales fitted to that kind's published T = 1 figure and its T = 0 partner on the target (one
    tree; figures.toml `t1_factor`, fitted by spectune.traces.size_fits.fit_target_t1_factors).
    At T > 0 the kind, on a target that `target_matches`, takes its T = 0 preset at the target's
    size times this factor (`for_target_t1`) instead of its family's T = 1 preset. Other kinds on
    that target do not: the ratio depends on the drafter (workload_data/README.md)."""

    drafter: str  # DRAFTER_KINDS: the kind the figures measure, the only one it applies to
    target: str  # the figures' target name (lower case)
    dataset: str
    factor: float  # scale_t1 / scale_t0
    method: str  # the figures' method (EAGLE-2 is kind eagle)
    fitted_to: tuple[str, str]  # (T = 1 figure id, its T = 0 partner's id)
    scale_t1: float
    scale_t0: float


#: error range of the EAGLE-2 and EAGLE-3 T=1 rows of Llama-3.3-70B (EAGLE-3 paper Table 1)
#: predicted by the family's T = 1 preset and the size rule, as a target without a factor of its
#: own is (benchmarks/bench_acceptance.py prints it as `t1_extrapolated`; a test compares): the
#: note a T > 0 lookup carries where the size rule moved the family's T = 1 preset
T1_EXTRAPOLATED_ERROR = (-0.289, 0.077)


# ---- shapes ------------------------------------------------------------------------------------
def acceptance_fields(kind: str, scale: float) -> dict[str, Any]:
    """The Workload acceptance fields of drafter kind `kind` at `scale` (see module docstring)."""
    kind = normalize_kind(kind)
    base: dict[str, Any] = {
        "accept_by_rank": (),
        "depth_decay": 1.0,
        "confidence_mean": (),
        "confidence_concentration": 4.0,
        "confidence_tail": 0.45,
        "calibration_x": (0.0, 1.0),
        "calibration_y": (0.0, 1.0),
    }
    if kind in CONFIDENCE_DECAY:
        decay = CONFIDENCE_DECAY[kind]
        means = tuple(
            float(min(0.97, max(0.01, scale * decay**d))) for d in range(CONFIDENCE_LEVELS)
        )
        return {**base, "acceptance": "confidence", "confidence_mean": means, "depth_decay": decay}
    if kind == "medusa":
        rows = []
        for a1, a5 in zip(MEDUSA_TOP1, MEDUSA_TOP5, strict=True):
            w = [0.6**i for i in range(4)]
            row = [a1, *((a5 - a1) * x / sum(w) for x in w)]
            rows.append(_cap_row([v * scale for v in row]))
        return {
            **base,
            "acceptance": "positional",
            "accept_by_rank": tuple(rows),
            "depth_decay": 0.8,
        }
    if kind == "mtp":
        rows = []
        for d in range(MTP_LEVELS):
            p0 = min(0.98, scale * MTP_DECAY**d)
            rest = [(1 - p0) * 0.3 * 0.5**r for r in range(3)]
            rows.append(_cap_row([p0, *rest]))
        return {**base, "acceptance": "positional", "accept_by_rank": tuple(rows)}
    if kind == "intermediate":
        alpha = float(min(INTERMEDIATE_CAP, max(0.01, scale)))
        return {**base, "acceptance": "positional", "accept_by_rank": ((alpha,),)}
    if kind == "ngram":
        return {
            **base,
            "acceptance": "positional",
            "accept_by_rank": tuple((c,) for c in ngram_chain(scale)),
        }
    raise SpecError(f"unknown drafter kind {kind!r}; known: {', '.join(DRAFTER_KINDS)}")


def ngram_chain(scale: float) -> tuple[float, ...]:
    """Conditional acceptance of the 1st..NGRAM_LENGTH-th token of one looked-up chain."""
    shape = NGRAM_SHAPE + (NGRAM_SHAPE[-1],) * (NGRAM_LENGTH - len(NGRAM_SHAPE))
    return tuple(float(min(0.98, max(0.0, scale * c))) for c in shape)


def retrieval_fields(ngram_scale: float) -> dict[str, Any]:
    """The retrieval (graft) profile of an n-gram preset: one match class, always proposed."""
    return {"retrieval_accept": (ngram_chain(ngram_scale),), "retrieval_match_probs": (1.0,)}


def _cap_row(row: list[float]) -> tuple[float, ...]:
    """Entries in [0, 1] and a row sum <= 1 (one child of a node can be accepted)."""
    row = [min(1.0, max(0.0, v)) for v in row]
    total = sum(row)
    if total > 1.0:
        row = [v / total for v in row]
    return tuple(float(v) for v in row)


def normalize_kind(kind: str) -> str:
    k = kind.lower()
    return KIND_ALIASES.get(k, k)


# ---- the registry ------------------------------------------------------------------------------
@functools.cache
def published_figures() -> tuple[PublishedFigure, ...]:
    """Every figure of figures.toml (SpecError naming the file and the entry if malformed)."""
    try:
        data = tomllib.loads(FIGURES_FILE.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise SpecError(f"{FIGURES_FILE}: {e}") from e
    out = []
    for i, f in enumerate(data.get("figure", [])):
        where = f"{FIGURES_FILE}: figure {i} ({f.get('id', '?')})"
        try:
            tree = FigureTree(**f["tree"])
            key = PresetKey(
                normalize_kind(f["drafter"]), f["family"], f["dataset"], float(f["temperature"])
            )
            out.append(
                PublishedFigure(
                    id=f["id"],
                    key=key,
                    method=f["method"],
                    target=f["target"],
                    tokens_per_step=float(f["tokens_per_step"]),
                    tree=tree,
                    role=f["role"],
                    source=f["source"],
                    target_params_b=float(f["target_params_b"]),
                    note=f.get("note", ""),
                    size_series=str(f.get("size_series", "")),
                    across_datasets=bool(f.get("across_datasets", False)),
                    drafting=str(f.get("drafting", "")),
                    temperature_series=str(f.get("temperature_series", "")),
                    t1_factor=f.get("t1_factor", False),
                )
            )
            fig = out[-1]
            if not isinstance(fig.t1_factor, bool):
                raise ValueError(f"t1_factor must be true or false, got {fig.t1_factor!r}")
            if fig.t1_factor and (fig.role != "fit" or fig.key.temperature == 0.0):
                raise ValueError(
                    'a t1_factor figure is a "fit" figure at T > 0 (it fixes its drafter\'s T=1 '
                    "factor on its target with its T = 0 partner)"
                )
            if fig.drafting not in ("", *DRAFTING):
                raise ValueError(f"drafting must be one of {DRAFTING}, got {fig.drafting!r}")
            if fig.temperature_series and fig.key.temperature == 0.0:
                raise ValueError("temperature_series is for T > 0 figures (paired with T = 0)")
            if fig.role not in ROLES:
                raise ValueError(f"role must be one of {ROLES}, got {fig.role!r}")
            if not 0.01 <= fig.target_params_b <= 1e5:
                raise ValueError(
                    f"target_params_b must be a parameter count in billions in [0.01, 1e5], "
                    f"got {fig.target_params_b!r}"
                )
            if (fig.role == "size-fit" and not fig.size_series) or (
                fig.size_series and fig.role not in ("size-fit", "held-out")
            ):
                raise ValueError(
                    'a "size-fit" figure names its size_series; a "held-out" one may (held out '
                    "of its series' fit); no other role names one"
                )
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"{where}: {e!r}") from e
    return tuple(out)


@functools.cache
def acceptance_presets() -> Mapping[PresetKey, AcceptancePreset]:
    """Every preset of presets.json, by key."""
    try:
        rows = json.loads(PRESETS_FILE.read_text(encoding="utf-8"))["presets"]
    except (OSError, json.JSONDecodeError, KeyError) as e:
        raise SpecError(f"{PRESETS_FILE}: {e!r}") from e
    out: dict[PresetKey, AcceptancePreset] = {}
    for r in rows:
        try:
            key = PresetKey(r["drafter"], r["family"], r["dataset"], float(r["temperature"]))
            out[key] = AcceptancePreset(
                key,
                float(r["scale"]),
                tuple(r["fitted_to"]),
                r["rule"],
                float(r["target_params_b"]),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"{PRESETS_FILE}: preset row {r!r}: {e!r}") from e
    return out


@functools.cache
def size_rule() -> SizeRule:
    """The size rule of presets.json (written by benchmarks/bench_acceptance.py --refit)."""
    try:
        r = json.loads(PRESETS_FILE.read_text(encoding="utf-8"))["size_rule"]
        rule = SizeRule(
            float(r["exponent"]),
            float(r["stderr"]),
            {str(k): float(v) for k, v in r["series_log_scale_1b"].items()},
            tuple(r["fitted_to"]),
        )
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
        raise SpecError(f"{PRESETS_FILE}: size_rule: {e!r} (rerun --refit)") from e
    if not (math.isfinite(rule.exponent) and abs(rule.exponent) < 1.0):
        raise SpecError(f"{PRESETS_FILE}: size_rule exponent {rule.exponent!r} outside (-1, 1)")
    return rule


@functools.cache
def target_t1_factors() -> tuple[TargetT1Factor, ...]:
    """The drafter-and-target T=1 factors of presets.json (written by benchmarks/bench_acceptance
    --refit); SpecError naming the file and the row when one is malformed or repeated."""
    try:
        rows = json.loads(PRESETS_FILE.read_text(encoding="utf-8"))["target_t1_factors"]
    except (OSError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise SpecError(f"{PRESETS_FILE}: target_t1_factors: {e!r} (rerun --refit)") from e
    out: list[TargetT1Factor] = []
    for r in rows:
        try:
            if len(r["fitted_to"]) != 2:
                raise ValueError("fitted_to names the T = 1 figure and its T = 0 partner")
            f = TargetT1Factor(
                normalize_kind(str(r["drafter"])),
                str(r["target"]).lower(),
                str(r["dataset"]),
                float(r["factor"]),
                str(r["method"]),
                (str(r["fitted_to"][0]), str(r["fitted_to"][1])),
                float(r["scale_t1"]),
                float(r["scale_t0"]),
            )
            if f.dataset not in DATASETS or f.drafter not in DRAFTER_KINDS:
                raise ValueError(f"dataset must be one of {DATASETS}, drafter of {DRAFTER_KINDS}")
            scales_ok = all(math.isfinite(v) and v > 0.0 for v in (f.scale_t0, f.scale_t1))
            if not (0.0 < f.factor <= 2.0 and scales_ok):
                raise ValueError("factor must be in (0, 2] and the scales positive and finite")
            if not math.isclose(f.factor, f.scale_t1 / f.scale_t0, rel_tol=1e-4):
                raise ValueError("factor must be scale_t1 / scale_t0")
            if any(_factor_key(g) == _factor_key(f) for g in out):
                raise ValueError("one factor per (drafter, target, dataset)")
        except (KeyError, TypeError, ValueError, IndexError) as e:
            raise SpecError(f"{PRESETS_FILE}: target_t1_factors row {r!r}: {e!r}") from e
        out.append(f)
    return tuple(out)


def _factor_key(f: TargetT1Factor) -> tuple[str, str, str]:
    return (f.drafter, f.target, f.dataset)


def target_matches(model_name: str, target: str) -> bool:
    """Is a model called `model_name` the figures' `target`: the same name, or the name followed
    by '-' and a variant (llama-3.3-70b-instruct, llama-3.3-70b-awq), case-insensitive."""
    n, t = model_name.lower(), target.lower()
    return bool(t) and (n == t or n.startswith(t + "-"))


def target_t1_factor(drafter: str, target: str, dataset: str) -> TargetT1Factor | None:
    """The T=1 factor of drafter kind `drafter` on the model called `target` (target_matches) and
    `dataset`, or None when no figures of that kind on that target fix one."""
    kind = normalize_kind(drafter)
    for f in target_t1_factors():
        if (f.drafter, f.dataset) == (kind, dataset) and target_matches(target, f.target):
            return f
    return None


def for_target_t1(p0: AcceptancePreset, target: str, temperature: float) -> AcceptancePreset | None:
    """The preset at `temperature` > 0 of p0's kind on the model called `target`, from p0 (the
    kind's T = 0 preset on the dataset, already at the target's size: for_target_size) times the
    kind's own T=1 factor on that target (TargetT1Factor); None when it has none there (the
    family's T = 1 preset then applies) or `temperature` is 0."""
    if p0.key.temperature != 0.0:
        raise SpecError(f"for_target_t1 takes a T = 0 preset, got {p0.key.label}")
    if temperature <= 0.0 or not target:
        return None
    f = target_t1_factor(p0.key.drafter, target, p0.key.dataset)
    if f is None:
        return None
    return AcceptancePreset(
        dataclasses.replace(p0.key, temperature=float(temperature)),
        p0.scale * f.factor,
        (),
        f"derived (drafter's T=1 factor on its target): {p0.key.label} at "
        f"{p0.target_params_b:g}B x {f.method}'s T=1/T=0 scale ratio on {f.target}/{f.dataset} "
        f"= {p0.scale:.4f} x {f.factor:.4f} (fitted to {f.fitted_to[0]} / {f.fitted_to[1]}; "
        f"the T=0 preset: {p0.rule})",
        p0.target_params_b,
    )


def size_rule_to_dict(rule: SizeRule) -> dict[str, Any]:
    """The presets.json `size_rule` document of a rule."""
    return {
        "rule": "scale(N) = scale(N_ref) * (N / N_ref) ** exponent for drafter kinds "
        f"{', '.join(SIZE_RULE_KINDS)}; N: the target's parameters in billions, N_ref: the "
        "preset's target_params_b (specs.acceptance_presets.for_target_size)",
        "exponent": round(rule.exponent, 6),
        "stderr": round(rule.stderr, 6),
        "series_log_scale_1b": {k: round(v, 6) for k, v in rule.series_log_scale_1b.items()},
        "fitted_to": list(rule.fitted_to),
    }


def for_target_size(
    p: AcceptancePreset, target_params_b: float | None, rule: SizeRule | None = None
) -> AcceptancePreset:
    """`p` for a target of `target_params_b` billion parameters: rescaled by the size rule when
    p's kind follows it (SIZE_RULE_KINDS) and the size differs from p's by more than
    SIZE_RULE_TOLERANCE; otherwise p itself. None: no size (p itself); a size that is not a
    positive finite number is a SpecError."""
    if target_params_b is not None and not (math.isfinite(target_params_b) and target_params_b > 0):
        raise SpecError(
            f"target size {target_params_b!r} billion parameters for {p.key.label}: give a "
            "positive finite parameter count"
        )
    if (
        target_params_b is None
        or p.key.drafter not in SIZE_RULE_KINDS
        or max(target_params_b, p.target_params_b)
        <= SIZE_RULE_TOLERANCE * min(target_params_b, p.target_params_b)
    ):
        return p
    rule = size_rule() if rule is None else rule
    f = rule.factor(p.target_params_b, target_params_b)
    return AcceptancePreset(
        p.key,
        p.scale * f,
        (),
        f"derived (size rule): {p.key.label} at {p.target_params_b:g}B x "
        f"({target_params_b:g} / {p.target_params_b:g}) ** {rule.exponent:+.4f} = "
        f"{p.scale:.4f} x {f:.4f} (exponent fitted to {len(rule.fitted_to)} size-fit figures, "
        f"standard error {rule.stderr:.4f})",
        target_params_b,
    )


def preset_to_dict(p: AcceptancePreset) -> dict[str, Any]:
    """The presets.json row of a preset."""
    k = p.key
    return {
        "drafter": k.drafter,
        "family": k.family,
        "dataset": k.dataset,
        "temperature": k.temperature,
        "scale": round(p.scale, 6),
        "fitted_to": list(p.fitted_to),
        "rule": p.rule,
        "target_params_b": p.target_params_b,
    }


def lookup(
    drafter: str,
    family: str,
    dataset: str,
    temperature: float,
    target_params_b: float | None = None,
    target: str = "",
) -> tuple[AcceptancePreset, str]:
    """(preset, note): the preset for the key, or the nearest one and a note naming it; with
    `target_params_b`, rescaled to that target size by the size rule (`for_target_size`); at
    T > 0 for a model called `target` on which the drafter kind has a T=1 factor of its own
    (TargetT1Factor), the kind's T = 0 preset at its size times that factor (`for_target_t1`).
    At T > 0 without one, a family T = 1 preset that the size rule moved to another size comes
    with a note that its T=1 loss is extrapolated (T1_EXTRAPOLATED_ERROR).

    Nearest, in order: the nearest covered temperature; the same kind, dataset and temperature
    in another family (FAMILY_ORDER first); the same kind and family on mt-bench; the same kind
    anywhere; finally the default key (EAGLE-3 on Llama-3, MT-Bench)."""
    presets = acceptance_presets()
    kind = normalize_kind(drafter)
    temp = min(TEMPERATURES, key=lambda t: (abs(t - temperature), t))
    want = PresetKey(kind, family, dataset, float(temperature))
    if temp > 0.0 and target:
        p0, _ = lookup(drafter, family, dataset, 0.0, target_params_b)
        own = for_target_t1(p0, target, temp) if p0.key.temperature == 0.0 else None
        if own is not None:
            return own, ("" if own.key == want else _nearest_note(want, own.key))
    families = [family, *(f for f in FAMILY_ORDER if f != family)]
    families += sorted({k.family for k in presets} - set(families))
    candidates = [PresetKey(kind, f, dataset, temp) for f in families]
    candidates += [PresetKey(kind, family, "mt-bench", temp)]
    candidates += sorted(
        (k for k in presets if k.drafter == kind),
        key=lambda k: (k.temperature != temp, k.dataset != dataset, k.label),
    )
    candidates.append(PresetKey(*DEFAULT_KEY[:3], temp))
    for c in candidates:
        if c in presets:
            p = for_target_size(presets[c], target_params_b)
            notes = [] if c == want else [_nearest_note(want, c)]
            if c.temperature > 0.0 and p is not presets[c]:
                notes.append(_t1_extrapolated_note(presets[c], p, target))
            return p, "; ".join(notes)
    raise SpecError(f"{PRESETS_FILE}: no acceptance preset at all for {want.label}")


def _t1_extrapolated_note(family: AcceptancePreset, sized: AcceptancePreset, target: str) -> str:
    lo, hi = T1_EXTRAPOLATED_ERROR
    return (
        f"T=1 acceptance of {family.key.drafter} on {target or 'a target'} at "
        f"{sized.target_params_b:g}B is extrapolated: no T=1 figure of this drafter on this target "
        f"fixes its own T=1 loss, so the family's T=1 preset ({family.key.label}, fitted at "
        f"{family.target_params_b:g}B) is moved by the size rule; on Llama-3.3-70B that missed the "
        f"published EAGLE-2/EAGLE-3 T=1 rows by {100 * lo:+.1f}%..{100 * hi:+.1f}% before their "
        "own figures were fitted"
    )


def _nearest_note(want: PresetKey, got: PresetKey) -> str:
    why = []
    if want.drafter != got.drafter:
        why.append(f"no preset for drafter kind {want.drafter!r}")
    if want.family != got.family:
        why.append(f"target family {want.family or 'unknown'!r} has none")
    if want.dataset != got.dataset:
        why.append(f"dataset {want.dataset or 'unknown'!r} has none")
    if want.temperature != got.temperature:
        why.append(f"presets exist at T = {', '.join(f'{t:g}' for t in TEMPERATURES)}")
    return (
        f"no acceptance preset for {want.label} ({'; '.join(why)}); using the nearest, {got.label}"
    )


def covered_keys() -> list[PresetKey]:
    """Every key with a preset (fitted or derived), sorted."""
    return sorted(
        acceptance_presets(), key=lambda k: (k.drafter, k.family, k.dataset, k.temperature)
    )
