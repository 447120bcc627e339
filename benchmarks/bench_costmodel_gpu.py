"""Check the cost model against a real-shape Llama-3.1-8B forward pass on a CUDA GPU.

Times (1) micro-benchmarks the calibration fit reads (graph launch, copies, weight GEMMs,
attention) and (2) a plain-PyTorch real-shape Llama-3.1-8B forward (random bf16 weights, KV cache
of `--context` tokens, CUDA graph) for batch x tree-token shapes; then prints measured vs
predicted times with the default (public-figure) efficiencies and with the calibration fitted from
(1). The forward is a straightforward torch implementation, not a serving engine: it launches more
small kernels than SGLang/vLLM do and uses torch's SDPA for attention.

    python benchmarks/bench_costmodel_gpu.py [--out DIR]   # needs a CUDA GPU and ~55 GB free

Writes rows.json (micro-benchmark rows), calibration.json and forward.json into --out.
Last line: one JSON document.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from spectune.planner.costmodel import CostModel
from spectune.specs import hardware_preset, model_preset, write_json_atomic
from spectune.validate.microbench import invert_microbenchmarks

L2_FLUSH_BYTES = 256e6  # rotate buffers so one pass touches more than any GPU's L2 (50-96 MB)
DEV = "cuda"
BF16 = torch.bfloat16


def graph_seconds(fns: Sequence[Callable[[], object]], replays: int = 10) -> float:
    """Median seconds per call of the functions in `fns`, captured back to back in one graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns[:2]:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in fns:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(fns))
    del graph
    return statistics.median(times)


def copies_for(nbytes: float) -> int:
    return max(1, math.ceil(L2_FLUSH_BYTES / nbytes))


def micro_rows() -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    x = torch.zeros(16, device=DEV)
    rows.append({"kind": "launch", "seconds": graph_seconds([lambda: x.add_(1)] * 200)})
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(500):
        x.add_(1)
    torch.cuda.synchronize()
    rows.append({"kind": "eager_launch", "seconds": (time.perf_counter() - t0) / 500})

    for size in (2**20, 2**23, 2**26, 2**29):  # bytes of one buffer
        n = copies_for(size)
        src = [torch.empty(size // 2, dtype=BF16, device=DEV) for _ in range(n)]
        dst = [torch.empty_like(s) for s in src]
        fns = [partial(d.copy_, s) for s, d in zip(src, dst, strict=True)]
        rows.append({"kind": "copy", "bytes": 2 * size, "seconds": graph_seconds(fns)})
        del src, dst

    shapes = ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (128256, 4096))
    for n, k in shapes:
        ws = [
            torch.randn(n, k, dtype=BF16, device=DEV) * 0.02 for _ in range(copies_for(n * k * 2))
        ]
        for m in (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
            a = torch.randn(m, k, dtype=BF16, device=DEV)
            fns = [partial(F.linear, a, w) for w in ws]
            rows.append(
                {
                    "kind": "gemm",
                    "m": m,
                    "n": n,
                    "k": k,
                    "weight_bytes": 2,
                    "seconds": graph_seconds(fns),
                }
            )
        del ws

    ctx, kvh, hd, heads = 4096, 8, 128, 32
    for b in (1, 8, 64):
        for new in (1, 16, 64):
            kv_bytes = b * (ctx + new) * 2 * kvh * hd * 2
            caches = [
                (
                    torch.randn(b, kvh, ctx + new, hd, dtype=BF16, device=DEV),
                    torch.randn(b, kvh, ctx + new, hd, dtype=BF16, device=DEV),
                )
                for _ in range(copies_for(kv_bytes))
            ]
            q = torch.randn(b, heads, new, hd, dtype=BF16, device=DEV)
            fns = [
                partial(F.scaled_dot_product_attention, q, kc, vc, enable_gqa=True)
                for kc, vc in caches
            ]
            rows_x_keys = b * math.ceil(4 * new / 16) * 16 * (ctx + new)
            flops = 4 * hd * kvh * rows_x_keys
            rows.append(
                {
                    "kind": "attention",
                    "kv_bytes": kv_bytes,
                    "flops": flops,
                    "seconds": graph_seconds(fns),
                }
            )
            del caches
    return rows


class Llama:
    """Real-shape Llama-3.1-8B decoder with random weights and a preallocated KV cache."""

    def __init__(self, max_batch: int, max_len: int) -> None:
        m = model_preset("llama-3.1-8b")
        self.m = m
        h, f, kvw = m.hidden, m.ffn, m.kv_heads * m.head_dim

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, dtype=BF16, device=DEV) * 0.02

        self.layers = [
            {
                "qkv": w(h + 2 * kvw, h),
                "o": w(h, h),
                "gate_up": w(2 * f, h),
                "down": w(h, f),
                "n1": torch.ones(h, dtype=BF16, device=DEV),
                "n2": torch.ones(h, dtype=BF16, device=DEV),
                "k": torch.zeros(
                    max_batch, m.kv_heads, max_len, m.head_dim, dtype=BF16, device=DEV
                ),
                "v": torch.zeros(
                    max_batch, m.kv_heads, max_len, m.head_dim, dtype=BF16, device=DEV
                ),
            }
            for _ in range(m.layers)
        ]
        self.embed = w(m.vocab, h)
        self.lm = w(m.vocab, h)
        self.norm = torch.ones(h, dtype=BF16, device=DEV)

    def forward(self, ids: torch.Tensor, ctx: int) -> torch.Tensor:
        """ids: int64[B, n] new tokens over `ctx` cached ones; returns int64[B, n] argmax."""
        m = self.m
        b, n = ids.shape
        h, hd = m.hidden, m.head_dim
        x = F.embedding(ids.reshape(-1), self.embed)  # [B*n, h]
        for lyr in self.layers:
            y = F.rms_norm(x, (h,), lyr["n1"])
            qkv = F.linear(y, lyr["qkv"])
            q, k, v = qkv.split([h, m.kv_heads * hd, m.kv_heads * hd], dim=-1)
            q = q.view(b, n, m.heads, hd).transpose(1, 2)
            lyr["k"][:b, :, ctx : ctx + n] = k.view(b, n, m.kv_heads, hd).transpose(1, 2)
            lyr["v"][:b, :, ctx : ctx + n] = v.view(b, n, m.kv_heads, hd).transpose(1, 2)
            kc, vc = lyr["k"][:b, :, : ctx + n], lyr["v"][:b, :, : ctx + n]
            o = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
            x = x + F.linear(o.transpose(1, 2).reshape(b * n, h), lyr["o"])
            y = F.rms_norm(x, (h,), lyr["n2"])
            g, u = F.linear(y, lyr["gate_up"]).chunk(2, dim=-1)
            x = x + F.linear(F.silu(g) * u, lyr["down"])
        logits = F.linear(F.rms_norm(x, (h,), self.norm), self.lm).float()
        return logits.argmax(-1).view(b, n)


def forward_rows(ctx: int) -> list[dict[str, Any]]:
    batches, tokens = (1, 8, 64), (1, 16, 64)
    model = Llama(max(batches), ctx + max(tokens))
    out = []
    for b in batches:
        for n in tokens:
            ids = torch.randint(0, model.m.vocab, (b, n), device=DEV)
            s = graph_seconds([partial(model.forward, ids, ctx)], replays=5)
            out.append({"batch": b, "tokens": n, "context": ctx, "measured_s": s})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="bench_costmodel_gpu")
    parser.add_argument("--context", type=int, default=4096)
    args = parser.parse_args()
    out = Path(args.out)
    name = torch.cuda.get_device_name()
    gpu = "h200" if "H200" in name else "h100-sxm"
    hw = hardware_preset(gpu)

    rows = micro_rows()
    write_json_atomic(out / "rows.json", rows)
    cal = invert_microbenchmarks(rows, hw, source=f"bench_costmodel_gpu on {name}")
    cal.save(out / "calibration.json")
    fwd = forward_rows(args.context)

    target = model_preset("llama-3.1-8b")
    default = CostModel(hw, target)
    fitted = CostModel(hw, target, calibration=cal)
    b = np.array([r["batch"] for r in fwd])
    n = np.array([r["tokens"] for r in fwd])
    # the torch forward is eager PyTorch inside one graph: no engine bucket padding
    for r, p0, p1 in zip(
        fwd,
        default.verify_time(b, n, args.context),
        fitted.verify_time(b, n, args.context),
        strict=True,
    ):
        r["predicted_default_s"], r["predicted_fitted_s"] = float(p0), float(p1)
    write_json_atomic(out / "forward.json", fwd)

    print(f"GPU: {name} (priced as {gpu}); calibration: {cal.to_dict()}")
    print(
        f"{'batch':>5} {'tokens':>6} {'ctx':>5} {'measured ms':>12} {'default ms':>11} {'fitted ms':>10}"
    )
    for r in fwd:
        print(
            f"{r['batch']:>5} {r['tokens']:>6} {r['context']:>5} {r['measured_s'] * 1e3:>12.3f} "
            f"{r['predicted_default_s'] * 1e3:>11.3f} {r['predicted_fitted_s'] * 1e3:>10.3f}"
        )
    print(
        json.dumps(
            {"bench": "costmodel_gpu", "gpu": name, "forward": fwd, "calibration": cal.to_dict()}
        )
    )


if __name__ == "__main__":
    main()
