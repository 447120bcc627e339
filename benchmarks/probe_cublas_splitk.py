"""Whether cuBLAS's split-K at 16-64 rows can be avoided for the tensor-parallel shard's GEMMs.

On 2x H200 the tp 2 shard's q|k|v (3072 x 4096) and down (4096 x 7168) projections run cuBLAS
split-K kernels at 32 rows with a `cublasLt::splitKreduce_kernel` after each, and the forward's
weight GEMMs cost 63 us more at 32 rows than at 64 (benchmarks/results/gemm_bucket_h200). This
probe times, per weight shape and M (CUDA-graph replays over rotating weight copies, as
kernels.gemm.autotune times its variants):
- "cublas": torch's linear as the executor runs it (cuBLAS, the default BLAS library);
- "lt": kernels.gemm.lt_linear, the executor's "cublaslt" variant (cuBLASLt preferred for the call);
- "pad64": the rows zero-padded to a multiple of 64 (one copy kernel), then torch's linear;
and profiles the kernels each launches at `--profile-m` (whether cuBLAS splits K and launches
its reduce kernel). Under CUBLAS_WORKSPACE_CONFIG=:0:0 (no workspace, so no split-K partials)
the "lt" form fails on torch 2.11: cuBLASLt cannot allocate its workspace.

    PYTHONPATH=. python benchmarks/probe_cublas_splitk.py --label default --out $OUT/default.json

Results: benchmarks/results/gemm_bucket_h200/isolated (the forwards: host_c, host_d, h100_host).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

import torch

from spectune.kernels.gemm import lt_linear, rotating_weights
from spectune.kernels.timing import graph_time
from spectune.specs.io import write_json_atomic

#: Llama-3.1-8B's weights at tp 1 and their tp 2 shards ([N, K]): q|k|v, o, gate|up, down
SHAPES = ((3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168),
          (6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336))  # fmt: skip
MS = (16, 32, 48, 64)


def _pad64(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    m = x.shape[0]
    pad = -m % 64
    xp = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    return torch.nn.functional.linear(xp, w)[:m]


FORMS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "cublas": torch.nn.functional.linear,
    "lt": lt_linear,
    "pad64": _pad64,
}


def _kernels(fn: Callable[[], object]) -> list[str]:
    """Names of the CUDA kernels one call of fn launches."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--label", default="default")
    p.add_argument("--out", default="")
    p.add_argument("--profile-m", type=int, default=32)
    args = p.parse_args()
    dev = torch.device("cuda")
    rows: list[dict[str, Any]] = []
    for n, k in SHAPES:
        ws = rotating_weights(n, k, dev)
        for m in MS:
            x = torch.empty((m, k), device=dev, dtype=torch.bfloat16).uniform_(-1, 1)
            row: dict[str, Any] = {"n": n, "k": k, "m": m}
            for name, form in FORMS.items():

                def call(form: Any = form, x: torch.Tensor = x, ws: Any = ws) -> None:
                    for w in ws:
                        form(x, w)

                try:
                    row[name] = graph_time(call, dev) / len(ws)
                except Exception as e:  # a form that does not capture is reported, not fatal
                    row[name] = None
                    row[f"{name}_error"] = repr(e)[:200]
                if m == args.profile_m:
                    row[f"{name}_kernels"] = _kernels(lambda form=form, x=x, w=ws[0]: form(x, w))
            rows.append(row)
    doc = {
        "gpu": torch.cuda.get_device_name(0),
        "label": args.label,
        "workspace": os.environ.get("CUBLAS_WORKSPACE_CONFIG", ""),
        "rows": rows,
    }
    if args.out:
        write_json_atomic(args.out, doc)
    print(f"{args.label}: {doc['gpu']}, workspace {doc['workspace'] or 'default'}; us per GEMM")
    print(f"{'N':>6} {'K':>6} {'M':>3} " + " ".join(f"{f:>8}" for f in FORMS) + "  kernels")
    for r in rows:
        cells = " ".join(
            f"{1e6 * r[f]:8.2f}" if r.get(f) is not None else f"{'-':>8}" for f in FORMS
        )
        extra = "".join(
            f"  {f}: " + ", ".join(x[:28] for x in r[f"{f}_kernels"])
            for f in ("cublas", "lt")
            if r.get(f"{f}_kernels")
        )
        print(f"{r['n']:>6} {r['k']:>6} {r['m']:>3} {cells}{extra}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
