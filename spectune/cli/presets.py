"""`spectune presets`: list the built-in hardware, model, workload and engine presets, the
acceptance presets (drafter kind x target family x dataset x temperature, fitted or derived)
and which (target, drafter) model pairs they cover."""

from __future__ import annotations

import argparse
import importlib
import json
from typing import Any

from spectune.specs import HARDWARE_PRESETS, MODEL_PRESETS
from spectune.specs.engine import ENGINE_PRESETS


def _workload_names() -> list[str]:
    try:
        workload = importlib.import_module("spectune.specs.workload")
    except ModuleNotFoundError:
        return []
    return sorted(workload.WORKLOAD_PRESETS)


def acceptance_listing() -> dict[str, Any]:
    """The acceptance presets and the model pairs they cover (compatible preset pairs only).

    A pair is covered when its (drafter kind, target family) has a preset on every dataset at
    both temperatures; otherwise the nearest preset is used, with a warning. `size_factor` is
    the size rule's factor on the pair's MT-Bench T=0 scale for the target's size (1: none);
    `t1_factor_datasets` the datasets on which the drafter kind's own T=1 factor on the target
    replaces the family's T=1 preset (aps.TargetT1Factor); `t1_extrapolated` whether, on some
    dataset, the family's T=1 preset is moved to the target's size by the size rule instead
    (lookup warns there)."""
    from spectune.specs import acceptance_presets as aps
    from spectune.specs.compat import compatible, drafter_kind
    from spectune.traces.size_fits import target_t1_factor_to_dict

    presets = aps.acceptance_presets()
    rows = [aps.preset_to_dict(presets[k]) for k in aps.covered_keys()]
    full = [m for m in MODEL_PRESETS.values() if not m.is_head]
    pairs = []
    for t in sorted(full, key=lambda m: m.name):
        for d in [None, *sorted(MODEL_PRESETS.values(), key=lambda m: m.name)]:
            if d is not None and (d.name == t.name or d.total_params() >= t.total_params()):
                continue
            if not compatible(t, d) or (d is not None and d.is_head and d.base_model != t.name):
                continue
            kind = drafter_kind(d)
            keys = [
                aps.PresetKey(kind, t.family, ds, temp)
                for ds in aps.DATASETS
                for temp in aps.TEMPERATURES
            ]
            have = [k for k in keys if k in presets]
            fitted = [k for k in have if not presets[k].derived]
            base = aps.lookup(kind, t.family, "mt-bench", 0.0)[0]
            sized = aps.for_target_size(base, t.total_params() / 1e9)
            nearest = "" if have else base.key.label
            own_t1 = [
                ds for ds in aps.DATASETS if aps.target_t1_factor(kind, t.name, ds) is not None
            ]
            pairs.append(
                {
                    "target": t.name,
                    "drafter": d.name if d is not None else "none",
                    "kind": kind,
                    "family": t.family,
                    "covered": len(have) == len(keys),
                    "keys_with_preset": len(have),
                    "keys_fitted": len(fitted),
                    "keys": len(keys),
                    "nearest": nearest,
                    "size_factor": round(sized.scale / base.scale, 4),
                    "t1_factor_datasets": own_t1,
                    "t1_extrapolated": sized is not base and len(own_t1) < len(aps.DATASETS),
                }
            )
    return {
        "acceptance": rows,
        "size_rule": aps.size_rule_to_dict(aps.size_rule()),
        "target_t1_factors": [target_t1_factor_to_dict(f) for f in aps.target_t1_factors()],
        "size_rule_kinds": list(aps.SIZE_RULE_KINDS),
        "pairs": pairs,
    }


def _print_acceptance(listing: dict[str, Any]) -> None:
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in listing["acceptance"]:
        groups.setdefault((r["drafter"], r["family"]), []).append(r)
    print("acceptance presets (drafter kind / target family: fitted + derived of 5 datasets x 2 T)")
    for (kind, fam), rs in sorted(groups.items()):
        fitted = sum(bool(r["fitted_to"]) for r in rs)
        print(f"  {kind:<12} {fam:<12} {fitted:2d} fitted + {len(rs) - fitted:2d} derived")
    rule = listing["size_rule"]
    print(
        f"size rule ({', '.join(listing['size_rule_kinds'])}): scale x (target params / preset's) "
        f"** {rule['exponent']:+.4f} (standard error {rule['stderr']:.4f})"
    )
    if listing["target_t1_factors"]:
        print(
            "drafters' own T=1 factors on a target (the drafter's T=1/T=0 scale ratio there: at "
            "T=1 that kind on that target takes its T=0 preset at the target's size times it)"
        )
    for f in listing["target_t1_factors"]:
        print(
            f"  {f['drafter']:<8} {f['target']:<16} {f['dataset']:<10} x{f['factor']:.4f}  "
            f"fitted to {f['method']}: {' / '.join(f['fitted_to'])}"
        )
    print("pairs of model presets (target + drafter): acceptance presets over 5 datasets x 2 T")
    for p in listing["pairs"]:
        cover = (
            f"covered ({p['keys_fitted']}/{p['keys']} fitted)"
            if p["covered"]
            else f"{p['keys_with_preset']}/{p['keys']} keys"
            + (f", nearest preset used: {p['nearest']}" if p["nearest"] else "")
        )
        if p["size_factor"] != 1.0:
            cover += f", scaled to its size by the size rule (x{p['size_factor']:.3f})"
        if p["t1_factor_datasets"]:
            cover += f", T=1 by its own factor on {len(p['t1_factor_datasets'])} datasets"
        if p["t1_extrapolated"]:
            cover += ", T=1 extrapolated by the size rule (warns)"
        print(f"  {p['target']:<16} + {p['drafter']:<20} {p['kind']:<12} {cover}")


def run(args: argparse.Namespace) -> int:
    listing = {
        "hardware": sorted(HARDWARE_PRESETS),
        "models": sorted(MODEL_PRESETS),
        "workloads": _workload_names(),
        **acceptance_listing(),
        "engines": sorted(ENGINE_PRESETS),
    }
    if args.json:
        print(json.dumps(listing))
        return 0
    for hw in sorted(HARDWARE_PRESETS.values(), key=lambda h: h.name):
        print(
            f"gpu      {hw.name:<22} {hw.peak_bf16_flops / 1e12:7.1f} TFLOP/s bf16  "
            f"{hw.hbm_bytes_per_s / 1e12:5.2f} TB/s  {hw.hbm_bytes / 1e9:5.0f} GB"
        )
    for m in sorted(MODEL_PRESETS.values(), key=lambda m: m.name):
        print(
            f"model    {m.name:<22} {m.total_params() / 1e9:8.2f} B params  {m.arch:<12} "
            f"{m.family or '-':<12} {m.drafter_kind}"
        )
    for w in listing["workloads"]:
        print(f"workload {w}")
    for e in sorted(ENGINE_PRESETS.values(), key=lambda e: e.name):
        kind = "trees" if e.trees else "chains"
        print(f"engine   {e.name:<22} {e.engine} {e.versions}  ({kind}, schedule {e.schedule})")
    _print_acceptance(listing)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "presets", help="list built-in GPUs, models, workloads, engines and acceptance presets"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=run)
