"""The same verify forwards at tp 1 and tp 2 of one host, class by class, against the cost model (CPU).

    python -m benchmarks.bench_tp_classes benchmarks/results/tp_classes_h200/host_b \
        --calibration measurements/h200x2-tp/calibration-h200.json \
        [--sweep measurements/h200x2-tp/sweep.json]

Reads tp1_forward.json and tp2_forward.json of a folder written by benchmarks/run_tp_classes.sh
(benchmarks/probe_tp_forward.py: per shape the graph's wall time with and without its
collectives and the kernel time by class) and prices the same shapes with the calibration at
tp 1 and tp 2 (CostModel.verify_breakdown: linear = qkv_o + mlp + lm_head; other = elementwise
+ launch; comm = the collectives, launches and the logits gather's layout copy). Prints per
shape the tp 2 / tp 1 wall ratio measured and priced, each class measured / priced at both tp
(us; measured "other" is the wall less linear, attention and the collectives' in-place cost),
and each all-reduce's in-place cost (the wall with less without collectives, less the logits
all-gather and layout-copy kernels, over the all-reduces) beside the law's price and, with
--sweep, the sweep's in-place time at that size.

Then the split of each class into what a shard halves and what it keeps, measured and priced
(the "split" of each row): a class whose time is S + F at tp 1 and S/2 + F at tp 2 (the weights
and the KV heads split in two, every kernel kept) has F = 2 x tp2 - tp1. Per weight GEMM
(F of the linear class over Llama's 4 GEMMs a layer and the LM head) and per layer's attention
launch, in us; "other" is kept whole at both tp. Then one JSON document.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.bench_refit import _load
from spectune.planner.costmodel import CostModel
from spectune.planner.operators import ACT_BYTES, allreduce_time
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration

TARGET, DRAFTER = "llama-3.1-8b", "eagle3-llama-3.1-8b"


def _priced(cm: CostModel, b: int, n: int, c: int) -> dict[str, float]:
    p = {k: float(np.asarray(v)) * 1e6 for k, v in cm.verify_breakdown(b, n, c).items()}
    return {
        "wall": sum(p.values()),
        "linear": p["qkv_o"] + p["mlp"] + p["lm_head"],
        "attention": p["attention"],
        "other": p["elementwise"] + p["launch"],
        "comm": p["comm"],
    }


def _measured(row: dict[str, Any]) -> dict[str, float]:
    c, z = row["comm"], row["nocomm"]
    cl = c["by_class_us"]
    comm = c["wall_us"] - z["wall_us"]
    return {
        "wall": c["wall_us"],
        "linear": cl.get("linear", 0.0),
        "attention": cl.get("attention", 0.0),
        "other": c["wall_us"] - cl.get("linear", 0.0) - cl.get("attention", 0.0) - comm,
        "comm": comm,
    }


def _per_allreduce_us(row: dict[str, Any], layers: int) -> float:
    """The in-place cost of one all-reduce: the collectives' in-place cost less the logits
    all-gather's and its layout copy's kernels, over 2 x layers all-reduces."""
    names = row["comm"]["by_name_us"]
    gather = sum(v[0] for k, v in names.items() if "AllGather" in k)
    copy = sum(v[0] for k, v in names.items() if k.startswith("void at::native::elementwise"))
    comm = row["comm"]["wall_us"] - row["nocomm"]["wall_us"]
    return (comm - gather - copy) / (2 * layers)


def split(tp1: dict[str, float], tp2: dict[str, float], layers: int) -> dict[str, float]:
    """{'gemm_fixed_us': the linear class's kept time per weight GEMM, 'attention_fixed_us': the
    attention class's per layer} of one shape's classes at tp 1 and tp 2 (us): F = 2 x tp2 -
    tp1 of a class whose time is S + F at tp 1 and S/2 + F at tp 2. Llama's executor forward
    runs 4 weight GEMMs a layer (qkv, o, gate_up, down) and the LM head."""
    return {
        "gemm_fixed_us": (2 * tp2["linear"] - tp1["linear"]) / (4 * layers + 1),
        "attention_fixed_us": (2 * tp2["attention"] - tp1["attention"]) / layers,
    }


def compare(folder: Path, cal: Calibration, sweep: Path | None) -> list[dict[str, Any]]:
    one, two = _load(folder / "tp1_forward.json"), _load(folder / "tp2_forward.json")
    hw = load_hardware("h200" if "H200" in one["gpu"] else "h100-sxm")
    target = load_model(TARGET)
    cms = {tp: CostModel(hw, target, load_model(DRAFTER), tp=tp, calibration=cal) for tp in (1, 2)}
    swept = {}
    if sweep is not None:
        swept = {
            int(r["bytes"]): float(r["seconds"]) * 1e6
            for r in _load(sweep)
            if r.get("op") == "all_reduce" and int(r.get("tp", 0)) == 2
        }
    out = []
    for r1, r2 in zip(one["shapes"], two["shapes"], strict=True):
        b, n, c = r1["batch"], r1["tokens"], r1["context"]
        if (b, n, c) != (r2["batch"], r2["tokens"], r2["context"]):
            raise ValueError(f"{folder}: tp 1 and tp 2 shapes differ at {b}x{n}")
        size = b * n * target.hidden * ACT_BYTES
        law = float(allreduce_time(cms[2].rates, size, 2)) * 1e6
        out.append({
            "batch": b, "tokens": n, "context": c,
            "tp1": {"measured": _measured(r1), "priced": _priced(cms[1], b, n, c)},
            "tp2": {"measured": _measured(r2), "priced": _priced(cms[2], b, n, c)},
            "split": {
                k: split(_measured(r1) if k == "measured" else _priced(cms[1], b, n, c),
                         _measured(r2) if k == "measured" else _priced(cms[2], b, n, c),
                         target.layers)
                for k in ("measured", "priced")
            },
            "allreduce_bytes": size,
            "allreduce_us": {"inplace": _per_allreduce_us(r2, target.layers), "law": law,
                             "sweep": swept.get(size)},
        })  # fmt: skip
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("folder", type=Path)
    p.add_argument("--calibration", type=Path, required=True)
    p.add_argument("--sweep", type=Path, default=None)
    args = p.parse_args(argv)
    rows = compare(args.folder, Calibration.load(args.calibration), args.sweep)
    print(f"{args.folder}: us measured / priced; ratio = tp 2 wall / tp 1 wall")
    print(f"{'B':>3} {'N':>2} {'ratio meas/priced':>18} {'tp':>3} {'wall':>13} {'linear':>13} "
          f"{'attention':>13} {'other':>11} {'comm':>11}")  # fmt: skip
    for r in rows:
        ratio = [r["tp2"][k]["wall"] / r["tp1"][k]["wall"] for k in ("measured", "priced")]
        for tp in ("tp1", "tp2"):
            m, q = r[tp]["measured"], r[tp]["priced"]
            cells = " ".join(
                f"{m[k]:6.0f}/{q[k]:<6.0f}" if k in ("wall", "linear", "attention") else
                f"{m[k]:5.0f}/{q[k]:<5.0f}" for k in ("wall", "linear", "attention", "other", "comm")
            )  # fmt: skip
            lead = f"{r['batch']:>3} {r['tokens']:>2} {ratio[0]:8.3f}/{ratio[1]:<9.3f}"
            print(f"{lead if tp == 'tp1' else ' ' * len(lead)} {tp[2:]:>3} {cells}")
    print("one all-reduce at tp 2, us: in place in the forward / the law (+ in-forward offset)"
          " / the sweep")  # fmt: skip
    for r in rows:
        a = r["allreduce_us"]
        sw = "-" if a["sweep"] is None else f"{a['sweep']:.1f}"
        print(f"  B{r['batch']:>3} N{r['tokens']:>2} {r['allreduce_bytes'] / 2**20:7.3f} MiB  "
              f"{a['inplace']:5.1f} / {a['law']:5.1f} / {sw}")  # fmt: skip
    print("what a shard keeps (F = 2 x tp2 - tp1 of a class), us measured / priced: per weight"
          " GEMM, per layer's attention; other at tp 1 / tp 2 measured")  # fmt: skip
    for r in rows:
        m, q = r["split"]["measured"], r["split"]["priced"]
        o1, o2 = r["tp1"]["measured"]["other"], r["tp2"]["measured"]["other"]
        print(f"  B{r['batch']:>3} N{r['tokens']:>2}  GEMM {m['gemm_fixed_us']:5.1f} / "
              f"{q['gemm_fixed_us']:<5.1f} attention {m['attention_fixed_us']:5.1f} / "
              f"{q['attention_fixed_us']:<5.1f} other {o1:4.0f} / {o2:4.0f}")  # fmt: skip
    print(json.dumps({"bench": "tp_classes", "folder": str(args.folder), "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
