"""Tensor-parallel shard GEMMs on one GPU: the GEMM sweep's form against a forward's sequence.

The tp 2 runs price the step without speculation 4-6% high at batch 1 (benchmarks/results/
tp_h200x2_d): the shard's weight GEMMs cost 2435 us in the cost model and 2217-2231 us of
kernel time in the real forward (probe/tp2_forward.json). The cost model prices every GEMM as
bytes / weight bandwidth + gemm_fixed_s, a line fitted to calibrate's GEMM sweep, which times
only the full (tp 1) shapes. This probe asks which part is off, per tp in `--tp`:

- sweep:    each of the rank's GEMM shapes (executor.tp.tp_weight_shapes of Llama-3.1-8B;
            the down projection SwiGLU-fused, as the forward runs it) alone, back to back over
            rotating weight copies, as calibrate.gemm_sweep times them;
- sequence: one forward's GEMMs in forward order (32 layers of distinct weights: q|k|v, o,
            gate|up, silu*up -> down; then the LM head shard) in one CUDA graph, nothing else;
- model:    the cost model's price of the same GEMMs with `--calibration` (operators.gemm_time).

at the `--m` rows (default 1 / 16 / 64). Each tp's GEMM plan is autotuned in process, as a TP rank does. If the
sweep at shard shapes matches the sequence, calibrate can time shard shapes and the fit's line
will carry them; if the sequence is faster than the sweep, the forward hides part of each GEMM's
fixed cost, which no single-shape sweep sees.

    PYTHONPATH=. python benchmarks/probe_shard_gemm.py --calibration CAL --out $OUT/shard_gemm.json

One GPU; writes the JSON and prints a table last.
"""

from __future__ import annotations

import argparse
from typing import Any

import torch

from spectune.executor.tp import shard_spec, tp_weight_shapes
from spectune.kernels.gemm import (
    GemmPlan,
    autotune,
    linear,
    linear_gated,
    rotating_weights,
    set_plan,
)
from spectune.kernels.timing import graph_time
from spectune.planner.operators import Rates, gemm_time
from spectune.specs import load_model
from spectune.specs.calibration import load_calibration
from spectune.specs.hardware import load_hardware
from spectune.specs.io import write_json_atomic


def probe(tp: int, rows_m: list[int], rates: Rates, dev: torch.device) -> dict[str, Any]:
    spec = load_model("llama-3.1-8b")
    shard = shard_spec(spec, tp)
    d, h = shard.head_dim, shard.hidden
    qkv = ((shard.heads + 2 * shard.kv_heads) * d, shard.attn_in_width)
    o = (h, shard.heads * d)
    gate_up = (2 * shard.ffn, h)
    down = (h, shard.ffn)
    head = (spec.lm_vocab // tp, spec.hidden)
    shapes = sorted(set(tp_weight_shapes(spec, tp)))
    plan, _ = autotune(shapes, dev, gated=[down])
    set_plan(plan)
    fmt = rates.dense_format(2)
    layer = {"qkv": qkv, "o": o, "gate_up": gate_up, "down": down}
    out: dict[str, Any] = {"tp": tp, "gemm_plan": plan.to_dict(), "rows": []}
    for m in rows_m:
        sweep: dict[str, float] = {}
        model: dict[str, float] = {}
        for name, (n, k) in {**layer, "lm_head": head}.items():
            ws = rotating_weights(n, k, dev)
            gated = name == "down"
            x = torch.empty((m, 2 * k if gated else k), device=dev, dtype=torch.bfloat16)
            x.uniform_(-1, 1)

            def call(x: torch.Tensor = x, ws: list[torch.Tensor] = ws, g: bool = gated) -> None:
                for w in ws:
                    linear_gated(x, w) if g else linear(x, w)

            sweep[name] = graph_time(call, dev, 10) / len(ws)
            model[name] = float(gemm_time(rates, m, n, k, fmt))
            del ws
        # one forward's GEMMs in order, 32 layers of distinct weights, then the LM head
        # one weight each (rotating_weights over a single copy's bytes)
        lw = [
            {name: rotating_weights(n, k, dev, 1)[0] for name, (n, k) in layer.items()}
            for _ in range(spec.layers)
        ]
        hw = rotating_weights(*head, dev, 1)[0]
        xh = torch.empty((m, h), device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        xa = torch.empty((m, o[1]), device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
        xg = torch.empty((m, 2 * down[1]), device=dev, dtype=torch.bfloat16).uniform_(-1, 1)

        def forward(
            lw: list[dict[str, torch.Tensor]] = lw,
            hw: torch.Tensor = hw,
            xh: torch.Tensor = xh,
            xa: torch.Tensor = xa,
            xg: torch.Tensor = xg,
        ) -> None:
            for w in lw:
                linear(xh, w["qkv"])
                linear(xa, w["o"])
                linear(xh, w["gate_up"])
                linear_gated(xg, w["down"])
            linear(xh, hw)

        seq = graph_time(forward, dev, 10)
        del lw, hw
        per_layer_sweep = sum(sweep[k] for k in layer)
        per_layer_model = sum(model[k] for k in layer)
        out["rows"].append(
            {
                "m": m,
                "sweep_s": sweep,
                "model_s": model,
                "sequence_s": seq,
                "sweep_forward_s": spec.layers * per_layer_sweep + sweep["lm_head"],
                "model_forward_s": spec.layers * per_layer_model + model["lm_head"],
                "weight_bytes": {n: a * b * 2 for n, (a, b) in {**layer, "lm_head": head}.items()},
            }
        )
        torch.cuda.synchronize()
    set_plan(GemmPlan())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calibration", required=True, help="the card's fitted calibration JSON")
    ap.add_argument("--hardware", default="", help="hardware preset (default: the calibration's)")
    ap.add_argument("--tp", default="1,2,4")
    ap.add_argument("--m", default="1,16,64")
    ap.add_argument("--out", default="shard_gemm.json")
    a = ap.parse_args()
    dev = torch.device("cuda")
    cal = load_calibration(a.calibration)
    hw = load_hardware(a.hardware or cal.hardware)
    rates = Rates.resolve(hw, cal)
    ms = [int(v) for v in a.m.split(",")]
    res = {
        "gpu": torch.cuda.get_device_name(0),
        "calibration": a.calibration,
        "gemm_fixed_us": cal.gemm_fixed_s * 1e6,
        "probes": [probe(int(t), ms, rates, dev) for t in a.tp.split(",")],
    }
    write_json_atomic(a.out, res)
    print(f"{res['gpu']}; model: {a.calibration} (gemm_fixed {res['gemm_fixed_us']:.2f} us)")
    print(
        "tp    M  sweep fwd  sequence     model   model/seq  sweep/seq   per GEMM us (sweep - seq)"
    )
    for p in res["probes"]:
        for r in p["rows"]:
            n_gemm = 4 * load_model("llama-3.1-8b").layers + 1  # the forward's GEMMs
            sw, sq, mo = r["sweep_forward_s"], r["sequence_s"], r["model_forward_s"]
            print(
                f"{p['tp']:<3}{r['m']:>4} {sw * 1e6:10.1f} {sq * 1e6:9.1f} {mo * 1e6:9.1f}"
                f"  {mo / sq:9.3f}  {sw / sq:9.3f}   {(sw - sq) / n_gemm * 1e6:8.2f}"
            )
    for p in res["probes"]:
        r = p["rows"][0]
        per = {k: f"{r['sweep_s'][k] * 1e6:.1f}/{r['model_s'][k] * 1e6:.1f}" for k in r["sweep_s"]}
        print(f"tp {p['tp']} M {r['m']} per shape sweep/model us: {per}")


if __name__ == "__main__":
    main()
