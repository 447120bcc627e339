"""What the GEMM plan's M buckets cost at the M between them (one GPU).

kernels.gemm.autotune times every variant per weight shape at the M of each bucket
(M_BUCKETS) and a GEMM of M rows runs the choice of the first bucket >= M. A TP 2 forward on
two H200s stepped up by 113 us from one token to two (benchmarks/probe_tp_forward.py): at M = 1
the 14336 x 4096 gate|up shard ran the Triton split-K variant (29.3 us a layer), at M = 2 the
M = 16 bucket's choice, cuBLAS (31.8 us). This probe times every variant at every M of
`--m` for Llama-3.1-8B's weight shapes at tp 1 and 2 (and the SwiGLU-fused down projections),
and reports per shape and M: the fastest variant, and what the plans of M_BUCKETS and of
`--buckets` run there (their choice at the first bucket >= M, timed at this M), so the loss of
each bucket set shows. The buckets it times must include both sets' (`--m`).

    PYTHONPATH=. python benchmarks/probe_gemm_buckets.py --out $OUT/gemm_buckets.json

Prints a table (us), then the summed loss per forward (32 layers; the LM head once).
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from spectune.executor.session import weight_shapes
from spectune.executor.tp import tp_weight_shapes
from spectune.kernels.gemm import M_BUCKETS, autotune, pick_variant
from spectune.specs import load_model
from spectune.specs.io import write_json_atomic


def _plan_pick(times: dict[str, dict[int, float]], buckets: tuple[int, ...], m: int) -> str:
    """The variant a plan over `buckets` runs at M = m: kernels.gemm.pick_variant's choice at the
    first bucket >= m, each bucket's pick seeded by the one before (as autotune picks)."""
    pick = None
    for b in buckets:
        pick = pick_variant({v: t[b] for v, t in times.items() if b in t}, pick)
        if m <= b:
            return pick
    return "cublas"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--m", default="1,2,4,8,16,32,64")
    p.add_argument("--buckets", default="1,2,4,8,16,32,64,128,256", help="a finer plan to compare")
    p.add_argument("--tp", default="1,2")
    p.add_argument("--out", default="")
    args = p.parse_args()
    ms = tuple(int(x) for x in args.m.split(","))
    fine = tuple(int(x) for x in args.buckets.split(","))
    dev = torch.device("cuda")
    target = load_model("llama-3.1-8b")
    shapes: set[tuple[int, int]] = set()
    gated: set[tuple[int, int]] = set()
    for tp in (int(x) for x in args.tp.split(",")):
        shapes |= set(tp_weight_shapes(target, tp) if tp > 1 else weight_shapes(target))
        gated.add((target.hidden, target.ffn // tp))
    t0 = time.perf_counter()
    _, rows = autotune(sorted(shapes), dev, buckets=ms, gated=sorted(gated))
    wall = time.perf_counter() - t0
    times: dict[tuple[int, int, bool], dict[str, dict[int, float]]] = defaultdict(
        lambda: defaultdict(dict)
    )
    for r in rows:
        if "seconds" in r:
            times[(int(r["n"]), int(r["k"]), bool(r["gated"]))][str(r["variant"])][int(r["m"])] = (
                float(r["seconds"]) * 1e6
            )
    table = []
    print(f"{torch.cuda.get_device_name(0)}: autotune over M {ms} in {wall:.0f} s")
    print(f"{'N x K':>16} {'M':>4} {'best':>8} {'default':>8} {'fine':>8}  best / default variant")
    for key in sorted(times):
        t = times[key]
        for m in ms:
            at = {v: x[m] for v, x in t.items() if m in x}
            if not at:
                continue
            best = min(at, key=lambda v: at[v])
            dflt = _plan_pick(t, M_BUCKETS, m)
            fin = _plan_pick(t, fine, m)
            row = {
                "n": key[0], "k": key[1], "gated": key[2], "m": m,
                "best": best, "best_us": at[best],
                "default": dflt, "default_us": at.get(dflt, float("nan")),
                "fine": fin, "fine_us": at.get(fin, float("nan")),
            }  # fmt: skip
            table.append(row)
            name = f"{key[0]}x{key[1]}{'+silu' if key[2] else ''}"
            print(
                f"{name:>16} {m:>4} {at[best]:>8.1f} {row['default_us']:>8.1f} "
                f"{row['fine_us']:>8.1f}  {best} / {dflt}"
            )
    if args.out:
        write_json_atomic(
            args.out,
            {"gpu": torch.cuda.get_device_name(0), "m": ms, "fine_buckets": fine,
             "default_buckets": M_BUCKETS, "autotune_s": wall, "table": table, "rows": rows},
        )  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
