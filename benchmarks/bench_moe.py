"""Verify-step latency of Qwen3-30B-A3B at real shape (random bf16 weights, ~61 GB) on one GPU,
measured vs the cost model, and the fused MoE kernel vs the torch expert loop.

    PYTHONUNBUFFERED=1 PYTHONPATH=. python benchmarks/bench_moe.py   # writes $OUT/bench_moe.json

One verify forward = embedding, 48 x (q|k|v, RoPE + KV store, tree attention, o, add+norm,
router, top-k, expert alignment, gate_up+SiLU, down, combine+add+norm), LM head on every token,
argmax; captured in a CUDA graph and replayed (median of --reps, like kernels.timing.graph_time)
over batch x tree tokens x context. Predictions: spectune's CostModel.verify_time for this GPU's
HardwareSpec, uncalibrated, and (on an H200) with each measurements/h200*/calibration-h200.json.
Where the KV cache of every layer does not fit beside the weights (an H100 at batch 64 x 4096),
layers share physical KV slices (AliasedKVCache; timing-neutral, see there) and rows say so.
The run stops starting new shapes once --budget-s is spent. Prints tables, then one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from spectune.executor.moe import (
    MoEDecoder,
    MoELayerWeights,
    moe_config,
    moe_ffn_roofline,
    moe_floor_bytes,
    moe_rows,
    moe_weight_shapes,
    tune_moe,
)
from spectune.kernels.fused_moe import (
    moe_align,
    moe_combine,
    moe_expert_rows,
    reference_moe,
    route_topk,
)
from spectune.kernels.gemm import autotune, linear, set_plan
from spectune.kernels.timing import PhaseTimer, graph_time
from spectune.kernels.tree_attention_plan import TreeAttentionPlan, tune_tree_attention
from spectune.planner.costmodel import CostModel
from spectune.specs import hardware_preset, load_calibration, load_model, write_json_atomic
from spectune.validate.measure import gpu_hardware_name

ROOT = Path(__file__).resolve().parent.parent
CALIBRATIONS = sorted(ROOT.glob("measurements/h200*/calibration-h200.json"))
RESERVE_BYTES = 5 << 30  # activations (T=4096: logits 1.2 GB), graph pools, tuning buffers


def _ints(s: str) -> list[int]:
    return [int(v) for v in s.split(",") if v]


def _predictors(hw_name: str, spec: Any) -> dict[str, CostModel]:
    """'preset' (public figures) and one per calibration fitted on this GPU kind."""
    hw = hardware_preset(hw_name)
    out = {"preset": CostModel(hw, spec)}
    for path in CALIBRATIONS:
        cal = load_calibration(path)
        if cal.hardware in ("", hw_name):
            out[f"calibrated:{path.parent.name}"] = CostModel(hw, spec, calibration=cal)
    return out


def _verify_seconds(
    m: MoEDecoder, cache: Any, batch: int, tokens: int, context: int, reps: int, kern: bool
) -> float:
    """Median seconds of one verify forward (+ LM head + argmax) replayed from a CUDA graph."""
    dev = m.device
    tok = torch.randint(0, m.spec.vocab, (batch, tokens), device=dev)
    pos = context + torch.arange(tokens, device=dev).expand(batch, tokens)
    mask = torch.ones((tokens, tokens), dtype=torch.bool, device=dev).tril()
    mask = mask.expand(batch, tokens, tokens).contiguous()
    plan = TreeAttentionPlan(batch, tokens, context, cache.capacity, m.heads, dev) if kern else None
    if plan is not None:
        plan.set_mask(mask)
    out = torch.zeros((batch, tokens), dtype=torch.int64, device=dev)

    def fwd() -> None:
        h, _ = m.forward(tok, pos, cache, context, mask, plan=plan)
        out.copy_(m.lm_head(h).argmax(dim=-1))

    return graph_time(fwd, dev, reps)


def _part_seconds(m: MoEDecoder, layers: list[MoELayerWeights], x: torch.Tensor) -> dict:
    """Seconds per layer of each step of the fused MoE FFN (graph replays over `layers`)."""
    spec, dev, k = m.spec, m.device, m.spec.experts_topk
    cfg = moe_config(spec, x.shape[0])
    routed = [route_topk(linear(x, w.router), k) for w in layers]
    aligns = [moe_align(ids, spec.experts, cfg.block_m) for ids, _ in routed]
    rows = [
        moe_expert_rows(x, w.w_gate_up, w.w_down, ids, wt, al, cfg)
        for w, (ids, wt), al in zip(layers, routed, aligns, strict=True)
    ]
    res = torch.zeros_like(x)
    steps = {
        "router+topk": lambda: [route_topk(linear(x, w.router), k) for w in layers],
        "align": lambda: [moe_align(ids, spec.experts, cfg.block_m) for ids, _ in routed],
        "gate_up+down": lambda: [
            moe_expert_rows(x, w.w_gate_up, w.w_down, ids, wt, al, cfg)
            for w, (ids, wt), al in zip(layers, routed, aligns, strict=True)
        ],
        "combine+norm": lambda: [
            moe_combine(r.view(x.shape[0], k, -1), res, w.norm_mlp)
            for w, r in zip(layers, rows, strict=True)
        ],
    }
    return {name: graph_time(fn, dev, 10) / len(layers) for name, fn in steps.items()}


def _kernel_vs_reference(m: MoEDecoder, tokens: list[int], deadline: float) -> list[dict]:
    """The MoE FFN (router to combine) by the fused kernels (graph replays over 4 layers in
    turn) vs reference_moe (fp32 expert loop, eager, CUDA events) at each T."""
    spec, dev = m.spec, m.device
    layers = [w for w in m.layers if isinstance(w, MoELayerWeights)][:4]
    rows: list[dict] = []
    for t in tokens:
        if time.time() > deadline:
            rows.append({"tokens": t, "skipped": "time budget"})
            continue
        x = torch.randn((t, spec.hidden), device=dev).to(m.dtype)
        res = torch.zeros_like(x)

        def fused(x: torch.Tensor = x, res: torch.Tensor = res) -> None:
            for w in layers:
                moe_combine(moe_rows(x, w, spec), res, w.norm_mlp)

        fused_s = graph_time(fused, dev, 10) / len(layers)
        parts = _part_seconds(m, layers, x)
        w = layers[0]
        ids, weights = route_topk(linear(x, w.router), spec.experts_topk)
        ref_out = reference_moe(x, w.w_gate_up, w.w_down, ids, weights)
        got = moe_combine(moe_rows(x, w, spec)).float()
        rel = float((got - ref_out).abs().max() / ref_out.abs().max())
        timer = PhaseTimer(("reference",), 3, dev)  # eager: the loop syncs with the host

        def ref(args: tuple[torch.Tensor, ...] = (x, w.w_gate_up, w.w_down, ids, weights)) -> None:
            reference_moe(*args)

        timer.run([ref])
        ref_s = timer.medians_s()["reference"]
        touched = int(torch.unique(ids).numel())
        roof = moe_ffn_roofline(spec, t)
        real_bytes = (
            roof["bytes"] + (touched - roof["experts"]) * 3 * spec.hidden * spec.expert_ffn * 2
        )
        rows.append(
            {
                "tokens": t,
                "experts_touched": touched,
                "experts_expected": roof["experts"],
                "fused_s": fused_s,
                "parts_s": parts,
                "reference_s": ref_s,
                "speedup": ref_s / fused_s,
                "fused_gb_s": real_bytes / fused_s / 1e9,
                "fused_tflop_s": roof["flops"] / fused_s / 1e12,
                "rel_err_vs_fp32": rel,
            }
        )
    return rows


def _tensors(m: MoEDecoder) -> list[torch.Tensor]:
    """Every weight tensor once (a tied LM head is the embedding)."""
    ts = [m.embed, m.norm_final, *(v for w in m.layers for v in vars(w).values())]
    if m.lm is not m.embed:
        ts.append(m.lm)
    return ts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default=os.environ.get("OUT", "out"))
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--hardware", default=None, help="HardwareSpec preset (default: from GPU)")
    ap.add_argument("--batches", default="1,4,16,64")
    ap.add_argument("--tokens", default="1,16,64")
    ap.add_argument("--contexts", default="512,4096")
    ap.add_argument("--kernel-tokens", default="1,16,64,256,1024,4096")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--budget-s", type=float, default=180.0, help="no new grid shape after this")
    ap.add_argument(
        "--routing",
        default="independent",
        choices=("independent", "hidden"),
        help="independent: each token picks k experts uniformly (the cost model's expert union; "
        "default); hidden: the router over random-weight hidden states (tokens route alike)",
    )
    ap.add_argument("--no-tune", action="store_true", help="skip GEMM/attention/MoE tuning")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run (use a tiny --model JSON)")
    args = ap.parse_args()
    t0 = time.time()
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out_file = out_dir / "bench_moe.json"
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    gpu = torch.cuda.get_device_name(dev) if cuda else "cpu"
    hw_name = args.hardware or gpu_hardware_name(gpu)
    hw = hardware_preset(hw_name)
    spec = load_model(args.model)
    batches, tokens, contexts = _ints(args.batches), _ints(args.tokens), _ints(args.contexts)
    doc: dict[str, Any] = {
        "gpu": gpu, "hardware": hw_name, "model": spec.name, "routing": args.routing, "rows": [],
    }  # fmt: skip

    dtype = torch.bfloat16 if cuda else torch.float32
    m = MoEDecoder(spec, dev, dtype, max_pos=max(contexts) + max(tokens) + 64, routing=args.routing)
    doc["weights_gb"] = sum(t.numel() * t.element_size() for t in _tensors(m)) / 1e9
    doc["build_s"] = time.time() - t0
    print(
        f"{gpu} ({hw_name}): {spec.name} weights {doc['weights_gb']:.1f} GB in {doc['build_s']:.0f} s"
    )

    kern = cuda
    if not args.no_tune and cuda:
        plan, doc["gemm_tuning"] = autotune(moe_weight_shapes(spec), dev, buckets=(1, 16, 64, 256))
        set_plan(plan)
        doc["gemm_plan"] = plan.to_dict()
        t_all = sorted({b * n for b in batches for n in tokens} | set(_ints(args.kernel_tokens)))
        doc["moe_tuning"] = tune_moe(m, t_all)
        print(f"tuned GEMMs and MoE tiles at {time.time() - t0:.0f} s")

    # KV cache: every layer where it fits, else physical layers shared (AliasedKVCache)
    cap = max(contexts) + max(tokens) + 8
    per_layer = 2 * max(batches) * cap * spec.kv_heads * spec.head_dim * spec.kv_dtype_bytes
    if cuda:
        torch.cuda.empty_cache()  # tuning buffers back to the driver before measuring free
    free = torch.cuda.mem_get_info(dev)[0] - RESERVE_BYTES if cuda else spec.layers * per_layer
    kv_layers = int(max(1, min(spec.layers, free // per_layer)))
    cache = m.new_cache(max(batches), cap, kv_layers=kv_layers)
    doc["kv_layers"] = kv_layers
    print(f"KV cache: {kv_layers}/{spec.layers} physical layers, capacity {cap}")

    preds = _predictors(hw_name, spec)
    deadline = t0 + args.budget_s
    hdr = f"{'B':>3} {'N':>3} {'C':>5} {'meas ms':>8} {'floor GB/s':>10} " + " ".join(
        f"{k[:18]:>18}" for k in preds
    )
    print(hdr)
    for context in contexts:
        for batch in batches:
            for n in tokens:
                row: dict[str, Any] = {"batch": batch, "tokens": n, "context": context}
                if time.time() > deadline:
                    row["skipped"] = "time budget"
                    doc["rows"].append(row)
                    continue
                if kern and not args.no_tune:
                    tune_tree_attention(batch, n, context, cache.layers(batch), spec.heads)
                sec = _verify_seconds(m, cache, batch, n, context, args.reps, kern)
                floor = moe_floor_bytes(spec, batch, n, context)
                row.update(
                    measured_s=sec,
                    floor_bytes=floor,
                    floor_gb_s=floor / sec / 1e9,
                    floor_fraction=floor / sec / hw.hbm_bytes_per_s,
                    kv_aliased=kv_layers < spec.layers,
                    predicted_s={
                        k: float(p.verify_time(batch, n, context)) for k, p in preds.items()
                    },
                    breakdown_ms={
                        k: {
                            c: float(v) * 1e3
                            for c, v in p.verify_breakdown(batch, n, context).items()
                        }
                        for k, p in preds.items()
                    },
                )
                doc["rows"].append(row)
                if cuda:
                    torch.cuda.empty_cache()
                print(
                    f"{batch:>3} {n:>3} {context:>5} {sec * 1e3:8.3f} {row['floor_gb_s']:10.0f} "
                    + " ".join(
                        f"{v * 1e3:9.3f} ({(v - sec) / sec:+5.0%})"
                        for v in row["predicted_s"].values()
                    ),
                    flush=True,
                )
                write_json_atomic(out_file, doc)
    done = [r for r in doc["rows"] if "measured_s" in r]
    doc["mape"] = (
        {
            k: statistics.mean(
                abs(r["predicted_s"][k] - r["measured_s"]) / r["measured_s"] for r in done
            )
            for k in preds
        }
        if done
        else {}
    )
    print("MAPE: " + ", ".join(f"{k} {v:.1%}" for k, v in doc["mape"].items()))

    del cache
    if cuda:
        torch.cuda.empty_cache()
    doc["kernel_vs_reference"] = _kernel_vs_reference(
        m, _ints(args.kernel_tokens), t0 + args.budget_s + 30
    )
    print(
        f"{'T':>5} {'touched':>7} {'fused ms':>9} {'torch ms':>9} {'x':>6} {'GB/s':>6} {'rel err':>8}"
    )
    for r in doc["kernel_vs_reference"]:
        if "fused_s" in r:
            print(
                f"{r['tokens']:>5} {r['experts_touched']:>7} {r['fused_s'] * 1e3:9.3f} "
                f"{r['reference_s'] * 1e3:9.3f} {r['speedup']:6.1f} {r['fused_gb_s']:6.0f} "
                f"{r['rel_err_vs_fp32']:8.1e}"
            )
    doc["elapsed_s"] = time.time() - t0
    write_json_atomic(out_file, doc)
    print(
        json.dumps(
            {
                "out": str(out_file),
                "gpu": gpu,
                "mape": doc["mape"],
                "kv_layers": kv_layers,
                "rows": len(done),
                "elapsed_s": round(doc["elapsed_s"], 1),
            }
        )
    )


if __name__ == "__main__":
    main()
