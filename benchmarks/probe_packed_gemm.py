"""The weight GEMMs of a packed (pruned) verify at every token bucket vs operators.gemm_time.

A pruned batch's verify runs its weight GEMMs at M = the packed token count, a multiple of 16
(kernels/ragged_plan.py TOKEN_BUCKET) anywhere between B and B x budget, while every GEMM
micro-benchmark and verify-grid row that `spectune calibrate` fits the GEMM model to has M a
power of two. gemm_time charges M padded to Calibration.gemm_tile_m and rounded up to whole
waves of tiles over the SMs, which jumps by up to half a GEMM at M = 512 + 16 or 1024 + 16 for
Llama-3.1-8B; the pruned trace runs keep ~16 of 32 tokens per request (M = 490-1010 at batch
32-64), right at those steps (benchmarks/bench_prune_phases.py). This probe measures what the
GEMMs of one verify cost at each bucket, in the executor's kernels (spectune.kernels.gemm.linear:
cuBLAS above M = 256) and in one CUDA graph per M over `--layers` layers of distinct weights
(so L2 holds none of them, as in a forward), beside the model's price with the GPU's committed
calibration.

    python -m benchmarks.probe_packed_gemm --out $OUT/packed_gemm.json          # GPU, ~1-2 min
    python -m benchmarks.probe_packed_gemm --layers 1 --m 16,32 --out x.json    # CPU smoke run
    python -m benchmarks.probe_packed_gemm --reprice x.json [--calibration c.json]  # CPU

Also, at M in CHAIN_M, each shape alone: the same `--layers` distinct weights of that one shape
back to back in one graph (q|k|v, o, gate|up, down and the LM head's copies), so the intercept of
time vs bytes over the shapes is the fixed part of a weight-streaming GEMM inside a chain of
GEMMs, beside validate.fit.gemm_stream_line's (the same shape repeated, from calibrate).

Prints per M: measured and modelled ms of the layers' q|k|v, o, gate|up and down GEMMs plus the
LM head, their ratio, and each one's step from the previous M; last, the ratio's range. The
rows go to --out as JSON. Below M = 256 the executor may run an autotuned Triton variant
instead of cuBLAS (spectune.kernels.gemm.GemmPlan); this probe, untuned, times cuBLAS there.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from spectune.cli.common import int_range, ints
from spectune.kernels.gemm import linear
from spectune.kernels.timing import graph_time
from spectune.planner.costmodel import CostModel
from spectune.planner.operators import ACT_BYTES, gemm_time
from spectune.specs import load_hardware, load_model
from spectune.specs.calibration import Calibration
from spectune.specs.io import loads_json, read_bytes_bounded
from spectune.validate.fit import gemm_stream_line
from spectune.validate.measure import gpu_hardware_name

ROOT = Path(__file__).resolve().parent.parent
CALIBRATIONS = {  # the latest committed new-user fit per GPU
    "h200": ROOT / "measurements/h200-newuser3/calibration-h200.json",
    "h100-sxm": ROOT / "measurements/h100-newuser10/calibration-h100-sxm.json",
}
DEFAULT_M = [1, 4, 8, *range(16, 256, 16), *range(256, 1409, 16), 1536, 2048]
#: token counts of the per-shape chains (weight streaming: operators.gemm_time's memory side)
CHAIN_M = (1, 8, 16, 32, 64)


def shapes(target: str) -> list[tuple[str, int, int]]:
    """(name, N, K) of one decoder layer's weight GEMMs, as spectune.executor.model lays them."""
    m = load_model(target)
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    return [("qkv", q + 2 * kv, m.attn_in_width), ("o", m.hidden, q),
            ("gate_up", 2 * m.ffn, m.hidden), ("down", m.hidden, m.ffn)]  # fmt: skip


def priced_s(cm: CostModel, layer: list[tuple[str, int, int]], m: int) -> float:
    """operators.gemm_time of a 32-layer forward's weight GEMMs + the LM head at M = m."""
    fmt = cm.rates.dense_format(float(cm.target.dtype_bytes))
    per_layer = sum(float(gemm_time(cm.rates, m, n, k, fmt)) for _, n, k in layer)
    return per_layer * 32 + float(gemm_time(cm.rates, m, cm.target.vocab, cm.target.hidden, fmt))


#: token ranges the re-pricing summarises (streaming, the ridge, the pruned verifies' range)
RANGES = ((1, 64), (65, 256), (257, 512), (513, 1024), (1025, 2048))


def reprice(path: Path, calibration: Path | None) -> int:
    """CPU: the rows of a probe document priced again under `calibration` (default: the GPU's
    committed new-user fit); model / measured by token range, and the chains' lines."""
    import numpy as np

    doc = loads_json(read_bytes_bounded(path), str(path))
    cal_path = calibration or CALIBRATIONS[doc["hardware"]]
    model = load_model(doc["target"])
    cm = CostModel(load_hardware(doc["hardware"]), model, calibration=Calibration.load(cal_path))
    layer = shapes(doc["target"])
    ms = np.array([r["m"] for r in doc["rows"]])
    meas = np.array([r["measured_s"] for r in doc["rows"]])
    ratio = np.array([priced_s(cm, layer, int(m)) for m in ms]) / meas
    print(f"{doc['gpu']}: {path} priced with {cal_path}")
    for lo, hi in RANGES:
        sel = (ms >= lo) & (ms <= hi)
        if sel.any():
            print(f"  M {lo:>4}..{hi:<4} model / measured mean {ratio[sel].mean():.3f} "
                  f"(min {ratio[sel].min():.3f}, max {ratio[sel].max():.3f})")  # fmt: skip
    for c in doc.get("chains", []):
        if c["op"] == "fit":
            print(f"  chain M={c['m']:>3}: intercept {c['intercept_s'] * 1e6:.2f} us, "
                  f"{c['bytes_per_s'] / 1e12:.2f} TB/s")  # fmt: skip
    return 0


def chain_rows(
    weights: list[list[torch.Tensor]],
    head: torch.Tensor,
    layer: list[tuple[str, int, int]],
    x: torch.Tensor,
    ms: list[int],
    dev: torch.device,
) -> list[dict[str, object]]:
    """Per M and shape: seconds per GEMM of that shape's distinct weights run back to back in
    one graph (the LM head: its one weight, L2 cannot hold its 1 GB), and per M the line of
    seconds vs bytes over the shapes (validate.fit.gemm_stream_line, as calibrate's rows)."""
    out: list[dict[str, object]] = []
    for m in ms:
        pts: list[dict[str, object]] = []
        for i, (name, n, k) in enumerate([*layer, ("lm_head", *head.shape)]):
            ws = [head] if name == "lm_head" else [w[i] for w in weights]

            def chain(m: int = m, k: int = k, ws: list[torch.Tensor] = ws) -> None:
                for w in ws:
                    linear(x[:m, :k], w)

            t = graph_time(chain, dev, reps=5) / len(ws)
            nbytes = (n * k + m * (n + k)) * ACT_BYTES
            pts.append({"m": m, "op": name, "n": n, "k": k, "bytes": nbytes, "seconds": t})
        out += pts
        per = ", ".join(f"{float(r['seconds']) * 1e6:.1f}" for r in pts)  # type: ignore[arg-type]
        line = gemm_stream_line({"gemm": pts})
        if line is None:  # time did not grow with bytes (a CPU run)
            print(f"chain M={m:>3}: no line ({per} us per GEMM)")
            continue
        out.append({"m": m, "op": "fit", "intercept_s": line.fixed_s,
                    "bytes_per_s": line.bytes_per_s})  # fmt: skip
        print(f"chain M={m:>3}: intercept {line.fixed_s * 1e6:6.2f} us, "
              f"{line.bytes_per_s / 1e12:.2f} TB/s ({per} us per GEMM)")  # fmt: skip
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--target", default="llama-3.1-8b")
    p.add_argument(
        "--layers",
        type=int_range(1, 32),
        default=32,
        help="layers of distinct weights per graph (1..32)",
    )
    p.add_argument(
        "--m",
        type=ints(1, 16384, name="token counts"),
        default=DEFAULT_M,
        help="token counts (comma list, 1..16384)",
    )
    p.add_argument("--calibration", type=Path, help="default: the GPU's committed new-user fit")
    p.add_argument("--out", type=Path, help="JSON to write (required unless --reprice)")
    p.add_argument("--reprice", type=Path, help="CPU: price a probe document's rows again")
    args = p.parse_args(argv)
    if args.reprice is not None:
        return reprice(args.reprice, args.calibration)
    if args.out is None:
        p.error("--out is required (or --reprice FILE)")
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda" if cuda else "cpu")
    hw = gpu_hardware_name(torch.cuda.get_device_name()) if cuda else "h200"
    cal = Calibration.load(args.calibration or CALIBRATIONS[hw])
    model = load_model(args.target)
    cm = CostModel(load_hardware(hw), model, calibration=cal)
    layer = shapes(args.target)
    gen = torch.Generator(device=dev).manual_seed(0)
    dtype = torch.bfloat16

    def weight(n: int, k: int) -> torch.Tensor:
        return (torch.randn((n, k), generator=gen, device=dev, dtype=dtype) * 0.02).contiguous()

    weights = [[weight(n, k) for _, n, k in layer] for _ in range(args.layers)]
    head = weight(model.vocab, model.hidden)
    width = max(k for _, _, k in layer)
    x = torch.randn((max(args.m), width), generator=gen, device=dev, dtype=dtype)
    rows = []
    print(
        f"{torch.cuda.get_device_name() if cuda else 'cpu'} ({hw}), {args.target}, "
        f"{args.layers} layers + LM head; calibration {args.calibration or CALIBRATIONS[hw]}"
    )
    print(
        f"{'M':>5} {'measured ms':>11} {'model ms':>9} {'model/meas':>10} "
        f"{'meas step':>9} {'model step':>10}"
    )
    for m in args.m:

        def gemms(m: int = m) -> None:
            for ws in weights:
                for (_, _, k), w in zip(layer, ws, strict=True):
                    linear(x[:m, :k], w)
            linear(x[:m, : model.hidden], head)

        measured = graph_time(gemms, dev, reps=5) * 32 / args.layers  # a 32-layer forward's
        modelled = priced_s(cm, layer, m)
        prev = rows[-1] if rows else None
        rows.append({"m": m, "measured_s": measured, "model_s": modelled})
        d_meas = (measured - prev["measured_s"]) * 1e3 if prev else 0.0
        d_model = (modelled - prev["model_s"]) * 1e3 if prev else 0.0
        print(
            f"{m:>5} {measured * 1e3:>11.3f} {modelled * 1e3:>9.3f} "
            f"{modelled / measured:>10.3f} {d_meas:>+9.3f} {d_model:>+10.3f}"
        )
    chains = chain_rows(weights, head, layer, x, [m for m in CHAIN_M if m <= max(args.m)], dev)
    doc = {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "hardware": hw,
           "target": args.target, "layers": args.layers, "rows": rows,
           "chains": chains}  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1))
    ratio = [(r["model_s"] / r["measured_s"], r["m"]) for r in rows]
    lo, hi = min(ratio), max(ratio)
    print(f"model / measured: {lo[0]:.3f} at M = {lo[1]} .. {hi[0]:.3f} at M = {hi[1]}; "
          f"rows in {args.out}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
