"""Feasibility probe for the batch-1 tree-attention goal: a CUDA prototype that reduces the KV splits
through a thread-block cluster's distributed shared memory (benchmarks/cuda/
tree_attention_cluster.cu: one launch, no partials in HBM, no merge kernel), timed beside the
Triton kernel's default in the same process with the same method (bench_kernels.gpu_us: graph
replays after a read-only 128 MiB L2 flush).

Batch 1, Llama-3.1-8B attention (32 q heads, 8 KV heads, d 128, bf16), ctx 4096 and 32768,
16 tree tokens (plus 5 and 1 for correctness). Builds the extension with nvcc for sm_90a
(needs a Hopper GPU), checks it against the fp32 reference, prints a short table last and writes
the rows to --out.

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/probe_cluster.py --out $OUT/cluster.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
from functools import partial
from typing import Any

import torch
from bench_kernels import copy_bandwidth, gpu_us, log, rel_err
from torch.utils.cpp_extension import load

from spectune.kernels import make_tree_attention_inputs, reference_tree_attention, tree_attention

HQ, HKV, DIM = 32, 8, 128
# (splits = cluster size, K/V ring stages): 4 stages take 165 KB of shared memory (one CTA per
# SM), 2 stages 96 KB (two per SM)
VARIANTS = ((16, 4), (16, 2), (8, 4), (8, 2))
LOG2E = 1.4426950408889634


def build() -> Any:
    here = os.path.dirname(os.path.abspath(__file__))
    return load(
        name="tree_attention_cluster",
        sources=[os.path.join(here, "cuda", "tree_attention_cluster.cu")],
        extra_cuda_cflags=[
            "-gencode=arch=compute_90a,code=sm_90a",
            "-O3",
            "--use_fast_math",
            "-lineinfo",
            "-Xptxas=-v",
        ],
        verbose=False,
    )


def _triton_call(inp: Any, n: int, ctx: int) -> torch.Tensor:
    return tree_attention(*inp.args(), max_q_len=n, max_kv_len=ctx + n)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "cluster.json"))
    args = ap.parse_args()
    log("building the extension (nvcc, sm_90a)")
    ext = build()
    card = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    clusters = {f"{s}x{st}": ext.max_active_clusters(s, st, HKV) for s, st in VARIANTS}
    log(f"resident clusters (cudaOccupancyMaxActiveClusters): {clusters}")
    scale = LOG2E / math.sqrt(DIM)
    for ctx, n in ((4096, 16), (4096, 5), (4096, 1), (1000, 16), (32768, 16)):
        inp = make_tree_attention_inputs([ctx], [n], HQ, HKV, DIM, torch.bfloat16, "cuda", seed=n)
        ref = reference_tree_attention(
            *[t.float() if t.is_floating_point() else t for t in inp.args()]
        )
        mask = inp.tree_mask[:, 0].contiguous()
        k, v = inp.k_cache.contiguous(), inp.v_cache.contiguous()
        floor = inp.kv_bytes / bw * 1e6
        row: dict[str, Any] = {"ctx": ctx, "tree_tokens": n, "floor_us": floor}
        for splits, stages in VARIANTS:
            key = f"cluster{splits}x{stages}"
            fn = partial(ext.tree_attention_cluster, inp.q, k, v, mask, ctx, splits, stages, scale)
            try:
                err = rel_err(fn(), ref)
                t = gpu_us(fn) if n == 16 and ctx in (4096, 32768) else None
            except Exception as exc:  # a launch the card refuses (cluster size, smem)
                row[key] = {"error": repr(exc)[:300]}
                log(f"ctx {ctx} N {n} {key}: {exc!r}"[:300])
                continue
            row[key] = {"us": t, "rel_err": err}
            log(f"ctx {ctx} N {n} {key}: err {err:.2e}, {t} us")
        triton_fn = partial(_triton_call, inp, n, ctx)
        row["triton"] = {
            "us": gpu_us(triton_fn) if n == 16 and ctx in (4096, 32768) else None,
            "rel_err": rel_err(triton_fn(), ref),
        }
        rows.append(row)
    with open(args.out + ".tmp", "w") as f:
        json.dump(
            {"card": card, "copy_bytes_per_s": bw, "active_clusters": clusters, "rows": rows},
            f,
            indent=1,
        )
    os.replace(args.out + ".tmp", args.out)
    print(f"{card}: batch 1, GPU us (rel err vs fp32); goal at ctx 4096 = floor + 5 us")
    print(f"resident clusters of 8 KV heads' launch: {clusters}")
    for r in rows:
        cells = []
        for key in [f"cluster{s}x{st}" for s, st in VARIANTS] + ["triton"]:
            c = r.get(key, {})
            if "error" in c:
                cells.append(f"{key} error")
            else:
                us = f"{c['us']:.1f}" if c.get("us") is not None else "-"
                cells.append(f"{key} {us} ({c.get('rel_err', float('nan')):.1e})")
        print(
            f"ctx={r['ctx']:<6} N={r['tree_tokens']:<3} floor {r['floor_us']:.1f}  "
            + "  ".join(cells)
        )


if __name__ == "__main__":
    main()
