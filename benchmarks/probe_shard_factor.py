"""The split forward's compute as one factor per tp on the target's price, and the check with it (CPU)

    python -m benchmarks.probe_shard_factor                  # the TP folders below
    python -m benchmarks.probe_shard_factor benchmarks/results/tp_h200x2_c

A TP verify grid (verify-tpN.json) times every point also without its collectives
("seconds_nocomm"). On every committed folder those times run 2-5% under the cost model's
price of the same shard compute (the target's forward at tp N less its "comm" class). This probe
asks whether that gap transfers to the TP executions: per folder it starts from the one-GPU fit
(one-gpu/calibration-<hw>.json where the folder keeps it, else the committed calibration),
takes per split grid the factor median(seconds_nocomm / model compute), scales every non-comm
class of the target's forwards at that tp by it (planner.forward.ForwardPricer.forward, patched
in this process only; drafters untouched), adds the in-forward all-reduce offset as `spectune
calibrate --tp N` does (probe_allreduce_offset.offsets), and re-runs `spectune check` of the
folder. The grids are then in sample; the executions (execute-tpN.json) are not.

It prints per folder the factors and offsets, and per tp > 1 document the verify MAPE and worst
(mean) speedup error without and with the factor, then one JSON document. Nothing in the
folders is written.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

import spectune.planner.forward as forward
from benchmarks.bench_refit import _cell, _load, _per_file, check_with
from benchmarks.probe_allreduce_offset import offsets
from spectune.planner.costmodel import CostModel
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.validate.check import calibrations_in

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = (
    "benchmarks/results/tp_h200x2_c",
    "benchmarks/results/tp_h200x2_b",
    "benchmarks/results/tp_h100x2_c",
    "benchmarks/results/tp_h200x4_b",
    "measurements/h200x4-tp",
)


@contextmanager
def scaled(factors: dict[int, float]) -> Iterator[None]:
    """Within the block, the target's forwards at tp in `factors` (not drafters') have every
    class but "comm" multiplied by factors[tp]."""
    orig = forward.ForwardPricer.forward

    def patched(self: Any, b: Any, *, from_target: bool = False) -> dict[str, Any]:
        out = orig(self, b, from_target=from_target)
        f = None if self.drafting else factors.get(self.tp)
        if f is None:
            return out
        return {k: v if k == "comm" else v * f for k, v in out.items()}

    forward.ForwardPricer.forward = patched  # type: ignore[method-assign]
    try:
        yield
    finally:
        forward.ForwardPricer.forward = orig  # type: ignore[method-assign]


def compute_factor(run: dict[str, Any], cal: Calibration) -> float | None:
    """median(seconds_nocomm / the model's non-comm price) over a split grid's points; None
    without such points."""
    pts = [r for r in run.get("verify", []) if "seconds_nocomm" in r]
    if not pts:
        return None
    cm = CostModel(
        load_hardware(run["hardware"]), load_model(run["target"]), load_model(run["drafter"]),
        tp=int(run["tp"]), calibration=cal,
    )  # fmt: skip
    ratios = []
    for r in pts:
        parts = cm.verify_breakdown(r["batch"], r["tokens"], r["context"])
        compute = sum(float(np.asarray(v)) for k, v in parts.items() if k != "comm")
        ratios.append(r["seconds_nocomm"] / compute)
    return float(np.median(ratios))


def base_calibration(src: Path) -> Calibration:
    """The folder's one-GPU fit (one-gpu/), else its committed calibration."""
    kept = sorted((src / "one-gpu").glob("calibration-*.json"))
    return Calibration.load(kept[0]) if kept else next(iter(calibrations_in(src).values()))


def probe(folder: str) -> dict[str, Any]:
    src = ROOT / folder
    base = base_calibration(src)
    grids = [_load(p) for p in sorted(src.glob("verify-tp*.json"))]
    factors = {int(g["tp"]): f for g in grids if (f := compute_factor(g, base)) is not None}
    cal, offs = offsets(src, base)
    without = _per_file(check_with(src, cal))
    with scaled(factors):  # the offset is measured against the scaled compute's price
        withf = _per_file(check_with(src, offsets(src, base)[0]))
    return {"folder": folder, "factors": factors,
            "offset_us": {tp: v * 1e6 for tp, v in offs.items()},
            "without": without, "with": withf}  # fmt: skip


def main(argv: list[str]) -> int:
    out = []
    for folder in argv or DEFAULT:
        r = probe(folder)
        out.append(r)
        print(f"{folder}: factor " + ", ".join(
            f"tp {tp} {f:.3f}" for tp, f in sorted(r["factors"].items())
        ))  # fmt: skip
        for name in sorted(r["without"]):
            if name.startswith(("execute-tp", "verify-tp")):
                print(f"  {name:<24} {_cell(r['without'][name])}  ->  {_cell(r['with'][name])}")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
