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
"""

from __future__ import annotations

import itertools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from spectune.specs.errors import SpecError
from spectune.specs.io import from_mapping, help_field, load_spec

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


def load_workload(name_or_path: str | os.PathLike[str]) -> Workload:
    """A preset name, or the path of a JSON/TOML file with Workload's fields."""
    return load_spec(Workload, name_or_path, WORKLOAD_PRESETS, "workload")


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
# Spec-Bench (hemingkx/Spec-Bench Leaderboard.md, 3090 table, Vicuna-7B-v1.3, greedy): EAGLE-2
# mean accepted tokens 4.36 over all tasks, overall speedup 2.25x; per-task speedups multi-turn
# 2.71x, summarization 2.19x, math reasoning 2.71x. PLD 1.74 tokens, overall 1.55x; multi-turn
# 1.57x, summarization 2.31x, math 1.62x. Per-task accepted tokens are estimated as
# overall tokens x task speedup / overall speedup (speedup ~ tokens per step at a fixed step cost).
_SPECBENCH = (
    "Spec-Bench Leaderboard.md (hemingkx/Spec-Bench, RTX 3090 table, Vicuna-7B-v1.3, greedy): "
    "EAGLE-2 4.36 mean accepted tokens, PLD 1.74; per-task speedups"
)
_FIT_EAGLE = (
    "confidence_mean[d] = m1 * 0.93**d (d = 0..), Beta concentration 4, tail 0.45, identity "
    "calibration (EAGLE-2: draft confidence ~ acceptance); m1 fitted by bisection so that the "
    "EAGLE-2 default tree (dynamic-topk, depth 7, topk 10, 60 draft tokens = budget 61) yields "
    "{tau:.2f} tokens/step = {why} (spectune.planner.acceptance.fit.fit_confidence_scale, 8000 "
    "sampled trees). Retrieval: rho[m][j] = s * (0.6, 0.8, 1.0)[m-1] * 0.9**j with match-length "
    "probabilities (0.2, 0.2, 0.3); s fitted so a 10-token PLD chain yields {pld:.2f} tokens/step "
    "= PLD's Spec-Bench 1.74 x task/overall speedup ({pld_why}). The shapes (decay 0.93, tail, "
    "match-length weights) are assumptions; only the scales are fitted."
)
_RETR_MATCH = (0.2, 0.2, 0.3)


def _retrieval_rows(scale: float) -> tuple[tuple[float, ...], ...]:
    return tuple(tuple(min(0.98, scale * w * 0.9**j) for j in range(10)) for w in (0.6, 0.8, 1.0))


def _eagle_task(
    name: str,
    m1: float,
    tau: float,
    why: str,
    pld_scale: float,
    pld: float,
    pld_why: str,
    prompt: float,
    output: float,
) -> Workload:
    return Workload(
        name=name,
        acceptance="confidence",
        temperature=0.0,
        confidence_mean=tuple(min(0.97, m1 * 0.93**d) for d in range(8)),
        depth_decay=0.93,
        confidence_concentration=4.0,
        confidence_tail=0.45,
        retrieval_accept=_retrieval_rows(pld_scale),
        retrieval_match_probs=_RETR_MATCH,
        prompt_len_mean_tokens=prompt,
        output_len_mean_tokens=output,
        source=_SPECBENCH + "; prompt/output lengths are rough assumptions, not measured",
        fitted=_FIT_EAGLE.format(tau=tau, why=why, pld=pld, pld_why=pld_why),
    )


# Fitted values (m1, pld scale): reproduced by tests/test_acceptance.py::test_presets_reproduce_sources.
_PRESET_LIST = [
    _eagle_task(
        "mt-bench",
        0.7935,
        4.36 * 2.71 / 2.25,
        "4.36 x 2.71/2.25 (multi-turn)",
        0.6712,
        1.74 * 1.57 / 1.55,
        "multi-turn 1.57x",
        prompt=120.0,
        output=400.0,
    ),
    _eagle_task(
        "gsm8k",
        0.7944,
        4.36 * 2.71 / 2.25,
        "4.36 x 2.71/2.25 (Spec-Bench math reasoning is GSM8K)",
        0.6969,
        1.74 * 1.62 / 1.55,
        "math 1.62x",
        prompt=100.0,
        output=250.0,
    ),
    _eagle_task(
        "summarization",
        0.6407,
        4.36 * 2.19 / 2.25,
        "4.36 x 2.19/2.25 (summarization, CNN/DM)",
        0.9450,
        1.74 * 2.31 / 1.55,
        "summarization 2.31x",
        prompt=900.0,
        output=120.0,
    ),
    _eagle_task(
        "humaneval",
        0.7935,
        4.36 * 2.71 / 2.25,
        "ASSUMED equal to math reasoning (HumanEval is not a Spec-Bench task; replace with a "
        "trace-fitted preset)",
        0.6969,
        1.74 * 1.62 / 1.55,
        "ASSUMED as math",
        prompt=150.0,
        output=200.0,
    ),
]


def _chain_rows(reach: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
    """Rank-0 conditionals from chain reach rates a_k = P(first k draft tokens accepted)."""
    prev = (1.0, *reach[:-1])
    return tuple((round(a / p, 6),) for a, p in zip(reach, prev, strict=True))


def _medusa_rows(
    top1: tuple[float, ...], top5: tuple[float, ...], ratio: float = 0.6
) -> tuple[tuple[float, ...], ...]:
    """Rank 0 = top-1 accuracy; ranks 1..4 share top5 - top1 geometrically (ratio assumed)."""
    w = [ratio**i for i in range(4)]
    rows = []
    for a1, a5 in zip(top1, top5, strict=True):
        rest = a5 - a1
        rows.append((a1, *(round(rest * x / sum(w), 6) for x in w)))
    return tuple(rows)


_PRESET_LIST += [
    Workload(
        name="medusa-vicuna-7b",
        acceptance="positional",
        temperature=0.0,
        accept_by_rank=_medusa_rows(
            (0.560, 0.316, 0.201, 0.147, 0.118), (0.780, 0.563, 0.417, 0.340, 0.300)
        ),
        depth_decay=0.8,
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
