"""Fitting a serving engine's host overheads (EngineOverheads) to the throughput it measured.

Each measured point (validate.engine_points.EnginePoint) implies a step time,
m_i = batch_i * accept_length_i / tokens_per_s_i. The cost model prices the same step without
engine host time, g_i = CostModel.iteration(...).total_s (GpuPricer), and the engine adds

    e_i(theta) = (1 - overlap) * h_i * (1 + tp_growth * log2 tp_i)
    h_i = iteration_s + per_request_s * batch_i
          + spec_i * (spec_iteration_s + per_draft_step_s * steps_i + tree_s * tree_i
                      + drafter_iteration_s[kind_i] + drafter_step_s[kind_i] * steps_i)

(specs.engine.EngineOverheads.iteration_s_for, the one formula). The fit minimises
sum_i r_i^2 with r_i = log((g_i + e_i(theta)) / m_i), the relative error of the predicted
throughput to first order, over theta >= 0 (scipy least_squares, trust-region reflective).
`overlap` is held at the base profile's value: it multiplies every other term, so only
(1 - overlap) * cost is observable.

Uncertainty: cov = s^2 (J^T J)^-1 at the solution, s^2 = sum r_i^2 / (n - p) (n points, p fitted
parameters); with n = p there is no residual to estimate s from and the uncertainty is reported
as undetermined (NaN).

Identifiability: a parameter is fitted only when its column of the design matrix adds to the
rank of the columns already fitted (checked on column-normalised features with an SVD).
Automatic selection adds them in `params_for(base)` order (PARAMS, then the drafter-kind terms
the base profile lists) while n > p (one point stays a residual degree of freedom), leaving the
rest at the base profile's values with the observations that would determine them (NEEDS).
Asking for a parameter the data cannot determine is a SpecError.

Drafter-kind terms are named `drafter_step_s.KIND` and `drafter_iteration_s.KIND`
(EngineOverheads' tables). Automatic selection fits only the kinds the base profile lists (an
engine's preset lists a kind where its source shows extra work for that drafter, and cites
it); --fit may name any kind of specs.engine.DRAFTERS. Such a term is determined only beside
speculative points of another drafter kind (else it is the engine's own speculative term).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spectune.specs import SpecError
from spectune.specs.engine import DRAFTERS, EngineOverheads
from spectune.validate.engine_points import EnginePoint, GpuPricer

PARAMS = (
    "iteration_s",
    "spec_iteration_s",
    "per_draft_step_s",
    "per_request_s",
    "tree_s",
    "tp_growth",
)
"""The fittable scalar EngineOverheads fields, in the order automatic selection tries them."""

DRAFTER_TABLES = ("drafter_step_s", "drafter_iteration_s")
"""EngineOverheads' per-drafter-kind tables; their parameters are named TABLE.KIND."""

NEEDS = {
    "iteration_s": "needs at least one point",
    "per_request_s": "needs points at two or more batch sizes",
    "spec_iteration_s": "needs points with speculation off (a no-speculation baseline) and on",
    "per_draft_step_s": "needs speculative points at two or more num_steps",
    "tree_s": "needs speculative points with topk 1 (chains) and topk > 1 (trees)",
    "tp_growth": "needs points at two or more tensor-parallel degrees",
}
"""What observations determine each parameter (said when one cannot be fitted)."""


def needs(name: str) -> str:
    """What observations determine parameter `name` (a PARAMS field or TABLE.KIND)."""
    if name in NEEDS:
        return NEEDS[name]
    table, _, kind = name.partition(".")
    what = "at two or more num_steps" if table == "drafter_step_s" else "and speculation off"
    return f"needs speculative points of drafter kind {kind} {what}, beside another kind's"


def params_for(base: EngineOverheads, extra: Sequence[str] = ()) -> tuple[str, ...]:
    """The fittable parameters against `base`: PARAMS, then TABLE.KIND for every drafter kind
    the base's tables list, then any of `extra` (requested TABLE.KIND names) not yet in."""
    out = list(PARAMS)
    for table in DRAFTER_TABLES:
        out += [f"{table}.{k}" for k in sorted(getattr(base, table))]
    for name in extra:
        table, dot, kind = name.partition(".")
        if name not in out and dot and table in DRAFTER_TABLES and kind in DRAFTERS:
            out.append(name)
    return tuple(out)


def value_of(o: EngineOverheads, name: str) -> float:
    """The value of parameter `name` (a field, or TABLE.KIND: 0 where the table lacks KIND)."""
    table, dot, kind = name.partition(".")
    if dot:
        return float(getattr(o, table).get(kind, 0.0))
    return float(getattr(o, name))


def with_values(o: EngineOverheads, values: dict[str, float]) -> EngineOverheads:
    """`o` with parameters (fields or TABLE.KIND) set to `values`."""
    scalars = {k: v for k, v in values.items() if "." not in k}
    tables: dict[str, dict[str, float]] = {}
    for k, v in values.items():
        if "." in k:
            table, _, kind = k.partition(".")
            tables.setdefault(table, dict(getattr(o, table)))[kind] = v
    changes: dict[str, Any] = {**scalars, **tables}
    return dataclasses.replace(o, **changes)


UPPER = 0.999  # EngineOverheads bounds every field to [0, 1)
RANK_TOL = 1e-8


@dataclass(frozen=True)
class FittedValue:
    """One EngineOverheads field after the fit."""

    name: str
    value: float
    sigma: float  # one standard deviation; NaN: undetermined (not fitted, or n = p)
    fitted: bool
    note: str  # why not fitted, or that the value sits at a bound


@dataclass(frozen=True)
class Residual:
    """One observation against the fitted profile."""

    where: str
    source: str
    label: str
    measured_tokens_per_s: float
    predicted_tokens_per_s: float
    gpu_step_s: float
    engine_s: float
    accept_measured: bool

    @property
    def error(self) -> float:
        """predicted / measured - 1 of the throughput."""
        return self.predicted_tokens_per_s / self.measured_tokens_per_s - 1.0


@dataclass(frozen=True)
class OverheadFit:
    """The fitted overheads, each value with its uncertainty, and every point's residual."""

    overheads: EngineOverheads
    values: tuple[FittedValue, ...]
    residuals: tuple[Residual, ...]
    dof: int

    @property
    def fitted(self) -> tuple[str, ...]:
        return tuple(v.name for v in self.values if v.fitted)

    @property
    def mape(self) -> float:
        return float(np.mean([abs(r.error) for r in self.residuals])) if self.residuals else 0.0


def fittable(points: Sequence[EnginePoint]) -> list[EnginePoint]:
    """`points` less the speculative ones whose accept length was predicted (not measured)
    while points of the same drafter kind have a measured one. Such a point's step time is
    its throughput times the workload's guessed accept length (m_i above), so fitting it moves
    that kind's terms by the acceptance model's error; it is still predicted and reported. A
    drafter kind with no measured accept length keeps its points (nothing better determines
    it)."""
    measured = {p.drafter_kind for p in points if p.speculative and p.accept_measured}
    return [
        p
        for p in points
        if not p.speculative or p.accept_measured or p.drafter_kind not in measured
    ]


def features(
    points: Sequence[EnginePoint], base: EngineOverheads, params: Sequence[str] | None = None
) -> np.ndarray:
    """[n, len(params)] d e_i / d theta_j / (1 - overlap) at `base`; `params` default
    params_for(base)."""
    params = params_for(base) if params is None else params
    b = np.array([p.batch for p in points], dtype=np.float64)
    spec = np.array([p.speculative for p in points], dtype=np.float64)
    steps = np.array([p.steps for p in points], dtype=np.float64)
    tree = np.array([p.tree for p in points], dtype=np.float64)
    lg = np.log2(np.array([p.tp for p in points], dtype=np.float64))
    scale = 1.0 + base.tp_growth * lg
    lin = {
        "iteration_s": np.ones_like(b),
        "per_request_s": b,
        "spec_iteration_s": spec,
        "per_draft_step_s": spec * steps,
        "tree_s": spec * tree,
    }
    for table in DRAFTER_TABLES:
        for kind in DRAFTERS:
            mine = np.array([p.drafter_kind == kind for p in points], dtype=np.float64)
            per = steps if table == "drafter_step_s" else 1.0
            lin[f"{table}.{kind}"] = spec * mine * per
    host = sum(value_of(base, k) * v for k, v in lin.items())
    # the tp column's shape does not depend on the host cost's size: use a positive one
    host = np.where(np.asarray(host) > 0, host, 1.0 + b + spec * (1.0 + steps + tree))
    cols = [lin[k] * scale if k in lin else host * lg for k in params]
    return np.stack(cols, axis=1)


def _rank(x: np.ndarray) -> int:
    if x.shape[1] == 0:
        return 0
    norms = np.linalg.norm(x, axis=0)
    if not (norms > 0).all():
        return int(np.linalg.matrix_rank(x[:, norms > 0] / norms[norms > 0], tol=RANK_TOL))
    return int(np.linalg.matrix_rank(x / norms, tol=RANK_TOL))


def select_params(
    points: Sequence[EnginePoint], base: EngineOverheads, requested: Sequence[str] | None = None
) -> tuple[list[str], dict[str, str]]:
    """(parameters to fit, {parameter left at base: why}). `requested` None: automatic (module
    docstring); else exactly those, SpecError naming the first the data cannot determine."""
    if not points:
        raise SpecError("no priced observations to fit engine overheads to")
    params = params_for(base, requested or ())
    x = features(points, base, params)
    col = {k: i for i, k in enumerate(params)}
    if requested is not None:
        unknown = [k for k in requested if k not in col]
        if unknown:
            raise SpecError(
                f"cannot fit {unknown[0]!r}: fittable are {', '.join(params)}, or "
                f"{'/'.join(DRAFTER_TABLES)}.KIND for a drafter kind KIND in {', '.join(DRAFTERS)}"
            )
        chosen: list[str] = []
        for k in requested:
            if _rank(x[:, [col[c] for c in [*chosen, k]]]) <= len(chosen):
                others = f" given {', '.join(chosen)}" if chosen else ""
                raise SpecError(
                    f"the observations cannot determine {k}{others}: {k} {needs(k)}"
                    + (" that vary independently of those" if chosen else "")
                )
            chosen.append(k)
        if len(chosen) > len(points):
            raise SpecError(
                f"{len(chosen)} parameters from {len(points)} observations: give more points "
                "or fit fewer parameters"
            )
        return chosen, {k: "not requested" for k in params if k not in chosen}
    chosen, left = [], {}
    limit = max(len(points) - 1, 1)
    for k in params:
        if _rank(x[:, [col[c] for c in [*chosen, k]]]) <= len(chosen):
            left[k] = f"not determined by these observations: {needs(k)}"
        elif len(chosen) >= limit:
            left[k] = f"not fitted: {len(points)} observations fit at most {limit} parameter(s)"
        else:
            chosen.append(k)
    return chosen, left


def _overheads(base: EngineOverheads, names: Sequence[str], theta: np.ndarray) -> EngineOverheads:
    vals = {k: float(min(max(v, 0.0), UPPER)) for k, v in zip(names, theta, strict=True)}
    return with_values(base, vals)


def _fold_single_kind(
    points: Sequence[EnginePoint],
    base: EngineOverheads,
    names: Sequence[str],
    left: dict[str, str],
) -> tuple[EngineOverheads, dict[str, str]]:
    """A drafter-kind term left unfitted while every speculative point is of that kind cannot
    be told from the shared speculative terms: it is set to 0 and the shared terms fitted
    take its cost, so the fitted profile prices that drafter as the data say (and does not
    charge the base's value on top)."""
    kinds = {p.drafter_kind for p in points if p.speculative}
    if len(kinds) != 1:
        return base, left
    (kind,) = kinds
    fold = {
        name: 0.0
        for name in params_for(base)
        if name.endswith(f".{kind}") and name not in names and value_of(base, name) > 0
    }
    if not fold:
        return base, left
    left = dict(left)
    for name in fold:
        left[name] = (
            f"folded into the shared terms (set to 0): every speculative point is drafter kind "
            f"{kind}; {needs(name)}"
        )
    return with_values(base, fold), left


def fit_overheads(
    points: Sequence[EnginePoint],
    base: EngineOverheads,
    *,
    params: Sequence[str] | None = None,
    pricer: GpuPricer | None = None,
) -> OverheadFit:
    """Least-squares EngineOverheads for `points` (module docstring), starting from and
    keeping the unfitted fields of `base`."""
    from scipy.optimize import least_squares

    names, left = select_params(points, base, params)
    base, left = _fold_single_kind(points, base, names, left)
    pricer = pricer or GpuPricer()
    g = np.array([pricer.step_s(p) for p in points])
    m = np.array([p.measured_step_s for p in points])
    if not (np.isfinite(g).all() and np.isfinite(m).all() and (m > 0).all()):
        raise SpecError("a point's measured or priced step time is not a positive number")
    params = params_for(base, names)
    col = [params.index(k) for k in names]
    ov = 1.0 - base.overlap
    if ov <= 0:
        raise SpecError("overlap 1 hides all host time: nothing to fit (set overlap < 1)")

    def engine_s(theta: np.ndarray) -> np.ndarray:
        o = _overheads(base, names, theta)
        return np.array([_engine_s(o, p) for p in points])

    def resid(theta: np.ndarray) -> np.ndarray:
        return np.asarray(np.log((g + engine_s(theta)) / m), dtype=np.float64)

    def jac(theta: np.ndarray) -> np.ndarray:
        o = _overheads(base, names, theta)
        return ov * features(points, o, params)[:, col] / (g + engine_s(theta))[:, None]

    x0 = np.array([min(max(value_of(base, k), 1e-7), UPPER / 2) for k in names])
    sol = least_squares(resid, x0, jac=jac, bounds=(0.0, UPPER), method="trf", x_scale="jac")
    theta = sol.x
    fitted = _overheads(base, names, theta)
    dof = len(points) - len(names)
    j = jac(theta)
    r = resid(theta)
    sigma = np.full(len(names), math.nan)
    if dof > 0:
        s2 = float(r @ r) / dof
        sigma = np.sqrt(np.maximum(np.diag(np.linalg.pinv(j.T @ j)) * s2, 0.0))
    values = []
    for k in params:
        if k in names:
            i = names.index(k)
            note = "at the bound 0: the data want less host time than none" if theta[i] <= 0 else ""
            values.append(FittedValue(k, value_of(fitted, k), float(sigma[i]), True, note))
        else:
            values.append(FittedValue(k, value_of(fitted, k), math.nan, False, left[k]))
    values.append(
        FittedValue(
            "overlap", base.overlap, math.nan, False, "held: it scales every other term together"
        )
    )
    e = engine_s(theta)
    residuals = tuple(
        Residual(
            where=p.where,
            source=p.source,
            label=p.label,
            measured_tokens_per_s=p.tokens_per_s,
            predicted_tokens_per_s=p.batch * p.accept_length / (gi + ei),
            gpu_step_s=float(gi),
            engine_s=float(ei),
            accept_measured=p.accept_measured,
        )
        for p, gi, ei in zip(points, g, e, strict=True)
    )
    return OverheadFit(fitted, tuple(values), residuals, dof)


def _engine_s(o: EngineOverheads, p: EnginePoint) -> float:
    """The engine's seconds for point `p` under `o` (EngineOverheads.iteration_s_for)."""
    return float(o.iteration_s_for(p.batch, p.steps, p.tree, p.tp, p.drafter_kind))


def overheads_table(o: EngineOverheads) -> dict[str, object]:
    """`o` as an engine profile file's `overheads` table (drafter tables as kind -> s)."""
    return {
        f.name: dict(getattr(o, f.name)) if f.name in DRAFTER_TABLES else getattr(o, f.name)
        for f in dataclasses.fields(o)
    }


def predict(
    points: Sequence[EnginePoint], overheads: EngineOverheads, pricer: GpuPricer | None = None
) -> list[Residual]:
    """Every point priced under `overheads` (no fit)."""
    pricer = pricer or GpuPricer()
    out = []
    for p in points:
        gi = pricer.step_s(p)
        ei = _engine_s(overheads, p)
        out.append(
            Residual(
                p.where,
                p.source,
                p.label,
                p.tokens_per_s,
                p.batch * p.accept_length / (gi + ei),
                gi,
                ei,
                p.accept_measured,
            )
        )
    return out


def format_fit(fit: OverheadFit) -> str:
    """The fitted values with their uncertainty, then every observation's residual."""
    width = max(18, *(len(v.name) for v in fit.values))
    lines = [f"{'parameter':<{width}} {'value':>12} {'+/- 1 sigma':>12}  note"]
    for v in fit.values:
        unit = "" if v.name in ("tp_growth", "overlap") else " s"
        sig = "undetermined" if math.isnan(v.sigma) else f"{v.sigma:.3g}"
        lines.append(f"{v.name:<{width}} {v.value:>10.4g}{unit:2} {sig:>12}  {v.note}")
    lines.append(
        f"\n{'observation':<48} {'measured':>10} {'predicted':>10} {'error':>7}  step gpu+engine"
    )
    for r in fit.residuals:
        tag = "" if r.accept_measured else " (accept len predicted)"
        lines.append(
            f"{r.where[-48:]:<48} {r.measured_tokens_per_s:>10.1f} {r.predicted_tokens_per_s:>10.1f} "
            f"{r.error:>+7.1%}  {r.gpu_step_s * 1e3:.2f}+{r.engine_s * 1e3:.2f} ms {r.label}{tag}"
        )
    lines.append(
        f"{len(fit.residuals)} observations, {len(fit.fitted)} parameters fitted "
        f"({', '.join(fit.fitted) or 'none'}), {fit.dof} residual degrees of freedom, "
        f"tok/s MAPE {fit.mape:.1%}"
    )
    return "\n".join(lines)


def profile_document(
    fit: OverheadFit, base_name: str, *, data: Sequence[str], name: str | None = None
) -> dict[str, object]:
    """An EngineProfile user file (load_engine reads it) with `base` = the preset and the
    fitted overheads, their cites and a `fit` provenance block (values, uncertainties,
    residuals)."""
    over = overheads_table(fit.overheads)
    shown = ", ".join(data[:6]) + (f" and {len(data) - 6} more" if len(data) > 6 else "")
    cite = {
        f"overheads.{v.name}": (
            f"fitted by spectune fit-engine to {shown} ({v.value:.4g} +/- "
            + ("undetermined" if math.isnan(v.sigma) else f"{v.sigma:.2g}")
            + ")"
            if v.fitted
            else f"from {base_name}: {v.note}"
        )
        for v in fit.values
    }
    return {
        "base": base_name,
        "name": name or f"{base_name}-fitted",
        "overheads": over,
        "cite": cite,
        "source": f"{base_name} with overheads fitted by spectune fit-engine to {shown}",
        "fit": {
            "data": list(data),
            "fitted": list(fit.fitted),
            "values": {
                v.name: {
                    "value": v.value,
                    "sigma": None if math.isnan(v.sigma) else v.sigma,
                    "fitted": v.fitted,
                    "note": v.note,
                }
                for v in fit.values
            },
            "dof": fit.dof,
            "tokens_per_s_mape": fit.mape,
            "residuals": [
                {
                    "where": r.where,
                    "measured_tokens_per_s": r.measured_tokens_per_s,
                    "predicted_tokens_per_s": r.predicted_tokens_per_s,
                    "error": r.error,
                    "accept_length_measured": r.accept_measured,
                }
                for r in fit.residuals
            ],
        },
    }
