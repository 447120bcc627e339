"""Acceptance presets against the published accept lengths they rest on.

For every figure of spectune/specs/workload_data/published/figures.toml: the tokens per step
its key's preset predicts for the figure's own tree and target size, the published value and the
error. Gates: within 5% on every figure used in a fit (a preset's scale, or the size rule's
exponent: "size-fit" figures, predicted on their series' line), within 10% on every held-out
figure (the EAGLE-2 and EAGLE-3 rows of Llama-3.3-70B at T=0, predicted by presets fitted to
Llama-3.1-8B at a larger verify budget and rescaled from 8B to 70B by the size rule; Vicuna
7B's EAGLE-2 rows, from the Vicuna-13B presets through the size rule; LLaMA2-Chat-7B's EAGLE-1
row, on its size series' line through the 13B and 70B rows; EAGLE-1's
static tree on Vicuna-13B, predicted at T=0 by the preset fitted to
EAGLE-2's dynamic tree with the same head, and at T=1, where EAGLE-1 samples its drafts, by the
sampled-drafts temperature rule from that T=0 preset: spectune.traces.published). The
EAGLE-2 and EAGLE-3 rows of Llama-3.3-70B at T=1 are "fit" figures: each fixes its own
drafter's T=1 factor on that target (`t1_factor`) and is reproduced by construction. "reported"
figures are shown with their error and not gated (figures.toml says why).

    python -m benchmarks.bench_acceptance [--refit] [--samples N]

Also fits the T=1 x size slope (spectune.traces.size_fits.fit_temperature_size; not applied)
and prints what the Llama-3.3-70B T=1 rows would miss by with it; then the drafters' own T=1
factors, each factor's T=1 figure predicted as lookup gives it (its kind's T=0 preset at the
target's size times the factor) and with every other drafter's factor on that target (the rule
keyed by target only, pre-registered in commit 2f75d47, tested and rejected:
spectune.traces.size_fits.target_t1_factor_transfers), and the same figures without any factor
(the extrapolation error a T > 0 lookup without a factor of its own quotes:
specs.acceptance_presets.T1_EXTRAPOLATED_ERROR, which must match).

--refit fits every preset, the size rule and the T=1 factors again
(spectune.traces.published.fit_presets, spectune.traces.size_fits.fit_size_rule and
fit_target_t1_factors, a few minutes) and rewrites presets.json before measuring. Prints a
table, then one JSON document on the last line; exits 1 when a gate fails.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from spectune.specs import acceptance_presets as registry
from spectune.specs.io import write_json_atomic
from spectune.traces.published import SAMPLES, check_figures, fit_presets
from spectune.traces.size_fits import (
    FactorTransfer,
    checks_with_temperature_slope,
    checks_without_own_factors,
    fit_size_rule,
    fit_target_t1_factors,
    fit_temperature_size,
    target_t1_factor_to_dict,
    target_t1_factor_transfers,
)


def refit(samples: int) -> None:
    t0 = time.monotonic()
    presets = fit_presets(samples=samples, progress=lambda s: print("  fit", s, flush=True))
    rule = fit_size_rule(samples=samples, progress=lambda s: print("  size", s, flush=True))
    factors = fit_target_t1_factors(
        samples=samples, progress=lambda s: print("  target", s, flush=True)
    )
    rows = [registry.preset_to_dict(p) for p in presets]
    rows.sort(key=lambda r: (r["drafter"], r["family"], r["dataset"], r["temperature"]))
    doc = {
        "schema": "spectune.acceptance-presets/v1",
        "about": "scales of specs.acceptance_presets shapes, fitted to figures.toml or derived; "
        "written by benchmarks/bench_acceptance.py --refit",
        "samples": samples,
        "size_rule": registry.size_rule_to_dict(rule),
        "target_t1_factors": [target_t1_factor_to_dict(f) for f in factors],
        "presets": rows,
    }
    write_json_atomic(registry.PRESETS_FILE, doc)
    registry.acceptance_presets.cache_clear()
    registry.size_rule.cache_clear()
    registry.target_t1_factors.cache_clear()
    print(f"wrote {registry.PRESETS_FILE} ({len(rows)} presets, {time.monotonic() - t0:.0f} s)")


def _print_target_factors(
    factors: Sequence[registry.TargetT1Factor], transfers: Sequence[FactorTransfer]
) -> None:
    """The stored T=1 factors, then each factor's T=1 figure predicted with each factor of its
    target and dataset (* = its own drafter's: what lookup gives)."""
    print(
        "drafters' own T=1 factors (T=1/T=0 scale ratio of the drafter's pair on the target; at "
        "T=1 that kind on that target takes its T=0 preset at the target's size times it):"
    )
    for f in factors:
        print(
            f"  {f.method:<8} {f.target:<14} {f.dataset:<10} x{f.factor:.4f} (fitted to "
            f"{f.fitted_to[0]} / {f.fitted_to[1]})"
        )
    methods = list(dict.fromkeys(t.from_method for t in transfers))
    print(
        "each T=1 figure from its kind's T=0 preset at the target's size x the column's factor "
        "(* = its own, as lookup gives it; the others: the rule keyed by target only, "
        "pre-registered in commit 2f75d47, tested and rejected):"
    )
    head = f"  {'target':<14} {'dataset':<10} {'figure':<9}{'role':<9}{'published':>9}"
    print(head + "".join(f"  {'factor of ' + m:>20}" for m in methods))
    rows: dict[str, dict[str, FactorTransfer]] = {}
    for t in transfers:
        rows.setdefault(t.check.figure.id, {})[t.from_method] = t
    for by_method in rows.values():
        f = next(iter(by_method.values())).check.figure
        cells = []
        for m in methods:
            t = by_method.get(m)
            cells.append(
                f"{'-':>20}"
                if t is None
                else f"{t.check.predicted:>7.2f} {100 * t.check.error:+6.1f}% x{t.factor:.3f}"
                + ("*" if t.own else " ")
            )
        print(
            f"  {f.target:<14} {f.key.dataset:<10} {f.method:<9}{f.role:<9}"
            f"{f.tokens_per_step:>9.2f}" + "".join(f"  {c:>20}" for c in cells)
        )
    cross = [t.check.error for t in transfers if not t.own]
    if cross:
        print(
            f"  cross-drafter (tested, not applied): {len(cross)} rows, "
            f"{100 * min(cross):+.1f}% to {100 * max(cross):+.1f}%, "
            f"{sum(abs(e) > 0.10 for e in cross)} outside 10%"
        )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--refit", action="store_true", help="fit the presets again first")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="trees per prediction")
    args = ap.parse_args()
    if args.refit:
        refit(args.samples)
    checks = check_figures(samples=args.samples)
    head = f"{'drafter':<12}{'target':<21}{'dataset':<10}{'T':>2} {'tree':<20}{'published':>10}"
    head += f"{'predicted':>10}{'error':>8}  {'role':<9} ok"
    print(head)
    print("-" * len(head))
    for c in checks:
        f, t = c.figure, c.figure.tree
        tree = f"{t.builder[:7]} d{t.depth} k{t.topk} n{t.budget}"
        mark = "-" if c.tolerance is None else ("yes" if c.ok else "NO")
        print(
            f"{f.method[:11]:<12}{f.target[:20]:<21}{f.key.dataset:<10}{f.key.temperature:>2g} {tree:<20}"
            f"{f.tokens_per_step:>10.2f}{c.predicted:>10.2f}{100 * c.error:>+7.1f}%  "
            f"{f.role:<9} {mark}"
        )
    summary = {}
    for role in registry.ROLES:
        errs = [abs(c.error) for c in checks if c.figure.role == role]
        if errs:
            summary[role] = {
                "figures": len(errs),
                "max_abs_error": round(max(errs), 4),
                "mean_abs_error": round(sum(errs) / len(errs), 4),
            }
            if role != "reported":
                summary[role]["within_gate"] = sum(c.ok for c in checks if c.figure.role == role)
    presets = registry.acceptance_presets()
    derived = sum(p.derived for p in presets.values())
    rule = registry.size_rule()
    print(
        f"\nsize rule ({', '.join(registry.SIZE_RULE_KINDS)}): scale x (N / N_ref) ** "
        f"{rule.exponent:+.4f} (standard error {rule.stderr:.4f}; 8B -> 70B x "
        f"{rule.factor(8, 70):.3f}, [{(70 / 8) ** (rule.exponent - rule.stderr):.3f}, "
        f"{(70 / 8) ** (rule.exponent + rule.stderr):.3f}] at one standard error; "
        f"{len(rule.fitted_to)} size-fit figures)"
    )
    print(
        f"{len(presets)} presets ({len(presets) - derived} fitted, {derived} derived); "
        + "; ".join(
            f"{r}: "
            + (
                f"{s['within_gate']}/{s['figures']} within gate"
                if "within_gate" in s
                else f"{s['figures']} not gated"
            )
            + f", max |error| {100 * s['max_abs_error']:.1f}%"
            for r, s in summary.items()
        )
    )
    slope = fit_temperature_size(samples=args.samples)
    what_if = checks_with_temperature_slope(slope, samples=args.samples)
    errs = [c.error for c in what_if]
    print(
        f"T=1 x size (not applied): T=1/T=0 scale ratio x (N / N_ref) ** {slope.slope:+.4f} "
        f"(standard error {slope.stderr:.4f}; {len(slope.fitted_to)} T=1/T=0 pairs); applied "
        f"instead of the drafters' own T=1 factors, the {len(what_if)} T=1 head rows outside its "
        "fit on a target with a factor or reported would miss by "
        f"{100 * min(errs):+.1f}% to {100 * max(errs):+.1f}% ("
        + ", ".join(f"{c.figure.id} {100 * c.error:+.1f}%" for c in what_if if abs(c.error) > 0.1)
        + ")"
    )
    transfers = target_t1_factor_transfers(samples=args.samples)
    _print_target_factors(registry.target_t1_factors(), transfers)
    bare = [c.error for c in checks_without_own_factors(samples=args.samples)]
    extrapolated = (round(min(bare), 3), round(max(bare), 3))
    print(
        f"without their own factors (the family's T=1 preset moved by the size rule, as a "
        f"drafter and target without one are) those {len(bare)} rows miss by "
        f"{100 * extrapolated[0]:+.1f}%..{100 * extrapolated[1]:+.1f}% (the range lookup's "
        f"extrapolation note quotes: {registry.T1_EXTRAPOLATED_ERROR})"
    )
    ok = all(c.ok for c in checks)
    if extrapolated != registry.T1_EXTRAPOLATED_ERROR:
        ok = False
        print("specs.acceptance_presets.T1_EXTRAPOLATED_ERROR differs from the range above")
    for c in checks:
        if not c.ok:
            print(f"outside its gate: {c.figure.id} ({100 * c.error:+.1f}%)")
    doc = {
        "bench": "acceptance",
        "samples": args.samples,
        "ok": ok,
        "size_rule": registry.size_rule_to_dict(rule),
        "summary": summary,
        "temperature_size": {
            "slope": round(slope.slope, 6),
            "stderr": round(slope.stderr, 6),
            "applied": False,
            "fitted_to": [list(p) for p in slope.fitted_to],
            "what_if": {c.figure.id: round(c.error, 4) for c in what_if},
        },
        "target_t1_factors": [target_t1_factor_to_dict(f) for f in registry.target_t1_factors()],
        "t1_extrapolated": list(extrapolated),
        "target_t1_factor_transfers": [
            {
                "figure": t.check.figure.id,
                "role": t.check.figure.role,
                "from_method": t.from_method,
                "factor": round(t.factor, 6),
                "own": t.own,
                "predicted": round(t.check.predicted, 4),
                "error": round(t.check.error, 4),
            }
            for t in transfers
        ],
        "figures": [
            {
                "id": c.figure.id,
                "role": c.figure.role,
                "published": c.figure.tokens_per_step,
                "predicted": round(c.predicted, 4),
                "error": round(c.error, 4),
            }
            for c in checks
        ],
    }
    print(json.dumps(doc))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
