"""Fitting how acceptance scales with target size, at T = 0 and as a T=1/T=0 ratio.

Why this exists: a head's preset scale is fitted at one target size (spectune.traces.published),
but the same head kind drafts for targets of other sizes; these two fits say how its scale moves
with the target's parameter count, from the figures of workload_data/published/figures.toml
that give one method at several sizes of one family.

- size rule (fit_size_rule; applied through specs.acceptance_presets.for_target_size to the
  SIZE_RULE_KINDS): each "size-fit" figure's scale is fitted on its own tree
  (published.fit_figure); then
  log(scale) = c_series + exponent * log(target_params_b), least squares with one intercept per
  size_series (one head, tree, dataset and temperature at several sizes of one family) and one
  shared exponent, whose standard error comes from the residuals. A "held-out" figure of a
  series is left out of the fit and checked on its series' line (published.check_figures).
  Fitting scales rather than tokens per step takes the trees' different budgets (EAGLE-2: 60 /
  50 / 48 tokens for 7B / 13B / 70B) out of the comparison.
- temperature x size (fit_temperature_size; tested, not applied): over the T > 0 figures that
  name a temperature_series, each with its T = 0 partner (same method, target and dataset),
  log(scale at T=1 / scale at T=0) = c_series + slope * log(target_params_b), least squares with
  one intercept per series; checks_with_temperature_slope predicts the reported T > 0 head
  figures as if the slope were added to the size rule's exponent (workload_data/README.md,
  "Temperature and target size", says why it is not applied).

- a drafter's own T=1 factor on a target (fit_target_t1_factors; applied through
  specs.acceptance_presets.for_target_t1): for each figure marked `t1_factor`, the scale fitted
  to it over the scale fitted to its T = 0 partner, both on their own (shared) tree. It replaces
  the family's T = 1 preset for that drafter kind on that target only.
  target_t1_factor_transfers applies every stored factor of a target to every drafter's T = 0
  preset there: the own-drafter column is what lookup gives, the cross-drafter ones the rule
  keyed by target only, tested and rejected (printed by the benchmark);
  checks_without_own_factors, the same figures without any factor (the extrapolation error).

The first two fits are one least-squares problem, parallel lines in log(target_params_b) with
one intercept per series and a shared slope (_fit_series_lines).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spectune.specs.acceptance_presets import (
    SIZE_RULE_KINDS,
    PublishedFigure,
    SizeRule,
    TargetT1Factor,
    acceptance_presets,
    for_target_size,
    kind_drafting,
    published_figures,
    size_rule,
    target_t1_factors,
)
from spectune.specs.errors import SpecError
from spectune.traces.published import (
    SAMPLES,
    FigureCheck,
    check_figures,
    fit_figure,
    predicted_tokens,
)


@dataclass(frozen=True)
class _SeriesLines:
    """log(value) = intercepts[series] + slope * log(target_params_b), fitted by least squares."""

    slope: float
    stderr: float  # standard error of the slope, from the residuals
    intercepts: dict[str, float]  # per series: the fitted log(value) at 1B parameters


def _fit_series_lines(
    points: Sequence[tuple[str, float, float]], names: Sequence[str], what: str
) -> _SeriesLines:
    """Parallel lines through points (series name, target_params_b, value > 0): one intercept per
    name of `names` (distinct) and one shared slope, least squares on log(value). SpecError
    naming `what` (the points, e.g. "size-fit figures") when fewer than len(names) + 2."""
    import numpy as np

    # design matrix [P, S + 1]: one-hot series columns, then log(target_params_b)
    rows = [[float(n == s) for n in names] + [math.log(size_b)] for s, size_b, _ in points]
    y = [math.log(v) for _, _, v in points]
    dof = len(y) - len(names) - 1
    if dof < 1:
        raise SpecError(f"{len(y)} {what} in {len(names)} series: too few for a fit")
    x, yv = np.array(rows), np.array(y)
    coef, *_ = np.linalg.lstsq(x, yv, rcond=None)
    resid = yv - x @ coef
    cov = float(resid @ resid) / dof * np.linalg.inv(x.T @ x)
    return _SeriesLines(
        float(coef[-1]),
        float(math.sqrt(cov[-1, -1])),
        {n: float(coef[i]) for i, n in enumerate(names)},
    )


# ---- the size rule -----------------------------------------------------------------------------
def fit_size_rule(
    figures: Sequence[PublishedFigure] | None = None,
    samples: int = SAMPLES,
    progress: Callable[[str], None] | None = None,
) -> SizeRule:
    """The size rule's exponent (and its standard error) from the "size-fit" figures (module
    docstring); a "held-out" figure of a series is left out. SpecError when a series mixes keys
    or has one size, a held-out figure's series has no size-fit line, or there are too few
    figures to estimate the error."""
    figures = published_figures() if figures is None else figures
    series: dict[str, list[PublishedFigure]] = {}
    for f in figures:
        if f.role == "size-fit":
            series.setdefault(f.size_series, []).append(f)
    for f in figures:
        if f.role == "held-out" and f.size_series and f.size_series not in series:
            raise SpecError(
                f"held-out figure {f.id} names size series {f.size_series!r}, which has no "
                '"size-fit" figure: its line needs two or more sizes fitted'
            )
    for name, fs in series.items():
        keys = {(f.key.drafter, f.key.family, f.key.dataset, f.key.temperature) for f in fs}
        if len(keys) > 1 or len({f.target_params_b for f in fs}) < 2:
            raise SpecError(
                f"size series {name!r} must be one (drafter, family, dataset, temperature) at "
                f"two or more target sizes; got {sorted(keys)} at "
                f"{sorted(f.target_params_b for f in fs)}B"
            )
    names = sorted(series)
    points, ids = [], []
    for name in names:
        for f in series[name]:
            s = fit_figure(f, samples)
            if progress:
                progress(f"{f.id}: scale {s:.4f} at {f.target_params_b:g}B")
            points.append((name, f.target_params_b, s))
            ids.append(f.id)
    lines = _fit_series_lines(points, names, "size-fit figures")
    return SizeRule(lines.slope, lines.stderr, lines.intercepts, tuple(ids))


# ---- temperature x target size (tested, not applied) -------------------------------------------
@dataclass(frozen=True)
class TemperatureSizeSlope:
    """log(scale at T=1 / scale at T=0) = c_series + slope * log(target params), least squares
    with one intercept per temperature_series: does the T=1 loss of a head shrink as its target
    grows? The size rule applies one exponent at both temperatures; this fit is the test of that
    choice (workload_data/README.md, "Temperature and target size")."""

    slope: float
    stderr: float  # standard error of the slope (least squares)
    fitted_to: tuple[tuple[str, str], ...]  # (T = 1 figure id, its T = 0 partner's id)


def temperature_partner(
    fig: PublishedFigure, figures: Sequence[PublishedFigure]
) -> PublishedFigure:
    """The T = 0 figure of the same method, target and dataset as T > 0 figure `fig` (SpecError
    unless exactly one)."""
    found = [
        f
        for f in figures
        if f.key.temperature == 0.0
        and (f.method, f.target, f.key.dataset) == (fig.method, fig.target, fig.key.dataset)
    ]
    if len(found) != 1:
        raise SpecError(
            f"figure {fig.id} needs one T = 0 figure of method {fig.method!r}, target "
            f"{fig.target!r} and dataset {fig.key.dataset!r}; found {[f.id for f in found]}"
        )
    return found[0]


def fit_temperature_size(
    figures: Sequence[PublishedFigure] | None = None,
    samples: int = SAMPLES,
    progress: Callable[[str], None] | None = None,
) -> TemperatureSizeSlope:
    """The slope of log(T=1/T=0 scale ratio) in log(target size) over the figures that name a
    temperature_series, each with its T = 0 partner (temperature_partner). SpecError when a
    series has one size or there are too few ratios to estimate the error."""
    figures = published_figures() if figures is None else figures
    series: dict[str, list[PublishedFigure]] = {}
    for f in figures:
        if f.temperature_series:
            series.setdefault(f.temperature_series, []).append(f)
    names = sorted(series)
    points, pairs = [], []
    for name in names:
        if len({f.target_params_b for f in series[name]}) < 2:
            raise SpecError(f"temperature series {name!r} must span two or more target sizes")
        for f in series[name]:
            f0 = temperature_partner(f, figures)
            ratio = fit_figure(f, samples) / fit_figure(f0, samples)
            if progress:
                progress(f"{f.id}: T=1/T=0 scale ratio {ratio:.4f} at {f.target_params_b:g}B")
            points.append((name, f.target_params_b, ratio))
            pairs.append((f.id, f0.id))
    lines = _fit_series_lines(points, names, "T=1/T=0 ratios")
    return TemperatureSizeSlope(lines.slope, lines.stderr, tuple(pairs))


def checks_with_temperature_slope(
    slope: TemperatureSizeSlope, samples: int = SAMPLES
) -> list[FigureCheck]:
    """The T > 0 figures of size-rule kinds outside the slope's fit that are "reported" or on a
    target with a T=1 factor of its own (the Llama-3.3-70B T=1 rows) predicted as if the slope
    were applied instead of any target factor: the family's T = 1 preset, rescaled by the size
    rule's exponent plus the slope."""
    own = {f.target for f in target_t1_factors()}
    figures = [
        f
        for f in published_figures()
        if f.key.temperature > 0
        and f.key.drafter in SIZE_RULE_KINDS
        and not f.temperature_series
        and (f.role == "reported" or f.target in own)
    ]
    rule = size_rule()
    return check_figures(
        figures,
        samples,
        dataclasses.replace(rule, exponent=rule.exponent + slope.slope),
        target_factors=False,
    )


# ---- a drafter's own T=1 factor on its target -------------------------------------------------
def target_t1_factor_to_dict(f: TargetT1Factor) -> dict[str, Any]:
    """The presets.json `target_t1_factors` row of a factor."""
    return {
        "drafter": f.drafter,
        "target": f.target,
        "dataset": f.dataset,
        "factor": round(f.factor, 6),
        "method": f.method,
        "fitted_to": list(f.fitted_to),
        "scale_t1": round(f.scale_t1, 6),
        "scale_t0": round(f.scale_t0, 6),
    }


def fit_target_t1_factors(
    figures: Sequence[PublishedFigure] | None = None,
    samples: int = SAMPLES,
    progress: Callable[[str], None] | None = None,
) -> list[TargetT1Factor]:
    """One TargetT1Factor per figure marked `t1_factor`: its fitted scale over its T = 0
    partner's (temperature_partner), both on the same tree, for the figure's drafter kind on its
    target and dataset. SpecError when the partner is missing or measured on another tree, the
    figure drafts otherwise than its kind's presets assume, or two figures fix one (drafter,
    target, dataset)."""
    figures = published_figures() if figures is None else figures
    out: list[TargetT1Factor] = []
    for f in figures:
        if not f.t1_factor:
            continue
        f0 = temperature_partner(f, figures)
        if f0.tree != f.tree or f0.target_params_b != f.target_params_b:
            raise SpecError(
                f"t1_factor figure {f.id} and its T = 0 partner {f0.id} must share the tree and "
                "the target size (the factor is a ratio of one setting at two temperatures)"
            )
        if f.drafted != kind_drafting(f.key.drafter):
            raise SpecError(
                f"t1_factor figure {f.id} drafts {f.drafted}, its kind's presets assume "
                f"{kind_drafting(f.key.drafter)}: the factor would multiply the wrong T = 0 preset"
            )
        key = (f.key.drafter, f.target.lower(), f.key.dataset)
        if any((g.drafter, g.target, g.dataset) == key for g in out):
            raise SpecError(f"two t1_factor figures for drafter/target/dataset {key}: keep one")
        s1, s0 = fit_figure(f, samples), fit_figure(f0, samples)
        out.append(TargetT1Factor(*key, s1 / s0, f.method, (f.id, f0.id), s1, s0))
        if progress:
            progress(f"{f.method} on {f.target}/{f.key.dataset}: T=1 factor {s1 / s0:.4f}")
    return out


@dataclass(frozen=True)
class FactorTransfer:
    """A drafter's T = 1 figure on a target predicted from its kind's T = 0 preset at the
    target's size times the T=1 factor of `from_method` on that target and dataset: its own
    (what lookup applies) or another drafter's (the cross-drafter rule, tested and rejected)."""

    check: FigureCheck
    from_method: str
    factor: float
    own: bool  # the factor is the figure's own drafter's


def target_t1_factor_transfers(samples: int = SAMPLES) -> list[FactorTransfer]:
    """Every `t1_factor` figure predicted from its kind's T = 0 preset at its target's size
    times each stored factor of the same target and dataset: its own drafter's (the prediction
    lookup gives, whose error is the T = 0 preset's at that size) and every other drafter's
    (the rule keyed by target only, pre-registered in commit 2f75d47 and rejected: the ratio
    depends on the drafter)."""
    figures = {f.id: f for f in published_figures()}
    presets, rule = acceptance_presets(), size_rule()
    factors = target_t1_factors()
    out = []
    for own in factors:
        f1, f0 = figures[own.fitted_to[0]], figures[own.fitted_to[1]]
        p0 = for_target_size(presets[f0.key], f0.target_params_b, rule)
        for by in factors:
            if (by.target, by.dataset) != (own.target, own.dataset):
                continue
            p = dataclasses.replace(
                p0,
                key=f1.key,
                scale=p0.scale * by.factor,
                rule=f"{p0.key.label} at {p0.target_params_b:g}B x {by.method}'s T=1 factor on "
                f"{by.target}/{by.dataset}",
            )
            check = FigureCheck(f1, p, predicted_tokens(f1, p.scale, samples))
            out.append(FactorTransfer(check, by.method, by.factor, by is own))
    return out


def checks_without_own_factors(samples: int = SAMPLES) -> list[FigureCheck]:
    """The `t1_factor` figures predicted as a (drafter, target) without a factor of its own is:
    the family's T = 1 preset moved to the target's size by the size rule. Their error range is
    the extrapolation error a T > 0 lookup's note quotes (T1_EXTRAPOLATED_ERROR)."""
    figures = [f for f in published_figures() if f.t1_factor]
    return check_figures(figures, samples, target_factors=False)
