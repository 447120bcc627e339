"""The two meanings of tokens/s, named and computed in one place.

spectune predicts output tokens/s two ways, and every table, chart and export says which one it
shows, with the labels defined here:

- `SERVED`, "served tok/s incl. prefill": a saturated server. Each decoding iteration also
  prefills the prompts of the requests that replace the finished ones (the turnover term of
  planner.objective), and the batch is capped at what the KV cache holds at the context. What
  `spectune plan` scores and records in a policy file's `predicted.tokens_per_s`, and what an
  export's predicted gains compare.
- `DECODE`, "decode tok/s": pure decode iterations of the running batch at exactly that batch
  size, no prefill and no KV cap: batch * E[tokens per step] / iteration. What one iteration on
  the What-if page and an executor measurement (which times decode steps at a fixed batch)
  report. At a batch the KV cache holds it is at least the served figure (the same iteration
  without the turnover term), and it is much larger where the cache caps the batch or prompts
  are long (a 70B target at batch 128).

Both come from the planner's one closed-form objective, `planner.objective.scenario_objective`:
the served figure is that objective, the decode figure its `decode_objective` view (the same
cost model and acceptance caches, with turnover and the KV cap off). Callers hold one served
objective and ask it for either kind; nothing else computes tokens/s.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import numpy as np

from spectune.planner.objective import SAMPLES, ClosedFormObjective, scenario_objective
from spectune.specs import ResolvedScenario, SpecError, TreePolicy


@dataclass(frozen=True)
class TokensPerSKind:
    """One meaning of tokens/s: `key` for files and options, `label` for every column, axis and
    metric that shows it, `description` for legends and help."""

    key: str
    label: str
    description: str


SERVED = TokensPerSKind(
    "served",
    "served tok/s incl. prefill",
    "output tokens/s of a saturated server: decode iterations plus the prefill of the requests "
    "that replace finished ones, batch capped by the KV cache at the context",
)
DECODE = TokensPerSKind(
    "decode",
    "decode tok/s",
    "output tokens/s of pure decode iterations at exactly this batch size: no prefill, no "
    "KV-cache cap on the batch",
)
KINDS: tuple[TokensPerSKind, ...] = (SERVED, DECODE)
"""Every kind, the planner's own (SERVED) first."""


def kind_named(key: str) -> TokensPerSKind:
    """The kind with this key ('served' or 'decode'); anything else is a SpecError."""
    for k in KINDS:
        if k.key == key:
            return k
    raise SpecError(f"tokens/s kind {key!r}: expected one of {', '.join(k.key for k in KINDS)}")


def legend() -> str:
    """One line per kind, '<label>: <description>', for the foot of a table or a chart."""
    return "\n".join(f"{k.label}: {k.description}" for k in KINDS)


def served_objective(
    resolved: ResolvedScenario, *, acceptance: Any = None, samples: int = SAMPLES, seed: int = 0
) -> ClosedFormObjective:
    """The objective that prices served tok/s for a scenario (scenario_objective, turnover and
    KV cap on); `acceptance` replaces the workload's acceptance model (an uploaded trace)."""
    return scenario_objective(resolved, acceptance=acceptance, samples=samples, seed=seed)


def decode_objective(objective: ClosedFormObjective) -> ClosedFormObjective:
    """The decode view of an objective: the same cost model, acceptance model and caches of
    E[tokens per step] and tree sizes (which depend on neither term), with the prefill turnover
    and the KV cap off. A decode objective is its own view."""
    view = copy.copy(objective)  # shallow: the caches stay shared with `objective`
    view.output_tokens = None
    view.kv = None
    return view


def is_served(objective: ClosedFormObjective) -> bool:
    """Whether an objective prices served tok/s (turnover or the KV cap on)."""
    return bool(objective.output_tokens) or objective.kv is not None


def objective_for(objective: ClosedFormObjective, kind: TokensPerSKind) -> ClosedFormObjective:
    """The objective that prices `kind`, from a served objective (SpecError when asked for
    served tok/s of a decode-only objective, which lacks the terms)."""
    if kind == DECODE:
        return decode_objective(objective)
    if not is_served(objective):
        raise SpecError(
            "served tok/s needs the scenario's served objective (planner.tokens_per_s."
            "served_objective); this one is decode-only"
        )
    return objective


def tokens_per_s(
    objective: ClosedFormObjective,
    kind: TokensPerSKind,
    policy: TreePolicy | None,
    batches: Any,
    context: int,
) -> np.ndarray:
    """`kind` tokens/s of a policy (None: speculation off) at batch sizes int[P] (or a scalar)
    and one context -> float64[P]."""
    return objective_for(objective, kind).many(policy, batches, context)


@dataclass(frozen=True)
class TokensPerS:
    """Both kinds of tokens/s of one policy at one (batch, context)."""

    served_tokens_per_s: float
    decode_tokens_per_s: float

    def of(self, kind: TokensPerSKind) -> float:
        """The figure of this kind."""
        return self.served_tokens_per_s if kind == SERVED else self.decode_tokens_per_s


def both(
    objective: ClosedFormObjective, policy: TreePolicy | None, batch: int, context: int
) -> TokensPerS:
    """Served and decode tok/s of a policy at (batch, context), from a served objective."""
    return TokensPerS(
        served_tokens_per_s=float(tokens_per_s(objective, SERVED, policy, batch, context)[0]),
        decode_tokens_per_s=float(tokens_per_s(objective, DECODE, policy, batch, context)[0]),
    )
