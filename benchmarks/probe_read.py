"""Read-only HBM bandwidth: torch's sum vs the streaming read kernel (kernels/stream.py) by
programs per SM, tile and warps, beside the copy rate and one tree-attention layer at
batch 64 x context 4096 (the KV stream of a verify). Prints a table; --out writes JSON.

    python benchmarks/probe_read.py --out $OUT/probe_read.json      # one GPU, ~1 min
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable

import torch

from spectune.kernels.stream import stream_read


def _median_s(fn: Callable[[], object], reps: int = 20) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return statistics.median(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default=None)
    p.add_argument("--gib", type=float, default=2.0)
    args = p.parse_args()
    dev = torch.device("cuda")
    nbytes = int(args.gib * (1 << 30))
    x = torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev).uniform_()
    y = torch.empty_like(x)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    rows = []

    def rec(name: str, seconds: float, moved: int) -> None:
        rows.append({"what": name, "seconds": seconds, "tb_s": moved / seconds / 1e12})

    rec("copy (read + write)", _median_s(lambda: y.copy_(x)), 2 * nbytes)
    rec("torch sum", _median_s(lambda: x.sum(dtype=torch.float32)), nbytes)
    for per_sm in (1, 2, 4, 8):
        for block in (2048, 4096, 8192):
            for warps in (4, 8):
                t = _median_s(lambda p=per_sm * sms, b=block, w=warps: stream_read(x, p, b, w))
                rec(f"stream_read {per_sm}/SM block {block} warps {warps}", t, nbytes)
    best = max((r for r in rows if r["what"].startswith("stream")), key=lambda r: r["tb_s"])
    summary = {
        "gpu": torch.cuda.get_device_name(0),
        "bytes": nbytes,
        "rows": rows,
        "best_stream": best,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)
    print(f"{summary['gpu']}, {nbytes / 2**30:.1f} GiB")
    for r in sorted(rows, key=lambda r: -r["tb_s"])[:8] + rows[:2]:
        print(f"  {r['what']:<40} {r['seconds'] * 1e3:8.3f} ms {r['tb_s']:6.3f} TB/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
