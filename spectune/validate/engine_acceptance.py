"""Acceptance from what an engine reports: per-position rates and mean accept lengths.

A production engine does not give the target's token at every tree node (what trace replay
needs), but it does report:
- per-position acceptance (vLLM's SpecDecoding metrics, `vllm bench serve`): a_k = P(the k-th
  draft token of a chain is accepted), unconditional, k = 1..K. A chain is accepted up to its
  first miss, so the conditionals c_k = a_k / a_(k-1) (a_0 = 1) are a positional acceptance
  table with one rank per depth (Workload.accept_by_rank = ((c_1,), (c_2,), ...)), the form
  specs.workload builds its chain presets in. `fit_positional` averages the observations'
  a_k weighted by their drafts (equal weights where the file does not count drafts); sigma_k is
  the binomial standard error sqrt(a_k (1 - a_k) / drafts) when drafts are counted, else the
  standard error of the mean over observations.
- mean accept length per configuration (SGLang's `accept len`, vLLM's mean acceptance length,
  benchmark results): `fit_scale` finds the one scale s of the drafter kind's acceptance shape
  (specs.acceptance_presets.acceptance_fields, the shape the presets are fitted with) whose
  expected tokens per step over every configuration's tree best match the measured lengths
  (least squares, bounded scalar search); sigma_s = sqrt(s^2 / sum_i (d pred_i / d s)^2) with
  s^2 = SSR / (n - 1), undetermined (NaN) for one configuration.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

from spectune.specs import SpecError, TreePolicy
from spectune.specs.acceptance_presets import acceptance_fields, normalize_kind
from spectune.specs.workload import Workload
from spectune.validate.engine_points import EnginePoint

SCALE_RANGE = {"mtp": (0.05, 1.0), "ngram": (0.01, 1.2), "medusa": (0.05, 1.8)}
DEFAULT_SCALE_RANGE = (0.05, 1.2)
SAMPLES = 2000


@dataclass(frozen=True)
class PositionalFit:
    """Chain acceptance by position (position 1 first)."""

    reach: tuple[float, ...]  # a_k: P(k-th draft token accepted)
    sigma: tuple[float, ...]
    observations: int
    drafts: int | None  # drafts counted over all observations (None: not counted)

    @property
    def conditionals(self) -> tuple[float, ...]:
        """c_k = a_k / a_(k-1): P(k-th accepted | (k-1)-th accepted), capped at 1."""
        out, prev = [], 1.0
        for a in self.reach:
            out.append(min(1.0, a / prev) if prev > 0 else 0.0)
            prev = a
        return tuple(out)

    @property
    def accept_length(self) -> float:
        """Expected tokens per step of the full chain: 1 + sum_k a_k."""
        return 1.0 + float(sum(self.reach))


@dataclass(frozen=True)
class ConfigAccept:
    """One configuration's measured mean accept length (the scale fit's input)."""

    label: str
    policy: TreePolicy
    accept_length: float
    weight: float = 1.0


@dataclass(frozen=True)
class ScaleFit:
    """The drafter kind's acceptance scale and each configuration's residual."""

    kind: str
    scale: float
    sigma: float
    configs: tuple[ConfigAccept, ...]
    predicted: tuple[float, ...]


def fit_positional(rates: Sequence[tuple[Sequence[float], int | None]]) -> PositionalFit:
    """Mean per-position acceptance of observations given as (a_1..a_K, drafts or None);
    positions past an observation's K do not count it."""
    rows = [(tuple(float(x) for x in r), d) for r, d in rates if len(r)]
    if not rows:
        raise SpecError("no per-position acceptance rates in the observations")
    for r, _ in rows:
        if any(not (0.0 <= x <= 1.0) for x in r):
            raise SpecError(f"per-position acceptance rates must be in [0, 1], got {r}")
    counted = all(d is not None and d > 0 for _, d in rows)
    k = max(len(r) for r, _ in rows)
    reach, sigma = [], []
    for i in range(k):
        vals = np.array([r[i] for r, _ in rows if len(r) > i])
        w = np.array([float(d) if counted else 1.0 for r, d in rows if len(r) > i])  # type: ignore[arg-type]
        a = float(np.average(vals, weights=w))
        if counted:
            s = math.sqrt(a * (1 - a) / float(w.sum()))
        elif len(vals) > 1:
            s = float(np.std(vals, ddof=1) / math.sqrt(len(vals)))
        else:
            s = math.nan
        reach.append(a)
        sigma.append(s)
    drafts = int(sum(d for _, d in rows if d)) if counted else None
    return PositionalFit(tuple(reach), tuple(sigma), len(rows), drafts)


def _expected(policy: TreePolicy, kind: str, scale: float) -> float:
    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import expected_tokens_for_policy

    wl = Workload(name="engine-fit", **acceptance_fields(kind, scale))
    return float(expected_tokens_for_policy(policy, acceptance_model(wl), samples=SAMPLES))


def fit_scale(configs: Sequence[ConfigAccept], kind: str) -> ScaleFit:
    """The acceptance scale of drafter kind `kind` fitting every configuration's accept length."""
    from scipy.optimize import minimize_scalar

    if not configs:
        raise SpecError("no speculative configuration with a mean accept length to fit")
    kind = normalize_kind(kind)
    lo, hi = SCALE_RANGE.get(kind, DEFAULT_SCALE_RANGE)
    w = np.array([c.weight for c in configs], dtype=np.float64)
    meas = np.array([c.accept_length for c in configs])

    def preds(s: float) -> np.ndarray:
        return np.array([_expected(c.policy, kind, s) for c in configs])

    def loss(s: float) -> float:
        return float(np.sum(w * (preds(s) - meas) ** 2))

    res = minimize_scalar(loss, bounds=(lo, hi), method="bounded", options={"xatol": 1e-4})
    s = float(res.x)
    p = preds(s)
    h = max(1e-3, 1e-2 * s)
    dp = (preds(min(s + h, hi)) - preds(max(s - h, lo))) / (min(s + h, hi) - max(s - h, lo))
    n = len(configs)
    sigma = math.nan
    if n > 1 and float(np.sum(w * dp * dp)) > 0:
        s2 = float(np.sum(w * (p - meas) ** 2)) / (n - 1) / float(np.mean(w))
        sigma = math.sqrt(s2 / float(np.sum(w * dp * dp) / np.mean(w)))
    return ScaleFit(kind, s, sigma, tuple(configs), tuple(float(x) for x in p))


def positional_workload(
    fit: PositionalFit, name: str, *, target: str, drafter: str, source: str
) -> Workload:
    """A positional Workload (chain rows) from per-position rates."""
    return Workload(
        name=name,
        acceptance="positional",
        accept_by_rank=tuple((round(c, 6),) for c in fit.conditionals),
        target=target,
        drafter=drafter,
        source=source,
        fitted=(
            f"per-position acceptance of {fit.observations} observations"
            + (f" ({fit.drafts} drafts)" if fit.drafts else "")
            + ": conditionals a_k / a_(k-1) (spectune fit-engine)"
        ),
    )


def scale_workload(fit: ScaleFit, name: str, *, target: str, drafter: str, source: str) -> Workload:
    """A Workload with the drafter kind's acceptance shape at the fitted scale."""
    return Workload(
        name=name,
        target=target,
        drafter=drafter,
        source=source,
        fitted=(
            f"scale {fit.scale:.4f} of the {fit.kind} shape fitted to the mean accept length of "
            f"{len(fit.configs)} configurations (spectune fit-engine)"
        ),
        **acceptance_fields(fit.kind, fit.scale),
    )


def workload_dict(wl: Workload) -> dict[str, object]:
    """A Workload as the JSON object load_workload reads back."""
    return asdict(wl)


@dataclass(frozen=True)
class AcceptanceFit:
    """What engine output says about acceptance: per-position rates (chains), the drafter
    kind's scale from mean accept lengths, and the mean accept length per batch size."""

    positional: PositionalFit | None
    scale: ScaleFit | None
    by_batch: tuple[tuple[int, float, int], ...]  # (batch, mean accept length, observations)

    def workload(self, name: str, *, target: str, drafter: str, source: str) -> Workload | None:
        """The positional workload where rates were reported, else the scaled shape."""
        if self.positional is not None:
            return positional_workload(
                self.positional, name, target=target, drafter=drafter, source=source
            )
        if self.scale is not None:
            return scale_workload(self.scale, name, target=target, drafter=drafter, source=source)
        return None


def fit_acceptance(
    rates: Sequence[tuple[Sequence[float], int | None]],
    points: Sequence[EnginePoint],
    drafter_kind: str | None,
) -> AcceptanceFit:
    """Acceptance of per-position `rates` ((a_1..a_K, drafts)) and of the measured accept
    lengths of speculative `points` (the scale needs a model drafter's kind)."""
    spec = [p for p in points if p.speculative and p.accept_measured and p.policy is not None]
    batches: dict[int, list[float]] = {}
    groups: dict[TreePolicy, list[float]] = {}
    for p in spec:
        batches.setdefault(p.batch, []).append(p.accept_length)
        assert p.policy is not None
        groups.setdefault(p.policy, []).append(p.accept_length)
    configs = [
        ConfigAccept(f"{q.depth}/{q.topk}/{q.budget}", q, float(np.mean(v)), float(len(v)))
        for q, v in groups.items()
    ]
    return AcceptanceFit(
        positional=fit_positional(rates) if rates else None,
        scale=fit_scale(configs, drafter_kind) if configs and drafter_kind else None,
        by_batch=tuple((b, float(np.mean(v)), len(v)) for b, v in sorted(batches.items())),
    )
