"""Prompt and output length distributions: presets that follow public dataset statistics, or
fixed values.

Lengths are drawn from a log-normal with the preset's mean and coefficient of variation, rounded
and clipped to [min_tokens, max_tokens]. Log-normal because request lengths of chat and
benchmark sets are right-skewed (a long tail of long prompts and answers); where a source gives
only a mean, the spread is a stated assumption in `source`, not a measured figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spectune.specs.errors import SpecError, closest_names
from spectune.specs.io import help_field

MAX_LENGTH_TOKENS = 1 << 24
"""Longest mean or fixed length, tokens (past every model's context)."""
MAX_CV = 100.0
"""Largest coefficient of variation of a length distribution."""


@dataclass(frozen=True)
class LengthDist:
    """A distribution of token counts (one side of a request: prompt or output)."""

    mean_tokens: float = help_field(help="mean length, tokens (before clipping)")
    cv: float = help_field(0.0, help="coefficient of variation (std / mean); 0: fixed length")
    min_tokens: int = help_field(1, help="shortest length drawn")
    max_tokens: int = help_field(1 << 20, help="longest length drawn")
    source: str = help_field("fixed", help="where the mean and spread come from")

    def __post_init__(self) -> None:
        if not 1 <= self.mean_tokens <= MAX_LENGTH_TOKENS:
            raise SpecError(
                f"mean length must be in 1..{MAX_LENGTH_TOKENS} tokens, got {self.mean_tokens}"
            )
        if not 0 <= self.cv <= MAX_CV:
            raise SpecError(f"coefficient of variation must be in [0, {MAX_CV:g}], got {self.cv}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise SpecError(
                f"need 1 <= min_tokens <= max_tokens, got {self.min_tokens}, {self.max_tokens}"
            )

    @classmethod
    def fixed(cls, tokens: int) -> LengthDist:
        if not 1 <= tokens <= MAX_LENGTH_TOKENS:
            raise SpecError(
                f"a fixed length must be in 1..{MAX_LENGTH_TOKENS} tokens, got {tokens}"
            )
        return cls(float(tokens), 0.0, tokens, tokens, f"fixed {tokens} tokens")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """int64[n] lengths. A log-normal with mean m and cv c has sigma^2 = ln(1 + c^2) and
        mu = ln(m) - sigma^2 / 2."""
        if self.cv == 0.0:
            x = np.full(n, self.mean_tokens)
        else:
            s2 = np.log1p(self.cv**2)
            x = rng.lognormal(np.log(self.mean_tokens) - s2 / 2, np.sqrt(s2), size=n)
        return np.clip(np.rint(x), self.min_tokens, self.max_tokens).astype(np.int64)


@dataclass(frozen=True)
class LengthPreset:
    """Prompt and output length distributions of one dataset."""

    name: str
    prompt: LengthDist
    output: LengthDist


_VLLM_PAPER = (
    "Kwon et al., 'Efficient Memory Management for LLM Serving with PagedAttention' (SOSP 2023), "
    "Fig. 11 input/output length histograms (means as printed in the figure)"
)

LENGTH_PRESETS: dict[str, LengthPreset] = {
    p.name: p
    for p in (
        # ShareGPT (ShareGPT_V3_unfiltered_cleaned_split, LLaMA tokenizer): mean input 161.31,
        # mean output 337.99 tokens; both histograms are long-tailed over 0..2048.
        LengthPreset(
            "sharegpt",
            LengthDist(
                161.31,
                1.5,
                4,
                2048,
                f"{_VLLM_PAPER}: ShareGPT mean input 161.31 tokens; "
                "cv 1.5 assumed from the long tail of the histogram",
            ),
            LengthDist(
                337.99,
                1.0,
                4,
                2048,
                f"{_VLLM_PAPER}: ShareGPT mean output 337.99 tokens; cv 1.0 assumed",
            ),
        ),
        # Alpaca (same source): short instructions and answers; mean input 19.31, output 58.45.
        LengthPreset(
            "alpaca",
            LengthDist(
                19.31, 0.8, 2, 512, f"{_VLLM_PAPER}: Alpaca mean input 19.31 tokens; cv 0.8 assumed"
            ),
            LengthDist(
                58.45,
                0.8,
                2,
                512,
                f"{_VLLM_PAPER}: Alpaca mean output 58.45 tokens; cv 0.8 assumed",
            ),
        ),
        # MT-Bench: 80 two-turn questions (Zheng et al. 2023). Questions are one to a few
        # sentences; the second turn carries the first exchange. Spec-Bench and EAGLE generate
        # with max_new_tokens=1024, which caps the answers.
        LengthPreset(
            "mt-bench",
            LengthDist(
                120.0,
                1.0,
                8,
                2048,
                "MT-Bench (Zheng et al. 2023, 80 two-turn questions): "
                "short questions, turn 2 includes turn 1; mean 120 tokens and cv 1.0 are "
                "our estimate, not a published figure",
            ),
            LengthDist(
                350.0,
                0.6,
                8,
                1024,
                "MT-Bench answers capped at max_new_tokens=1024 "
                "(Spec-Bench / EAGLE evaluation setting); mean 350 and cv 0.6 are our "
                "estimate, not a published figure",
            ),
        ),
        # HumanEval: 164 function signatures + docstrings (Chen et al. 2021); completions are
        # short function bodies.
        LengthPreset(
            "humaneval",
            LengthDist(
                130.0,
                0.5,
                32,
                1024,
                "HumanEval (Chen et al. 2021, 164 problems): "
                "signature + docstring prompts; mean 130 tokens and cv 0.5 are our "
                "estimate",
            ),
            LengthDist(
                180.0,
                0.7,
                8,
                512,
                "HumanEval completions (canonical bodies are a few "
                "lines; models add explanations until the stop criterion); mean 180 and "
                "cv 0.7 are our estimate",
            ),
        ),
        # LongBench v1: 21 tasks, 'average length of most tasks ranging from 5k to 15k'
        # (words for English, characters for Chinese; THUDM/LongBench README). Outputs are
        # short: the per-task maximum generation lengths in its config range 32..512.
        LengthPreset(
            "longbench",
            LengthDist(
                10000.0,
                0.5,
                1000,
                32000,
                "THUDM/LongBench README: most tasks average "
                "5k-15k words; mean 10k tokens, cv 0.5 assumed",
            ),
            LengthDist(
                128.0,
                1.0,
                8,
                512,
                "THUDM/LongBench config: maximum generation "
                "lengths 32..512 per task; mean 128, cv 1.0 assumed",
            ),
        ),
    )
}


def length_preset(name: str) -> LengthPreset:
    key = name.lower()
    if key not in LENGTH_PRESETS:
        near = closest_names(key, LENGTH_PRESETS)
        hint = f" Did you mean {', '.join(repr(c) for c in near)}?" if near else ""
        raise SpecError(
            f"unknown length preset {name!r}.{hint} Known: {', '.join(sorted(LENGTH_PRESETS))}; "
            "or give --prompt-tokens / --output-tokens as N or MEAN~CV"
        )
    return LENGTH_PRESETS[key]


def parse_length(text: str) -> LengthDist:
    """'N' (fixed) or 'MEAN~CV' (log-normal), e.g. '512' or '300~0.8'."""
    try:
        if len(text) > 40:
            raise ValueError(text)
        if "~" in text:
            mean, cv = text.split("~", 1)
            return LengthDist(float(mean), float(cv), source=f"user: mean {mean}, cv {cv}")
        return LengthDist.fixed(int(text))
    except ValueError as e:
        if isinstance(e, SpecError):
            raise
        raise SpecError(
            f"cannot parse length {text[:40]!r}; expected a token count like 512 or MEAN~CV like 300~0.8"
        ) from None
