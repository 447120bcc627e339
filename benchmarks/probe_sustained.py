"""Does a long compute-bound forward run below the matmul rate that a short probe measures?

    PYTHONPATH=. python benchmarks/probe_sustained.py [--out DIR]      # needs a CUDA GPU

The verify grid's forwards of 1024 rows or more run 2-3.5% slower than the cost model prices
them, even at context 512 where attention is small (measurements/h100-newuser4,
benchmarks/results/refit_cpu.txt), while calibrate's isolated GEMMs at M = 4096 reach the
measured matmul rate. One candidate is the clock: a 60-120 ms stretch of tensor-core work draws
more power than a short probe and the SM clock drops. This probe runs back-to-back bf16 GEMMs of
the verify's shapes (Llama-3.1-8B gate|up, M = 4096) for windows of 2 ms to 2 s after an idle
pause, and reports per window the achieved TFLOP/s, the SM clock and the power read through NVML
(torch.cuda.clock_rate / power_draw) at its end. Writes DIR/probe_sustained.json; prints a table.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

WINDOWS_MS = (2, 10, 50, 120, 500, 2000)
M, N, K = 4096, 28672, 4096  # Llama-3.1-8B gate|up over 4096 rows


def _nvml(fn_name: str) -> float:
    fn = getattr(torch.cuda, fn_name, None)
    try:
        return float(fn()) if fn is not None else float("nan")
    except Exception:  # NVML absent or not permitted
        return float("nan")


def window(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, ms: float) -> dict[str, float]:
    """Back-to-back GEMMs for about `ms` after a 1 s idle pause: TFLOP/s over the window, and
    the clock and power at its end."""
    torch.cuda.synchronize()
    time.sleep(1.0)  # cool down: the window starts from an idle GPU
    one = 2.0 * M * N * K
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    # estimate the GEMM time from a short burst, then size the window
    start.record()
    for _ in range(3):
        torch.matmul(a, b, out=c)
    end.record()
    torch.cuda.synchronize()
    per = start.elapsed_time(end) / 3
    reps = max(1, round(ms / per))
    time.sleep(1.0)
    start.record()
    for _ in range(reps):
        torch.matmul(a, b, out=c)
    end.record()
    end.synchronize()
    clock = _nvml("clock_rate")
    power = _nvml("power_draw")
    elapsed = start.elapsed_time(end)
    return {
        "window_ms": elapsed,
        "gemms": reps,
        "tflops": one * reps / (elapsed * 1e-3) / 1e12,
        "sm_clock_mhz_at_end": clock,
        "power_mw_at_end": power,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=".")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU")
        return 2
    dev = torch.device("cuda")
    a = torch.randn(M, K, device=dev, dtype=torch.bfloat16)
    b = torch.randn(K, N, device=dev, dtype=torch.bfloat16)
    c = torch.empty(M, N, device=dev, dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b, out=c)
    rows = [window(a, b, c, ms) for ms in WINDOWS_MS for _ in range(2)]
    doc = {"gpu": torch.cuda.get_device_name(dev), "shape": [M, N, K], "windows": rows}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe_sustained.json").write_text(json.dumps(doc, indent=1))
    print(f"{doc['gpu']}: bf16 GEMM {M}x{N}x{K} back to back after 1 s idle")
    print(f"{'window ms':>10} {'GEMMs':>6} {'TFLOP/s':>8} {'SM MHz':>7} {'W':>6}")
    for r in rows:
        print(f"{r['window_ms']:>10.1f} {r['gemms']:>6} {r['tflops']:>8.1f} "
              f"{r['sm_clock_mhz_at_end']:>7.0f} {r['power_mw_at_end'] / 1e3:>6.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
