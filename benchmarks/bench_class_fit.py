"""Class-by-class fit variants, judged by refitting the committed calibration runs (CPU).

    python -m benchmarks.bench_class_fit VARIANT [--weight W] [folder ...]

`spectune calibrate --kernel-classes` records each verify grid point's kernel time by class
(calibrate-run.json: linear_s, attention_s; the rest of the wall time is "other"), and
validate.fit reports those rows without fitting them (WEIGHTS 0). Each variant fits them at
weight W (default 0.5) with more of the cost model's structure left free, then refits and
re-checks each folder as benchmarks.bench_refit does (its lines and summary). Variants:

    base     the class rows with today's terms
    fixed    and gemm_fixed_s fitted (not held at the GEMM micro-benchmarks' intercept)
    launch   and attention_fixed_s fitted, and the floor under every elementwise kernel
             (Calibration.elementwise_floor_s: max(bytes / rate, floor)) fitted
    logits   launch, and the logits pass (priced in the LM head: an fp32 write and read of
             the logits) counted in the "other" class, where the profile times the
             executor's argmax, not in "linear"

Folders: those named, else every bench_refit folder whose calibrate-run.json has class rows.
Results: benchmarks/results/class_fit_cpu.md. Nothing is written; the patches live in this
process only.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import benchmarks.bench_refit as br
import spectune.planner.forward as fwd
import spectune.validate.fit as fit

CLASS_ROWS = ("verify_linear", "verify_attention", "verify_other")
VARIANTS = ("base", "fixed", "launch", "logits")
EXTRA = {
    "fixed": (("gemm_fixed_us", 0.0, 20.0, 3.0),),
    "launch": (
        ("gemm_fixed_us", 0.0, 20.0, 3.0),
        ("attn_fixed_us", 0.0, 20.0, 4.0),
        ("ew_floor_us", 0.0, 10.0, 2.0),
    ),
}
EXTRA["logits"] = EXTRA["launch"]


def apply(variant: str, weight: float) -> None:
    """Patch validate.fit (and, for 'launch', planner.forward) for `variant` in this process."""
    if variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r}; one of {', '.join(VARIANTS)}")
    for kind in CLASS_ROWS:
        fit.WEIGHTS[kind] = weight
    extra = EXTRA.get(variant, ())
    if not extra:
        return
    fit.PARAMS = (*fit.PARAMS, *extra)
    if variant == "logits":
        fit.predict_row = _logits_in_other(fit.predict_row)  # type: ignore[assignment]
    built = fit._calibration

    def calibration(x: Any, hardware: str, base: Any, params: Any = fit.PARAMS,
                    hold_gemm_fixed: bool = False) -> Any:  # fmt: skip
        names = [n for n, *_ in params]
        cal = built(x, hardware, base, params, False)
        if "gemm_fixed_us" not in names:
            return cal
        got = {n: float(x[names.index(n)]) * 1e-6 for n, *_ in extra}
        cal = dataclasses.replace(cal, gemm_fixed_s=got["gemm_fixed_us"])
        if "attn_fixed_us" in got:
            cal = dataclasses.replace(
                cal,
                attention_fixed_s=got["attn_fixed_us"],
                elementwise_floor_s=got["ew_floor_us"],
            )
        return cal

    fit._calibration = calibration  # type: ignore[assignment]


def _logits_in_other(predict: Any) -> Any:
    """predict_row with the logits pass moved from the linear class row to the other."""
    from spectune.planner.operators import LOGIT_BYTES

    def predict_row(cm: Any, kind: str, a: dict[str, Any]) -> float:
        t = float(predict(cm, kind, a))
        if kind not in ("verify_linear", "verify_other"):
            return t
        rows = a["batch"] * a["tokens"]  # logits at every token
        logits = float(fwd.elementwise_time(cm.rates, 2 * rows * cm.target.lm_vocab * LOGIT_BYTES))
        return t - logits if kind == "verify_linear" else t + logits

    return predict_row


def _has_class_rows(folder: str) -> bool:
    path = br.ROOT / folder / "calibrate-run.json"
    return path.is_file() and any("linear_s" in r for r in br._load(path).get("verify", []))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    variant, rest, weight = argv[0], argv[1:], 0.5
    if rest[:1] == ["--weight"]:
        try:
            weight = float(rest[1])
        except (IndexError, ValueError):
            print("--weight needs a number (the class rows' fit weight)", file=sys.stderr)
            return 2
        rest = rest[2:]
    apply(variant, weight)
    folders = rest or [f for f in br.FOLDERS if _has_class_rows(f)]
    return br.main(folders)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
