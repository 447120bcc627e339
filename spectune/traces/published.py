"""Fitting the acceptance presets to published accept lengths, and checking them.

Why this exists: spectune.specs.acceptance_presets holds one fitted scale per (drafter kind,
target family, dataset, temperature); this module computes those scales from
workload_data/published/figures.toml and measures how well every preset reproduces every
figure (benchmarks/bench_acceptance.py, tests/test_acceptance_presets.py).

- fit: for each key with a "fit" figure, the scale s such that the figure's own tree, built from
  the kind's shape at s (specs.acceptance_presets.acceptance_fields), yields the published
  tokens per step: bisection, since tokens per step grow with s.
- derive: a key without a figure takes its scale from fitted keys by one of three rules, written
  into the preset's `rule`:
  * temperature: s(K, F, D, 1) = s(K, F, D, 0) * s(R, F', D, 1) / s(R, F', D, 0), with R the
    reference of K's drafting at T > 0 (specs.acceptance_presets.DRAFTING, same weights at both
    temperatures) in family F' = F where fitted, else the reference's own family: for top-k
    drafts the EAGLE head (EAGLE-2 figures, F' else llama-3), for sampled drafts the draft model
    (SpS figures, F' else llama-2). Why the drafting matters: a top-k child is accepted with the
    target's probability of the drafter's best token; a sampled child is a draw from the
    drafter's whole T = 1 distribution, accepted with min(1, p/q), so the drafter's flattening
    at T = 1 costs it more (EAGLE-2 T=1/T=0 scale ratio 0.89-0.93 per dataset, SpS 0.79-0.86);
  * family: s(K, F, D, T) = s(K, G, D, T) * r, where G is the nearest family with K fitted and
    r = s(eagle, F, D, T) / s(eagle, G, D, T) when both families have EAGLE fits, else 1
    (copied: no figure ties the two families together);
  * dataset: a figure given across topics (DeepSeek-V3's MTP) carries to every dataset.
  Every preset records the target size its scale describes (its figure's, or its source's).
- check: predicted tokens per step of every figure's tree under its key's preset; a T > 0
  figure drafted otherwise than its kind's presets assume (EAGLE-1's sampled drafts, against
  the EAGLE head's top-k presets) is predicted from the key's T = 0 preset by the temperature
  rule of its own drafting; a preset of a size-rule kind is then rescaled to the figure's target
  size (specs.acceptance_presets.for_target_size); a figure that names a size_series is
  predicted on its series' fitted line: a "size-fit" one in sample, a "held-out" one (left out
  of the fit) out of sample, from its series' other sizes; a T > 0 figure whose drafter kind
  has a T=1 factor of its own on the figure's target takes the kind's T = 0 preset at its size
  times that factor (specs.acceptance_presets.for_target_t1), and the `t1_factor` figure that
  fixes the factor is predicted by its fitted scale (its T = 0 partner's times the factor).

The size rule (its exponent and the series' lines), the temperature x size slope and the
drafters' own T=1 factors on their targets are fitted in spectune.traces.size_fits.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from spectune.specs.acceptance_presets import (
    DATASETS,
    DRAFTING,
    PRESETS_FILE,
    TEMPERATURES,
    AcceptancePreset,
    PresetKey,
    PublishedFigure,
    SizeRule,
    acceptance_fields,
    acceptance_presets,
    for_target_size,
    for_target_t1,
    kind_drafting,
    published_figures,
    size_rule,
    target_t1_factors,
)
from spectune.specs.errors import SpecError
from spectune.specs.policy import TreePolicy
from spectune.specs.workload import Workload

#: trees sampled per prediction; the spread of a 4000-tree mean is about 0.2% of the value
SAMPLES = 4000
#: scale search interval per kind (confidence means are capped at 0.97 inside the shape)
SCALE_RANGE = {
    "medusa": (0.05, 1.8),
    "ngram": (0.01, 1.2),
    "mtp": (0.05, 1.0),
    "intermediate": (0.05, 0.99),
}
DEFAULT_RANGE = (0.05, 1.2)
#: per drafting (DRAFTING): the kind whose T=1/T=0 ratio the temperature rule carries, and the
#: family where that kind has figures at both temperatures
TEMPERATURE_REFERENCE = {"top-k": ("eagle", "llama-3"), "sampled": ("draft-model", "llama-2")}
assert set(TEMPERATURE_REFERENCE) == set(DRAFTING)
#: families a key's scale may be copied or scaled from, nearest first
FAMILY_SOURCES = ("llama-3", "llama-2")
#: which kinds each family gets presets for (fitted or derived)
COVERAGE = {
    "llama-3": ("eagle", "eagle3", "medusa", "draft-model", "ngram", "intermediate"),
    "llama-2": ("eagle", "eagle3", "medusa", "draft-model", "ngram"),
    "qwen3": ("eagle3", "draft-model", "ngram", "intermediate"),
    "deepseek-v3": ("mtp", "ngram"),
}


def figure_policy(fig: PublishedFigure) -> TreePolicy:
    t = fig.tree
    return TreePolicy(t.builder, depth=t.depth, topk=t.topk, budget=t.budget)


def preset_workload(key: PresetKey, scale: float) -> Workload:
    """A Workload carrying only key's acceptance at `scale` (named after the dataset, as the
    pair workloads are, so both draw the same confidence banks)."""
    return Workload(
        name=key.dataset,
        temperature=key.temperature,
        source=f"acceptance preset {key.label}",
        fitted=f"scale {scale:.6f}",
        **acceptance_fields(key.drafter, scale),
    )


def predicted_tokens(fig: PublishedFigure, scale: float, samples: int = SAMPLES) -> float:
    """Tokens per step of the figure's tree under its key's shape at `scale`."""
    from spectune.planner.acceptance import acceptance_model
    from spectune.planner.trees import expected_tokens_for_policy

    model = acceptance_model(preset_workload(fig.key, scale))
    return expected_tokens_for_policy(figure_policy(fig), model, samples=samples, seed=0)


def _bisect(f: Callable[[float], float], target: float, lo: float, hi: float) -> float:
    flo, fhi = f(lo), f(hi)
    if not flo <= target <= fhi:
        raise SpecError(
            f"published {target:.3f} tokens/step is outside [{flo:.3f}, {fhi:.3f}], what the "
            "shape reaches over its scale range"
        )
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if f(mid) < target else (lo, mid)
        if hi - lo < 2e-4:
            break
    return 0.5 * (lo + hi)


def fit_figure(fig: PublishedFigure, samples: int = SAMPLES) -> float:
    """The scale at which the figure's tree yields its published tokens per step."""
    lo, hi = SCALE_RANGE.get(fig.key.drafter, DEFAULT_RANGE)
    return _bisect(lambda s: predicted_tokens(fig, s, samples), fig.tokens_per_step, lo, hi)


def fit_presets(
    figures: Sequence[PublishedFigure] | None = None,
    samples: int = SAMPLES,
    progress: Callable[[str], None] | None = None,
) -> list[AcceptancePreset]:
    """Fitted presets (one per key with a "fit" figure), then the derived ones."""
    figures = published_figures() if figures is None else figures
    fitted: dict[PresetKey, AcceptancePreset] = {}
    for fig in figures:
        if fig.role != "fit" or fig.t1_factor:  # t1_factor: traces.size_fits
            continue
        if fig.key in fitted:
            raise SpecError(f"two fit figures for {fig.key.label}: keep one, hold out the other")
        if fig.key.temperature > 0 and fig.drafted != kind_drafting(fig.key.drafter):
            raise SpecError(
                f"fit figure {fig.id} has {fig.drafted} drafts, but {fig.key.drafter}'s T > 0 "
                f"presets assume {kind_drafting(fig.key.drafter)} (KIND_DRAFTING): hold it out"
            )
        s = fit_figure(fig, samples)
        fitted[fig.key] = AcceptancePreset(
            fig.key, s, (fig.id,), f"fitted to {fig.method}", fig.target_params_b
        )
        if progress:
            progress(f"{fig.key.label}: scale {s:.4f} ({fig.id})")
    return [*fitted.values(), *derive_presets(fitted)]


def derive_presets(fitted: dict[PresetKey, AcceptancePreset]) -> list[AcceptancePreset]:
    """Presets for the COVERAGE keys without a figure, by the rules of the module docstring."""
    have: dict[PresetKey, AcceptancePreset] = dict(fitted)
    out: list[AcceptancePreset] = []

    def add(p: AcceptancePreset) -> None:
        have[p.key] = p
        out.append(p)

    def scale(k: PresetKey) -> float | None:
        p = have.get(k)
        return None if p is None else p.scale

    def size_of(k: PresetKey) -> float:
        return have[k].target_params_b

    # dataset rule first (figures given across topics), then temperature, then family
    for fam, kinds in COVERAGE.items():
        for kind in kinds:
            across = [k for k in fitted if (k.drafter, k.family) == (kind, fam)]
            if len(across) == 1 and _figure(fitted[across[0]]).across_datasets:
                src = across[0]
                for d in DATASETS:
                    k = dataclasses.replace(src, dataset=d)
                    if k not in have:
                        add(
                            AcceptancePreset(
                                k,
                                fitted[src].scale,
                                (),
                                f"derived (dataset rule): {src.label}'s figure is given across "
                                "generation topics, so every dataset takes its scale",
                                fitted[src].target_params_b,
                            )
                        )
    for _ in range(2):  # temperature then family; a family copy may enable a temperature
        for fam, kinds in COVERAGE.items():
            for kind in kinds:
                for d in DATASETS:
                    k0 = PresetKey(kind, fam, d, 0.0)
                    k1 = PresetKey(kind, fam, d, 1.0)
                    if k1 not in have and k0 in have:
                        p = _temperature_rule(k0, k1, scale, kind_drafting(kind), size_of)
                        if p is not None:
                            add(p)
        for fam, kinds in COVERAGE.items():
            for kind in kinds:
                for d in DATASETS:
                    for t in TEMPERATURES:
                        k = PresetKey(kind, fam, d, t)
                        if k not in have:
                            p = _family_rule(k, scale, size_of)
                            if p is not None:
                                add(p)
    return out


def _figure(p: AcceptancePreset) -> PublishedFigure:
    return next(f for f in published_figures() if f.id == p.fitted_to[0])


def _temperature_rule(
    k0: PresetKey,
    k1: PresetKey,
    scale: Callable[[PresetKey], float | None],
    drafting: str,
    size_of: Callable[[PresetKey], float],
) -> AcceptancePreset | None:
    """k1 (T > 0) from k0 (T = 0) by the T=1/T=0 ratio of `drafting`'s reference kind."""
    ref_kind, ref_family = TEMPERATURE_REFERENCE[drafting]
    for fam in dict.fromkeys((k0.family, ref_family)):
        e0 = scale(PresetKey(ref_kind, fam, k0.dataset, 0.0))
        e1 = scale(PresetKey(ref_kind, fam, k0.dataset, 1.0))
        s0 = scale(k0)
        if e0 and e1 and s0:
            ref = PresetKey(ref_kind, fam, k0.dataset, 1.0)
            return AcceptancePreset(
                k1,
                s0 * e1 / e0,
                (),
                f"derived (temperature rule, {drafting} drafts): {k0.label} x {ref.label} / "
                f"{dataclasses.replace(ref, temperature=0.0).label} = {s0:.4f} x {e1 / e0:.4f} "
                f"(no T=1 figure; the T=1/T=0 ratio of {ref_kind}, drafting {drafting}, on the "
                "same dataset)",
                size_of(k0),
            )
    return None


def _family_rule(
    k: PresetKey, scale: Callable[[PresetKey], float | None], size_of: Callable[[PresetKey], float]
) -> AcceptancePreset | None:
    for g in FAMILY_SOURCES:
        if g == k.family:
            continue
        src = dataclasses.replace(k, family=g)
        s = scale(src)
        if s is None:
            continue
        ef = scale(dataclasses.replace(k, drafter="eagle"))
        eg = scale(dataclasses.replace(src, drafter="eagle"))
        if ef and eg and k.drafter != "ngram":
            return AcceptancePreset(
                k,
                s * ef / eg,
                (),
                f"derived (family rule): {src.label} x eagle/{k.family} / eagle/{g} "
                f"= {s:.4f} x {ef / eg:.4f} (no figure for this family; the EAGLE head's "
                "ratio between the two families on the same dataset and temperature)",
                size_of(dataclasses.replace(k, drafter="eagle")),
            )
        why = (
            "prompt lookup depends on the text, not the model"
            if k.drafter == "ngram"
            else "no figure ties the two families together"
        )
        return AcceptancePreset(
            k,
            s,
            (),
            f"derived (family rule): copied from {src.label} ({why}; no figure)",
            size_of(src),
        )
    return None


# ---- checking ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class FigureCheck:
    """A preset's prediction of one published figure."""

    figure: PublishedFigure
    preset: AcceptancePreset
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.figure.tokens_per_step - 1.0

    @property
    def tolerance(self) -> float | None:
        """Allowed |error|: 5% on fit and size-fit figures, 10% held out, none for reported ones."""
        return {"fit": 0.05, "size-fit": 0.05, "held-out": 0.10}.get(self.figure.role)

    @property
    def ok(self) -> bool:
        tol = self.tolerance
        return tol is None or abs(self.error) <= tol


def check_figures(
    figures: Iterable[PublishedFigure] | None = None,
    samples: int = SAMPLES,
    rule: SizeRule | None = None,
    target_factors: bool = True,
) -> list[FigureCheck]:
    """Every figure predicted by its key's stored preset at the figure's target size
    (specs.acceptance_presets), a figure that names a size_series ("size-fit", or "held-out" of
    the size fit) by its series' line; `rule` replaces the stored size rule. A T > 0 figure whose
    drafter kind has a T=1 factor of its own on the figure's target is predicted from the kind's
    T = 0 preset at its size times that factor (specs.acceptance_presets.for_target_t1), a
    `t1_factor` figure by the scale fitted to it (the factor times its T = 0 partner's scale);
    target_factors=False predicts both as if no drafter had a factor on any target."""
    presets = acceptance_presets()
    rule = size_rule() if rule is None else rule
    out = []
    for fig in published_figures() if figures is None else figures:
        if fig.size_series:
            p = _size_line_preset(fig, rule)
        elif fig.t1_factor and target_factors:
            p = _t1_factor_fit_preset(fig)
        else:
            p0 = _t0_preset(fig, presets) if target_factors else None
            own = (
                None
                if p0 is None
                else for_target_t1(
                    for_target_size(p0, fig.target_params_b, rule),
                    fig.target,
                    fig.key.temperature,
                )
            )
            p = own or for_target_size(figure_preset(fig, presets), fig.target_params_b, rule)
        out.append(FigureCheck(fig, p, predicted_tokens(fig, p.scale, samples)))
    return out


def _t0_preset(
    fig: PublishedFigure, presets: Mapping[PresetKey, AcceptancePreset]
) -> AcceptancePreset | None:
    """The T = 0 preset of a T > 0 figure drafted as its kind's presets assume (None otherwise):
    the one a drafter's own T=1 factor on its target multiplies."""
    if fig.key.temperature == 0.0 or fig.drafted != kind_drafting(fig.key.drafter):
        return None
    return presets.get(dataclasses.replace(fig.key, temperature=0.0))


def _t1_factor_fit_preset(fig: PublishedFigure) -> AcceptancePreset:
    f = next((f for f in target_t1_factors() if f.fitted_to[0] == fig.id), None)
    if f is None:
        raise SpecError(
            f"t1_factor figure {fig.id} has no T=1 factor in {PRESETS_FILE}: rerun "
            "benchmarks/bench_acceptance.py --refit"
        )
    return AcceptancePreset(
        fig.key,
        f.scale_t1,
        (fig.id,),
        f"own T=1 factor fit: {f.scale_t0:.4f} ({f.fitted_to[1]}) x {f.factor:.4f}",
        fig.target_params_b,
    )


def _size_line_preset(fig: PublishedFigure, rule: SizeRule) -> AcceptancePreset:
    c = rule.series_log_scale_1b.get(fig.size_series)
    if c is None:
        raise SpecError(
            f"size series {fig.size_series!r} of figure {fig.id} is not in the stored size rule: "
            "rerun benchmarks/bench_acceptance.py --refit"
        )
    scale = math.exp(c + rule.exponent * math.log(fig.target_params_b))
    return AcceptancePreset(
        fig.key, scale, (), f"size rule line of series {fig.size_series}", fig.target_params_b
    )


def figure_preset(
    fig: PublishedFigure, presets: Mapping[PresetKey, AcceptancePreset]
) -> AcceptancePreset:
    """The preset that predicts `fig`: its key's, or, for a T > 0 figure drafted otherwise than
    its kind's presets assume, the temperature rule of its own drafting applied to the key's
    T = 0 preset (SpecError when either is missing)."""
    p = presets.get(fig.key)
    if p is not None and (
        fig.key.temperature == 0.0 or fig.drafted == kind_drafting(fig.key.drafter)
    ):
        return p
    k0 = dataclasses.replace(fig.key, temperature=0.0)

    def scale(k: PresetKey) -> float | None:
        q = presets.get(k)
        return None if q is None else q.scale

    def size_of(k: PresetKey) -> float:
        return presets[k].target_params_b

    q = _temperature_rule(k0, fig.key, scale, fig.drafted, size_of) if k0 in presets else None
    if q is None:
        raise SpecError(
            f"no preset for {fig.key.label} with {fig.drafted} drafts, which figure {fig.id} needs"
        )
    return q
