"""Where batch-1 tree attention spends its time (its latency-bound shapes), one GPU process.

Batch 1, context 4096, 16 and 64 tree tokens at Llama-3.1-8B's attention shape (bf16). Timing
is bench_kernels.gpu_us: CUDA-graph replays with a read-only 128 MiB L2 flush before each call,
flush-only graph subtracted. Measured beside the kernel, in the same process:
- an empty Triton kernel (what one extra launch in a graph costs under this method);
- a Triton streaming read of the same K/V bytes at several program counts (what reading
  16.8 MB from a cold L2 can take on this card: the practical floor, vs bytes / copy bw);
- the merge kernel alone on the partials of the chosen split count;
- tree_attention over a sweep of tiles x split counts, with and without programmatic dependent
  launch (pdl).

    PYTHONPATH=$PWD:$PWD/benchmarks python benchmarks/probe_batch1.py --out $OUT/probe.json

Prints a short table last; the JSON holds every row.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import replace
from functools import partial
from typing import Any

import torch
import triton
import triton.language as tl
from bench_kernels import copy_bandwidth, gpu_us, log, rel_err

from spectune.kernels import (
    TreeAttentionConfig,
    make_tree_attention_inputs,
    reference_tree_attention,
    tree_attention,
)
from spectune.kernels.tree_attention import _merge_splits_kernel
from spectune.kernels.tree_attention_config import default_config

HQ, HKV, DIM = 32, 8, 128


@triton.jit
def _empty_kernel(X):
    pass


@triton.jit
def _read_kernel(X, OUT, n_per_prog, BLOCK: tl.constexpr):
    """Each program sums its contiguous n_per_prog elements (a pure HBM read)."""
    pid = tl.program_id(0)
    base = X + pid.to(tl.int64) * n_per_prog
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_per_prog, BLOCK):
        acc += tl.load(base + start + tl.arange(0, BLOCK)).to(tl.float32)
    tl.store(OUT + pid, tl.sum(acc, 0))


def read_us(buf: torch.Tensor, programs: int, block: int, warps: int) -> float | None:
    n = buf.numel() // programs // block * block
    out = torch.empty(programs, device=buf.device, dtype=torch.float32)
    return gpu_us(
        lambda: _read_kernel[(programs,)](buf, out, n, BLOCK=block, num_warps=warps, num_stages=4)
    )


def probe(n: int, bw: float) -> tuple[dict[str, Any], tuple[Any, ...]]:
    """Every measurement of one tree size; returns (JSON row, summary line data)."""
    inp = make_tree_attention_inputs([4096], [n], HQ, HKV, DIM, torch.bfloat16, "cuda", seed=n)
    kv = torch.cat([inp.k_cache.reshape(-1), inp.v_cache.reshape(-1)])
    reads = []
    for programs, block, warps in (
        (132, 4096, 4),
        (264, 4096, 4),
        (528, 2048, 4),
        (1056, 1024, 4),
        (264, 8192, 8),
    ):
        t = read_us(kv, programs, block, warps)
        reads.append({"programs": programs, "block": block, "warps": warps, "us": t})
    best_read = min(r["us"] for r in reads if r["us"] is not None)
    log(f"N={n}: KV {inp.kv_bytes / 1e6:.1f} MB, floor {inp.kv_bytes / bw * 1e6:.2f} us, "
        f"best streaming read {best_read:.2f} us")  # fmt: skip
    ref = reference_tree_attention(*[t.float() if t.is_floating_point() else t for t in inp.args()])
    rows = []
    tiles = (
        [(64, 64, 4, 3), (64, 64, 4, 4), (64, 128, 4, 3), (64, 64, 8, 3), (64, 128, 8, 3),
         (32, 64, 4, 3)]
        if n == 16
        else [(64, 64, 4, 3), (64, 128, 4, 3), (128, 64, 8, 3), (64, 64, 8, 3), (128, 128, 8, 2)]
    )  # fmt: skip
    split_counts = (None, 4, 6, 8, 10, 12, 16, 24, 32) if n == 16 else (None, 2, 3, 4, 6, 8, 12)
    variants = {  # name -> config switches
        "sep": {},
        "sep+pdl": {"pdl": True},
        "sep+pdl+half": {"pdl": True, "half_partials": True},
        "fused": {"fuse_merge": True},
        "fused+half": {"fuse_merge": True, "half_partials": True},
    }
    for bm, bn, w, st in tiles:
        for splits in split_counts:
            for name, switches in variants.items():
                cfg = TreeAttentionConfig(
                    block_m=bm, block_n=bn, num_warps=w, num_stages=st, **switches
                )

                def fn(cfg: TreeAttentionConfig = cfg, s: int | None = splits) -> Any:
                    return tree_attention(
                        *inp.args(), max_q_len=n, max_kv_len=4096 + n, config=cfg,
                        num_splits=s,
                    )  # fmt: skip

                key = {"cfg": [bm, bn, w, st], "splits": splits, "variant": name}
                try:
                    err = rel_err(fn(), ref)
                    t = gpu_us(fn)
                except Exception as exc:  # a tile that does not compile
                    rows.append({**key, "error": repr(exc)[:200]})
                    continue
                rows.append({**key, "us": t, "rel_err": err})
    ok = sorted((r for r in rows if r.get("us") is not None), key=lambda r: r["us"])
    best = ok[0]
    # the merge alone on partials of the best split count
    s = best["splits"] or 32
    total = n * HQ
    o_part = torch.randn((s, total, DIM), device="cuda")
    lse = torch.randn((s, total), device="cuda")
    out = torch.empty((n, HQ, DIM), device="cuda", dtype=torch.bfloat16)
    bs = triton.next_power_of_2(s)
    merge = gpu_us(
        lambda: _merge_splits_kernel[(total,)](
            o_part, lse, out, lse, s, HQ, o_part.stride(0), lse.stride(0), out.stride(0),
            out.stride(1), HEAD_DIM=DIM, BLOCK_D=DIM, BLOCK_S=bs, PDL=False, STAMP=False,
            num_warps=max(1, min(4, bs * DIM // 1024)),
        )
    )  # fmt: skip
    row = (
        {"tree_tokens": n, "kv_bytes": inp.kv_bytes, "floor_us": inp.kv_bytes / bw * 1e6,
         "reads": reads, "merge_alone_us": merge, "configs": rows}
    )  # fmt: skip
    dflt = next(r for r in rows if r["cfg"] == list(tiles[0]) and r["splits"] is None
                and r["variant"] == "sep")  # fmt: skip
    for name in variants:
        mine = [r for r in ok if r["variant"] == name]
        if mine:
            log(f"N={n}: best {name}: {mine[0]['cfg']} splits={mine[0]['splits']} "
                f"{mine[0]['us']:.2f} us")  # fmt: skip
    return row, (n, inp.kv_bytes / bw * 1e6, best_read, merge, dflt.get("us"), ok[:6])


@triton.jit
def _marker_kernel(T):
    """Stores globaltimer: the timeline's zero, launched right before the measured call."""
    tl.store(T, tl.extra.cuda.globaltimer())


def timeline(fn: Any) -> dict[str, Any]:
    """Where one call's time goes, from globaltimer stamps inside its kernels (ns -> us).

    One CUDA graph of [read-only L2 flush, marker kernel, fn(stamps)] is replayed 5 times; the
    phases are medians over programs of the last replay, relative to the marker."""
    flush_src = torch.ones(32 << 20, dtype=torch.float32, device="cuda")
    flush_dst = torch.empty((), dtype=torch.float32, device="cuda")
    mark = torch.zeros(1, dtype=torch.int64, device="cuda")
    stamps: list[torch.Tensor] = []
    fn(stamps)  # compile outside the capture
    torch.cuda.synchronize()
    stamps.clear()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch.amax(flush_src, dim=0, out=flush_dst)
        _marker_kernel[(1,)](mark)
        fn(stamps)
    out: dict[str, list[float]] = {}
    for _ in range(5):
        g.replay()
        torch.cuda.synchronize()
        t0 = mark.item()
        a = stamps[0].double().cpu()
        a = a[a[:, 0] > 0]  # programs that ran (early-exit m-blocks stamp only their entry)
        rel = (a[:, :5] - t0) / 1e3
        full = a[:, 4] > 0
        row = {
            "programs": float(len(a)),
            "first_entry": float(rel[:, 0].min()),
            "median_entry": float(rel[:, 0].median()),
            "last_entry": float(rel[:, 0].max()),
            "wait_meta_q": float((rel[full, 1] - rel[full, 0]).median()),
            "prefix_loop": float((rel[full, 2] - rel[full, 1]).median()),
            "prefix_loop_max": float((rel[full, 2] - rel[full, 1]).max()),
            "tree": float((rel[full, 3] - rel[full, 2]).max()),
            "epilogue": float((rel[full, 4] - rel[full, 3]).median()),
            "median_end": float(rel[full, 4].median()),
            "last_end": float(rel[full, 4].max()),
            "distinct_sms": float(len(set(a[:, 7].tolist()))),
        }
        if len(stamps) > 1:
            m = (stamps[1].double().cpu()[:, :3] - t0) / 1e3
            row.update(
                merge_first_entry=float(m[:, 0].min()),
                merge_wait_released=float(m[:, 1].min()),
                merge_median_end=float(m[:, 2].median()),
                merge_last_end=float(m[:, 2].max()),
            )
        for k, v in row.items():
            out.setdefault(k, []).append(v)
    del g
    res: dict[str, Any] = {k: sorted(v)[len(v) // 2] for k, v in out.items()}
    # the last replay's programs: [entry, after meta + Q, after prefix, after tree, end] us and
    # the SM id; merge programs: [entry, after the wait, end] us and the SM id
    res["raw"] = [
        [round(float(x), 2) for x in r] + [int(sm)] for r, sm in zip(rel, a[:, 7], strict=True)
    ]
    if len(stamps) > 1:
        mm = stamps[1].double().cpu()
        res["merge_raw"] = [
            [round(float(x), 2) for x in (r[:3] - t0) / 1e3] + [int(r[7])] for r in mm
        ]
    return res


def _variant_call(
    inp: Any, n: int, cfg: Any, sp: int | None, stamps: list[torch.Tensor] | None = None
) -> torch.Tensor:
    return tree_attention(
        *inp.args(), max_q_len=n, max_kv_len=4096 + n, config=cfg, num_splits=sp, stamps=stamps
    )


def timelines(bw: float) -> list[dict[str, Any]]:
    """Timeline and gpu_us of the default config and variants at batch 1, ctx 4096."""
    rows = []
    for n in (16, 64):
        inp = make_tree_attention_inputs([4096], [n], HQ, HKV, DIM, torch.bfloat16, "cuda", seed=n)
        ref = reference_tree_attention(
            *[t.float() if t.is_floating_point() else t for t in inp.args()]
        )
        base = default_config(HQ // HKV * n, torch.device("cuda"), HKV)
        variants: list[tuple[str, TreeAttentionConfig, int | None]] = [
            ("default", base, None),
            ("default, other partials", replace(base, half_partials=not base.half_partials), None),
            ("default, no pdl", replace(base, pdl=False), None),
            ("default, no tree split", replace(base, tree_split=False), None),
        ]
        for sp in (6, 7, 8, 10, 12, 13, 14, 15, 16):
            variants.append((f"splits={sp}", base, sp))
        for name, cfg, sp in variants:
            fn = partial(_variant_call, inp, n, cfg, sp)

            try:
                err = rel_err(fn(), ref)
                t = gpu_us(fn)
                tl_row = timeline(fn)
            except Exception as exc:
                rows.append({"tree_tokens": n, "variant": name, "error": repr(exc)[:300]})
                log(f"N={n} {name}: {exc!r}"[:300])
                continue
            rows.append({"tree_tokens": n, "variant": name, "us": t, "rel_err": err, **tl_row})
            log(f"N={n} {name}: {t:.2f} us, err {err:.1e}, timeline {tl_row}")
    return rows


def _default_call(inp: Any, max_q: int, max_kv: int) -> torch.Tensor:
    return tree_attention(*inp.args(), max_q_len=max_q, max_kv_len=max_kv)


def defaults(bw: float) -> list[dict[str, Any]]:
    """The default config (no sweep) at bench_kernels' 12 shapes, beside the default times
    committed in benchmarks/results/kernels_h200.json."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "results", "kernels_h200.json")) as f:
        committed = {(r["batch"], r["ctx"], r["tree_tokens"]): r for r in json.load(f)["attention"]}
    rows = []
    for b, c, n in [(b, c, n) for b in (1, 8, 32) for c in (4096, 32768) for n in (16, 64)]:
        inp = make_tree_attention_inputs([c] * b, [n] * b, HQ, HKV, DIM, torch.bfloat16, "cuda")
        t = gpu_us(partial(_default_call, inp, n, c + n))
        old = committed.get((b, c, n), {})
        goal = (
            inp.kv_bytes / bw / 0.7 * 1e6 if inp.kv_bytes >= 128e6 else inp.kv_bytes / bw * 1e6 + 5
        )
        rows.append({"batch": b, "ctx": c, "tree_tokens": n, "default_us": t,
                     "committed_default_us": old.get("ours_default_us"), "goal_us": goal,
                     "bw_frac": inp.kv_bytes / (t * 1e-6) / bw if t else None})  # fmt: skip
        del inp
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "probe.json"))
    ap.add_argument(
        "--defaults", action="store_true", help="only time the default config at the 12 shapes"
    )
    ap.add_argument(
        "--timeline", action="store_true", help="in-kernel timelines of the batch-1 variants"
    )
    args = ap.parse_args()
    card = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    if args.timeline:
        rows = timelines(bw)
        with open(args.out + ".tmp", "w") as f:
            json.dump({"card": card, "copy_bytes_per_s": bw, "timeline": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
        keys = ("us", "first_entry", "wait_meta_q", "prefix_loop", "prefix_loop_max", "tree",
                "epilogue", "last_end", "merge_wait_released", "merge_last_end")  # fmt: skip
        print(f"{card}: batch 1, ctx 4096; gpu_us and timeline (us from the marker kernel)")
        print("N   variant                    " + " ".join(f"{k[:10]:>10}" for k in keys))
        for r in rows:
            vals = " ".join(
                f"{r[k]:10.2f}" if isinstance(r.get(k), float) else f"{'-':>10}" for k in keys
            )
            print(f"{r['tree_tokens']:<3} {r['variant']:<26} {vals}")
        return
    if args.defaults:
        rows = defaults(bw)
        with open(args.out + ".tmp", "w") as f:
            json.dump({"card": card, "copy_bytes_per_s": bw, "defaults": rows}, f, indent=1)
        os.replace(args.out + ".tmp", args.out)
        print(f"{card}: default config (us), committed default, goal, % copy bw")
        for r in rows:
            print(f"B={r['batch']:<3} ctx={r['ctx']:<6} N={r['tree_tokens']:<3} "
                  f"{r['default_us']:8.1f} {r['committed_default_us'] or float('nan'):8.1f} "
                  f"{r['goal_us']:8.1f} {100 * (r['bw_frac'] or 0):5.0f}%")  # fmt: skip
        return
    log(f"{card}: copy {bw / 1e12:.2f} TB/s")
    doc: dict[str, Any] = {"card": card, "copy_bytes_per_s": bw, "rows": []}
    x = torch.zeros(1, device="cuda")
    doc["empty_kernel_us"] = gpu_us(lambda: _empty_kernel[(1,)](x))
    doc["empty_kernel_132_us"] = gpu_us(lambda: _empty_kernel[(132,)](x))
    log(f"empty kernel {doc['empty_kernel_us']:.2f} us")
    summary = []
    for n in (16, 64):
        row, line = probe(n, bw)
        doc["rows"].append(row)
        summary.append(line)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out + ".tmp", "w") as f:
        json.dump(doc, f, indent=1)
    os.replace(args.out + ".tmp", args.out)
    print(f"\n{card}; empty kernel {doc['empty_kernel_us']:.2f} us (132 programs "
          f"{doc['empty_kernel_132_us']:.2f})")  # fmt: skip
    for n, floor, rd, merge, d, top in summary:
        print(f"N={n}: floor {floor:.2f} us, streaming read {rd:.2f} us, merge alone "
              f"{merge:.2f} us, first tile default splits {d}")  # fmt: skip
        for r in top:
            print(f"   {r['cfg']} splits={r['splits']} {r['variant']}: {r['us']:.2f} us "
                  f"(err {r['rel_err']:.1e})")  # fmt: skip


if __name__ == "__main__":
    main()
