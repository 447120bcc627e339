"""Workload: how well a drafter's tokens are accepted on some traffic, and what that traffic is.

A Workload carries the parameters of one acceptance model (planner.acceptance builds the model)
plus the prompt/output length distributions the simulator draws from. Presets are fitted to
published figures (shared/REFERENCES.md); each says its source and how it was fitted. JSON files
in spectune/specs/workload_data/ (presets fitted from recorded traces) load as presets too.

Acceptance parameters, by model:
- positional: accept_by_rank[d][r] = P(the rank-r child at depth d+1 is accepted | its parent
  was), rows past the table repeat the last row times depth_decay per extra level. Each row sums
  to <= 1: the target emits one token, so at most one child of a node is accepted.
- confidence (EAGLE-2): the drafter's top-1 probability at depth d+1 ~ Beta with mean
  confidence_mean[d] and concentration confidence_concentration; lower ranks share the rest of
  the mass geometrically (ratio confidence_tail); acceptance = calibration(draft probability),
  a piecewise-linear curve through (calibration_x, calibration_y), never above the diagonal.
- retrieval (any model, for grafted tokens): retrieval_accept[m-1][j-1] = P(the j-th grafted
  token matches | the previous one did) for a suffix match of length m; retrieval_match_probs[m-1]
  = P(a step finds a match of length m) (the remainder: no match).

Acceptance belongs to a (drafter, target) pair. A dataset preset (mt-bench, humaneval, gsm8k,
alpaca, cnn-dm; "-t1" at temperature 1) takes it from specs.acceptance_presets for the pair it runs
with (`workload_for_pair`, or `load_workload(..., target=, drafter=)`): a pair without a preset of
its own gets the nearest one and a PairWarning naming it, as does a T=1 preset moved to the
target's size by the size rule where the drafter has no T=1 figure of its own on that target
(extrapolated). A workload fitted for one pair (traces, or a named preset like medusa-vicuna-7b)
records that pair in `drafter`/`target`; applying it to another pair raises a PairWarning. With
strict=True (the CLI's --strict) these are SpecErrors.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import spectune.specs.acceptance_presets as aps
from spectune.specs.compat import PairWarning, drafter_kind
from spectune.specs.errors import SpecError
from spectune.specs.io import from_mapping, help_field, load_spec
from spectune.specs.model import ModelSpec

ACCEPTANCE_KINDS = ("positional", "confidence")
LENGTH_DISTS = ("lognormal", "fixed")
WORKLOAD_DATA_DIR = Path(__file__).with_name("workload_data")


@dataclass(frozen=True)
class Workload:
    """Acceptance profile and traffic shape of one serving workload."""

    name: str = help_field(help="short identifier, e.g. mt-bench")
    acceptance: str = help_field(help="acceptance model: 'positional' or 'confidence'")
    temperature: float = help_field(0.0, help="target sampling temperature (0 = greedy)")
    accept_by_rank: tuple[tuple[float, ...], ...] = help_field(
        (), help="positional: [depth-1][rank] P(child accepted | parent accepted); rows sum <= 1"
    )
    depth_decay: float = help_field(
        1.0, help="factor per level past the last table row (positional and confidence means)"
    )
    confidence_mean: tuple[float, ...] = help_field(
        (), help="confidence: mean top-1 draft probability per depth (depth 1 first)"
    )
    confidence_concentration: float = help_field(
        4.0, help="confidence: Beta concentration a+b of the top-1 draft probability"
    )
    confidence_tail: float = help_field(
        0.5, help="confidence: ratio between successive lower-rank shares of the remaining mass"
    )
    calibration_x: tuple[float, ...] = help_field(
        (0.0, 1.0), help="calibration knots: draft probability, increasing from 0 to 1"
    )
    calibration_y: tuple[float, ...] = help_field(
        (0.0, 1.0), help="calibration knots: acceptance probability at each knot (<= x)"
    )
    retrieval_accept: tuple[tuple[float, ...], ...] = help_field(
        (), help="retrieval: [match_len-1][j-1] P(j-th grafted token matches | previous did)"
    )
    retrieval_match_probs: tuple[float, ...] = help_field(
        (), help="retrieval: P(a step finds a suffix match of length m), m = 1.. (sum <= 1)"
    )
    length_dist: str = help_field("lognormal", help="prompt/output length law: lognormal or fixed")
    prompt_len_mean_tokens: float = help_field(512.0, help="mean prompt length, tokens")
    prompt_len_cv: float = help_field(1.0, help="prompt length coefficient of variation")
    prompt_len_max_tokens: int = help_field(8192, help="prompt lengths are clipped to this")
    output_len_mean_tokens: float = help_field(256.0, help="mean output length, tokens")
    output_len_cv: float = help_field(0.8, help="output length coefficient of variation")
    output_len_max_tokens: int = help_field(4096, help="output lengths are clipped to this")
    dataset: str = help_field(
        "", help="prompt set the traffic is (mt-bench, humaneval, gsm8k, alpaca, cnn-dm; '' other)"
    )
    drafter: str = help_field(
        "", help="drafter the acceptance is for: a drafter kind or model name ('' any)"
    )
    target: str = help_field(
        "", help="target the acceptance is for: a target family or model name ('' any)"
    )
    acceptance_by_pair: bool = help_field(
        False,
        help="true: acceptance comes from the published presets of the (drafter, target) pair "
        "it runs with (the fields hold the default pair's)",
    )
    batch_weights: tuple[tuple[float, ...], ...] = help_field(
        (),
        help="batch sizes the server runs at, as [[batch, share of serving time], ...] "
        "(shares need not sum to 1); what `spectune plan` weighs its deployment gains by "
        "(empty: equal weights)",
    )
    source: str = help_field("user-provided", help="where the figures come from")
    fitted: str = help_field("", help="how the parameters were fitted to the source")

    def __post_init__(self) -> None:
        w = f"workload {self.name!r}"
        if not self.name:
            raise SpecError("field 'name' must be a non-empty string")
        if self.acceptance not in ACCEPTANCE_KINDS:
            raise SpecError(
                f"{w}: field 'acceptance' must be one of {ACCEPTANCE_KINDS}, got {self.acceptance!r}"
            )
        if self.length_dist not in LENGTH_DISTS:
            raise SpecError(f"{w}: field 'length_dist' must be one of {LENGTH_DISTS}")
        if not 0 <= self.temperature <= 100:
            raise SpecError(f"{w}: field 'temperature' must be in [0, 100]")
        _table(self.accept_by_rank, "accept_by_rank", w, row_sum=True)
        _table(self.retrieval_accept, "retrieval_accept", w, row_sum=False)
        if self.acceptance == "positional" and not self.accept_by_rank:
            raise SpecError(f"{w}: a positional workload needs field 'accept_by_rank'")
        if self.acceptance == "confidence" and not self.confidence_mean:
            raise SpecError(f"{w}: a confidence workload needs field 'confidence_mean'")
        for i, v in enumerate(self.confidence_mean):
            if not 0.0 < v < 1.0:
                raise SpecError(f"{w}: field 'confidence_mean'[{i}] must be in (0, 1), got {v}")
        if not 0.0 < self.depth_decay <= 1.0:
            raise SpecError(f"{w}: field 'depth_decay' must be in (0, 1]")
        if not 0 < self.confidence_concentration <= 1e6:
            raise SpecError(f"{w}: field 'confidence_concentration' must be in (0, 1e6]")
        if not 0.0 <= self.confidence_tail < 1.0:
            raise SpecError(f"{w}: field 'confidence_tail' must be in [0, 1)")
        xs, ys = self.calibration_x, self.calibration_y
        if len(xs) != len(ys) or len(xs) < 2:
            raise SpecError(f"{w}: calibration_x and calibration_y need the same length >= 2")
        if xs[0] != 0.0 or xs[-1] != 1.0 or any(b <= a for a, b in itertools.pairwise(xs)):
            raise SpecError(f"{w}: field 'calibration_x' must increase from 0.0 to 1.0")
        for i, (x, y) in enumerate(zip(xs, ys, strict=True)):
            if not 0.0 <= y <= x + 1e-12:
                raise SpecError(
                    f"{w}: field 'calibration_y'[{i}] must be in [0, calibration_x[{i}]] "
                    "(acceptance above the draft probability would let siblings sum past 1)"
                )
        if (
            any(p < 0 for p in self.retrieval_match_probs)
            or sum(self.retrieval_match_probs) > 1 + 1e-9
        ):
            raise SpecError(f"{w}: field 'retrieval_match_probs' must be >= 0 and sum to <= 1")
        if self.retrieval_match_probs and len(self.retrieval_match_probs) > len(
            self.retrieval_accept
        ):
            raise SpecError(
                f"{w}: field 'retrieval_accept' needs a row per match length in 'retrieval_match_probs'"
            )
        for name, lo, hi in _LENGTH_RANGES:
            if not lo <= getattr(self, name) <= hi:
                raise SpecError(f"{w}: field {name!r} must be in [{lo:g}, {hi:g}]")
        _batch_weights(self.batch_weights, w)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


MAX_LENGTH_TOKENS = 1 << 24  # past every model's context
_LENGTH_RANGES = (
    ("prompt_len_mean_tokens", 1, MAX_LENGTH_TOKENS),
    ("output_len_mean_tokens", 1, MAX_LENGTH_TOKENS),
    ("prompt_len_cv", 0, 100),
    ("output_len_cv", 0, 100),
    ("prompt_len_max_tokens", 1, MAX_LENGTH_TOKENS),
    ("output_len_max_tokens", 1, MAX_LENGTH_TOKENS),
)


MAX_WEIGHTED_BATCH = 1 << 16


def _batch_weights(rows: tuple[tuple[float, ...], ...], w: str) -> None:
    """[[batch, weight], ...]: integer batch sizes 1..65536 listed once, weights >= 0 with a
    positive sum, at most 64 rows."""
    if not rows:
        return
    if len(rows) > 64:
        raise SpecError(f"{w}: field 'batch_weights' holds at most 64 batch sizes")
    for i, row in enumerate(rows):
        ok = len(row) == 2 and float(row[0]).is_integer() and 1 <= row[0] <= MAX_WEIGHTED_BATCH
        if not ok or not 0 <= row[1] <= 1e30:
            raise SpecError(
                f"{w}: field 'batch_weights'[{i}] must be [batch, weight] with an integer batch "
                f"in 1..{MAX_WEIGHTED_BATCH} and a weight >= 0, got {list(row)}"
            )
    if len({r[0] for r in rows}) != len(rows) or not sum(r[1] for r in rows) > 0:
        raise SpecError(
            f"{w}: field 'batch_weights' must list each batch size once, weights summing to > 0"
        )


def _table(t: tuple[tuple[float, ...], ...], name: str, w: str, *, row_sum: bool) -> None:
    for d, row in enumerate(t):
        if not row:
            raise SpecError(f"{w}: field {name!r}[{d}] is empty")
        for r, v in enumerate(row):
            if not 0.0 <= v <= 1.0:
                raise SpecError(f"{w}: field {name!r}[{d}][{r}] must be in [0, 1], got {v}")
        if row_sum and sum(row) > 1.0 + 1e-9:
            raise SpecError(
                f"{w}: field {name!r}[{d}] sums to {sum(row):.3f} > 1; at most one child of a node "
                "can be accepted, so the probabilities of one row must sum to <= 1"
            )


def load_workload(
    name_or_path: str | os.PathLike[str],
    *,
    target: ModelSpec | None = None,
    drafter: ModelSpec | None = None,
    strict: bool = False,
) -> Workload:
    """A preset name, or the path of a JSON/TOML file with Workload's fields. With `target`,
    the workload's acceptance is the one for (target, drafter) (`workload_for_pair`;
    drafter None = n-gram / prompt lookup)."""
    wl = load_spec(Workload, name_or_path, WORKLOAD_PRESETS, "workload")
    return wl if target is None else workload_for_pair(wl, target, drafter, strict=strict)


def workload_for_pair(
    wl: Workload, target: ModelSpec, drafter: ModelSpec | None, *, strict: bool = False
) -> Workload:
    """`wl` with the acceptance of the (target, drafter) pair.

    acceptance_by_pair workloads take the preset of (drafter kind, target family, dataset,
    temperature), or the nearest one with a PairWarning naming it, at the target's size (the
    size rule of specs.acceptance_presets) and, at T > 0, with the drafter kind's own T=1 factor
    on the target where its figures fix one (specs.acceptance_presets.for_target_t1), else with
    a PairWarning when the size rule moved the family's T=1 preset (extrapolated). Other
    workloads keep their acceptance; if they record another drafter or target, a PairWarning
    says so.
    strict=True raises those warnings as SpecErrors instead."""
    kind = drafter_kind(drafter)
    dname = drafter.name if drafter is not None else "no drafter (n-gram)"
    if wl.acceptance_by_pair:
        fields, note = pair_acceptance(
            kind,
            target.family,
            wl.dataset,
            wl.temperature,
            target.total_params() / 1e9,
            target=target.name,
        )
        if note:
            _pair_warning(f"workload {wl.name!r} for {target.name} + {dname}: {note}", strict)
        return dataclasses.replace(wl, **fields)  # type: ignore[arg-type]
    bad = []
    if wl.drafter and not _names(wl.drafter, dname, kind):
        bad.append(f"drafter {wl.drafter!r}")
    if wl.target and not _names(wl.target, target.name, target.family):
        bad.append(f"target {wl.target!r}")
    if bad:
        _pair_warning(
            f"workload {wl.name!r} was fitted for {' and '.join(bad)}; applying it to "
            f"{target.name} + {dname} (kind {kind}) assumes that pair accepts the same",
            strict,
        )
    return wl


INTERMEDIATE_SIZE_RANGE = (0.04, 0.25)
"""Intermediate/target parameter ratios the 'intermediate' acceptance preset is taken to
describe: it is fitted to an 8B model drafting for a 70B (0.11); outside, a PairWarning."""


def intermediate_workload(
    wl: Workload, target: ModelSpec, intermediate: ModelSpec, *, strict: bool = False
) -> Workload:
    """`wl` with the acceptance of the chains a hierarchical policy's `intermediate` model
    hands `target` (planner.hierarchical): the 'intermediate' acceptance preset of (target
    family, the workload's dataset, temperature), specs.acceptance_presets. A workload fitted
    for a (drafter, target) pair records that pair's trees, not an intermediate's chains, so
    every workload takes the preset; one naming no dataset takes mt-bench's, with a
    PairWarning, as does a preset key without a preset of its own and an intermediate far
    from a tenth of its target's size (INTERMEDIATE_SIZE_RANGE)."""
    dataset = wl.dataset or "mt-bench"
    fields, note = pair_acceptance(
        "intermediate", target.family, dataset, wl.temperature, target=target.name
    )
    notes = [note] if note else []
    if not wl.dataset:
        notes.append(f"it names no dataset, so the intermediate's chains take {dataset}'s preset")
    ratio = intermediate.total_params() / max(target.total_params(), 1)
    lo, hi = INTERMEDIATE_SIZE_RANGE
    if not lo <= ratio <= hi:
        notes.append(
            f"the intermediate preset is fitted to an 8B model drafting for a 70B (a tenth of "
            f"its size); {intermediate.name} is {ratio:.2f} of {target.name}'s parameters, so "
            "its chain acceptance is that assumption, not a figure"
        )
    if notes:
        _pair_warning(
            f"workload {wl.name!r}, intermediate {intermediate.name} for {target.name}: "
            + "; ".join(notes),
            strict,
        )
    fields["source"] = f"intermediate {intermediate.name} for {target.name}: {fields['source']}"
    return dataclasses.replace(wl, **fields)  # type: ignore[arg-type]


def _names(recorded: str, *names: str) -> bool:
    """Does a recorded drafter/target name one of `names` (equal, or one a prefix of the other,
    as in smollm2-135m / smollm2-135m-instruct-q4_1)?"""
    r = recorded.lower()
    for n in (x.lower() for x in names if x):
        if r == n or r.startswith(n + "-") or n.startswith(r + "-"):
            return True
    return False


def _pair_warning(msg: str, strict: bool) -> None:
    if strict:
        raise PairWarning(f"{msg} (strict mode)")
    warnings.warn(msg, PairWarning, stacklevel=4)


def _load_data_dir(folder: Path) -> dict[str, Workload]:
    """Every *.json in `folder` as a Workload (fitted presets dropped there by other tools)."""
    out: dict[str, Workload] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise SpecError(f"{path}: not valid JSON: {e}") from e
        if not isinstance(data, dict):
            raise SpecError(f"{path}: expected an object at the top level")
        wl = from_mapping(Workload, data, str(path))
        out[wl.name.lower()] = wl
    return out


# ---- presets ----------------------------------------------------------------------------------
# Dataset presets: the traffic of one prompt set; their acceptance follows the (drafter, target)
# pair they run with (acceptance_by_pair), from specs.acceptance_presets. The acceptance fields
# stored here are the default pair's (an EAGLE-3 head on Llama-3.1-8B, fitted to the EAGLE-3
# paper's Table 1). Prompt/output lengths are rough assumptions per dataset, not measured.
_TRAFFIC = {  # dataset: (mean prompt tokens, mean output tokens)
    "mt-bench": (120.0, 400.0),
    "humaneval": (150.0, 200.0),
    "gsm8k": (100.0, 250.0),
    "alpaca": (80.0, 250.0),
    "cnn-dm": (900.0, 120.0),
}
_DEFAULT_DRAFTER, _DEFAULT_FAMILY = aps.DEFAULT_KEY[:2]


def pair_acceptance(
    drafter: str,
    family: str,
    dataset: str,
    temperature: float,
    target_params_b: float | None = None,
    target: str = "",
) -> tuple[dict[str, object], str]:
    """(Workload fields, note) of the acceptance preset nearest the key, at a target of
    `target_params_b` billion parameters (None: the preset's own size) called `target` (the
    drafter kind's own T=1 factor on it, if any, applies at T > 0:
    specs.acceptance_presets.lookup): the drafter kind's acceptance, the n-gram preset's
    retrieval profile, and where they come from. `note` is '' when both keys have presets of
    their own and no T=1 preset was extrapolated to another size, else says which nearest
    presets were used and what was extrapolated."""
    model, note = aps.lookup(drafter, family, dataset, temperature, target_params_b, target)
    retr, rnote = aps.lookup("ngram", family, dataset, temperature, target=target)
    fields: dict[str, object] = {
        **aps.acceptance_fields(model.key.drafter, model.scale),
        **aps.retrieval_fields(retr.scale),
        "drafter": model.key.drafter,
        "target": model.key.family,
        "source": f"{model.describe()}; retrieval from {retr.describe()}",
        "fitted": "specs.acceptance_presets shapes at the preset scales (published figures: "
        "specs/workload_data/published/figures.toml)",
    }
    notes = [n for n in (note, rnote if retr.key.family != model.key.family else "") if n]
    return fields, "; ".join(notes)


def _dataset_preset(name: str, dataset: str, temperature: float) -> Workload:
    fields, _ = pair_acceptance(_DEFAULT_DRAFTER, _DEFAULT_FAMILY, dataset, temperature)
    prompt, output = _TRAFFIC[dataset]
    return Workload(
        name=name,
        temperature=temperature,
        dataset=dataset,
        acceptance_by_pair=True,
        prompt_len_mean_tokens=prompt,
        output_len_mean_tokens=output,
        **fields,  # type: ignore[arg-type]
    )


_PRESET_LIST = [
    _dataset_preset(d if t == 0.0 else f"{d}-t1", d, t)
    for d in aps.DATASETS
    for t in aps.TEMPERATURES
]
_PRESET_LIST.append(_dataset_preset("summarization", "cnn-dm", 0.0))  # Spec-Bench's task name


def _chain_rows(reach: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
    """Rank-0 conditionals from chain reach rates a_k = P(first k draft tokens accepted)."""
    prev = (1.0, *reach[:-1])
    return tuple((round(a / p, 6),) for a, p in zip(reach, prev, strict=True))


_PRESET_LIST += [
    Workload(
        name="medusa-vicuna-7b",
        temperature=0.0,
        drafter="medusa",
        target="vicuna-7b-v1.3",
        **aps.acceptance_fields("medusa", 1.0),
        prompt_len_mean_tokens=120.0,
        output_len_mean_tokens=400.0,
        source="FasterDecoding/Medusa assets/medusa_acc.csv: Vicuna-7B Medusa heads 1..5 top-1 "
        "accuracy .560 .316 .201 .147 .118, top-5 .780 .563 .417 .340 .300",
        fitted="head k's accuracy is taken as P(accepted | parent accepted) at depth k (Medusa's "
        "own tree construction assumes the same independence); rank 0 = top-1, ranks 1..4 share "
        "top-5 minus top-1 geometrically with ratio 0.6 (assumed: the csv gives top-1 and top-5 "
        "only here); depth_decay 0.8 past head 5 (assumed). Lengths are rough assumptions.",
    ),
    Workload(
        name="vllm-eagle3-minicpm3",
        acceptance="positional",
        temperature=0.0,
        drafter="eagle3",
        target="minicpm3",
        accept_by_rank=_chain_rows((0.58, 0.34, 0.22, 0.15, 0.11)),
        depth_decay=1.0,
        source="vllm PR #24243: EAGLE-3 on MiniCPM3, fraction of drafts whose k-th token is "
        "accepted .58 .34 .22 .15 .11 (chain drafting)",
        fitted="rank-0 conditional at depth k = a_k / a_(k-1) exactly; lower ranks are not "
        "published and are 0, so trees built from this preset are chains; past depth 5 the last "
        "conditional repeats. Lengths are rough assumptions.",
    ),
    Workload(
        name="vllm-eagle3-gptoss-t1",
        acceptance="positional",
        temperature=1.0,
        drafter="eagle3",
        target="gpt-oss-120b",
        accept_by_rank=_chain_rows((0.58, 0.31, 0.16, 0.08, 0.04, 0.02, 0.01)),
        depth_decay=1.0,
        source="vllm PR #24243: EAGLE-3 on gpt-oss-120b at temperature 1, fraction of drafts "
        "whose k-th token is accepted .58 .31 .16 .08 .04 .02 .01 (chain drafting)",
        fitted="rank-0 conditional at depth k = a_k / a_(k-1) exactly (sampling, T=1); lower "
        "ranks not published (0: chains). Lengths are rough assumptions.",
    ),
    Workload(
        name="ngram-code-edit",
        acceptance="positional",
        temperature=0.0,
        drafter="ngram",
        accept_by_rank=_chain_rows((0.81, 0.74, 0.70, 0.68, 0.66)),
        depth_decay=1.0,
        retrieval_accept=(tuple(r[0] for r in _chain_rows((0.81, 0.74, 0.70, 0.68, 0.66))),),
        retrieval_match_probs=(1.0,),
        prompt_len_mean_tokens=2000.0,
        output_len_mean_tokens=300.0,
        source="vllm PR #24344: n-gram drafting on a code-edit set, fraction of drafts whose "
        "k-th token is accepted .81 .74 .70 .68 .66",
        fitted="rank-0 conditional at depth k = a_k / a_(k-1) exactly, as a positional chain and "
        "as the retrieval profile (one match class, since the figures are conditioned on a draft "
        "being proposed). Lengths are rough assumptions.",
    ),
]

WORKLOAD_PRESETS: dict[str, Workload] = {w.name: w for w in _PRESET_LIST}
WORKLOAD_PRESETS.update(_load_data_dir(WORKLOAD_DATA_DIR))
