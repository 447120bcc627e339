"""Verify step at batch 1, 64 tree tokens, context 4096 (Llama-3.1-8B, real shape, random bf16
weights) against the HBM floor: the unfused layers (the executor's base path) and the fused
layers (spectune.kernels.gemm_fused) timed in one process, alternating, on the same model,
cache and tree.

    PYTHONPATH=$PWD python benchmarks/bench_verify_floor.py --out $OUT

The step is what Session.verify_time times: the target forward over one sequence of N chain
tokens through the tree-attention plan, the LM head on every token and the argmax, replayed as
one CUDA graph. Floor = bytes one forward must move (executor.model.floor_bytes: every layer
weight and the LM head once + the K/V prefix once) / measured copy bandwidth (executor.
calibrate.copy_bandwidth, read + write counted). Goal (issue 18): step <= 1.25 x floor.

Variants (all on the same Decoder; only `Decoder.fused` and the GEMM plan differ):
- base: layer_forward + add_rmsnorm, GEMMs by the split-K / cuBLAS plan autotuned at M = N
  (what bench_executor's floor check runs);
- fused: fused_layer_forward with fused_linear configs tuned here at M = N, no PDL;
- fused+pdl: the same with programmatic dependent launches (Hopper+);
- pf-o, pf-all: fused+pdl with weight rows pulled into L2 before each PDL wait (layer_variants).
Per-op breakdown: each op of a layer timed alone as a CUDA graph over all layers' weights
(so the weights stream from HBM), per layer; the step minus the sum of its parts is what
the kernel boundaries cost.

Writes --out/verify_floor.json (everything: tuning rows, per-variant rounds, per-op rows,
agreement of the variants' outputs with base). Prints a table, then one JSON line.
Runs on CPU too (a small --model, Triton interpreter) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from spectune.executor.calibrate import copy_bandwidth
from spectune.executor.model import Decoder, _attend, floor_bytes
from spectune.executor.session import weight_shapes
from spectune.kernels.elementwise import add_rmsnorm
from spectune.kernels.gemm import autotune, linear, linear_gated, set_plan
from spectune.kernels.gemm_fused import (
    RopeStore,
    fused_linear,
)
from spectune.kernels.gemm_fused_config import (
    FusedLinearConfig,
    LayerGemmPlan,
    tune_fused_linear,
)
from spectune.kernels.rope import rope_tables
from spectune.kernels.timing import PhaseTimer, capture_graph, graph_time
from spectune.kernels.tree_attention import pdl_supported
from spectune.kernels.tree_attention_plan import TreeAttentionPlan, tune_tree_attention
from spectune.specs import ModelSpec, load_model, write_json_atomic

GOAL_RATIO = 1.25  # issue 18: verify B=1 N=64 ctx 4096 at <= 1.25x the HBM floor
L2_SAFE_BYTES = 256 << 20  # weight copies rotated per tuning call, so L2 never holds them
VARIANTS = ("base", "fused", "fused+pdl", "+rope", "pf-o", "pf-all", "pf-o+rope")
CPU_MAX_WEIGHT_BYTES = 1e9  # a CPU run (interpreter) is a check of the script, at small shapes
QUICK_SPLITS = (1, 2, 4)
QUICK_TILES = ((64, 128, 4, 4), (128, 64, 4, 4))


def log(msg: str) -> None:
    print(msg, flush=True)


# ---- fused GEMM tuning ---------------------------------------------------------------------------
ROPE_TILES = ((64, 128, 4, 4), (64, 64, 4, 4), (64, 128, 4, 3))  # block_n = D / 2 (Llama: 64)


def tune_layer_gemms(
    spec: ModelSpec, m: int, device: torch.device, dtype: torch.dtype, quick: bool, budget_s: float
) -> tuple[dict[str, FusedLinearConfig], dict[str, list[dict[str, object]]]]:
    """Tune fused_linear at M = m (weights rotated over copies, PDL where supported) for the
    layer's GEMMs: qkv (norm), qkv_rope (norm + RoPE/K-V store epilogue), o and down
    (residual), gate_up (norm + SwiGLU); each role within its share of budget_s (a tile
    started before the share ran out finishes). Returns {role: config} and the timing rows;
    on CPU default configs and no rows."""
    h, d = spec.hidden, spec.head_dim
    qkv_rows = (spec.heads + 2 * spec.kv_heads) * d
    roles = {  # role: (weight rows, K, norm prologue, epilogue)
        "qkv": (qkv_rows, spec.attn_in_width, True, "plain"),
        "qkv_rope": (qkv_rows, spec.attn_in_width, True, "rope"),
        "o": (h, spec.heads * d, False, "residual"),
        "gate_up": (2 * spec.ffn, h, True, "gated"),
        "down": (h, spec.ffn, False, "residual"),
    }
    if device.type != "cuda":
        return {role: FusedLinearConfig() for role in roles}, {}
    pdl = pdl_supported(device)
    chosen: dict[str, FusedLinearConfig] = {}
    rows: dict[str, list[dict[str, object]]] = {}
    for role, (n_rows, k, norm, epi) in roles.items():
        copies = max(1, -(-L2_SAFE_BYTES // (n_rows * k * 2)))
        ws = [
            torch.empty((n_rows, k), device=device, dtype=dtype).uniform_(-0.02, 0.02)
            for _ in range(copies)
        ]
        x = torch.empty((m, k), device=device, dtype=dtype).uniform_(-1, 1)
        g = torch.ones(k, device=device, dtype=dtype)
        res = torch.zeros((m, n_rows), device=device, dtype=dtype)
        store = None
        if epi == "rope":
            cos, sin = rope_tables(m + 8, d, 500000.0, device)
            kv = torch.zeros((2, 1, m + 8, spec.kv_heads, d), device=device, dtype=dtype)
            pos = torch.arange(m, device=device)
            store = RopeStore(pos, cos, sin, kv, 0, m, spec.heads, spec.kv_heads)

        def make(
            cfg: FusedLinearConfig,
            ws: list[torch.Tensor] = ws,
            x: torch.Tensor = x,
            g: torch.Tensor = g,
            res: torch.Tensor = res,
            norm: bool = norm,
            epi: str = epi,
            store: RopeStore | None = store,
        ) -> Callable[[], None]:
            def call() -> None:
                for w in ws:
                    fused_linear(
                        x, w, norm_weight=g if norm else None,
                        residual=res if epi == "residual" else None, gated=epi == "gated",
                        config=cfg, pdl=pdl, rope=store,
                    )  # fmt: skip

            return call

        t0 = time.time()
        kw: dict[str, object] = {"splits": QUICK_SPLITS, "tiles": QUICK_TILES} if quick else {}
        if epi == "rope":
            kw["tiles"] = ROPE_TILES[:2] if quick else ROPE_TILES
        deadline = time.monotonic() + budget_s / len(roles)
        best, r = tune_fused_linear(make, device, deadline_s=deadline, **kw)  # type: ignore[arg-type]
        timed = [row for row in r if "seconds" in row]
        for row in timed:
            row["seconds"] = float(row["seconds"]) / len(ws)  # type: ignore[arg-type]
            row["gb_s"] = n_rows * k * 2 / float(row["seconds"]) / 1e9  # type: ignore[arg-type]
        chosen[role] = best
        rows[role] = r
        fastest = min(timed, key=lambda row: float(row["seconds"]), default=None)  # type: ignore[arg-type]
        if fastest is None:
            log(f"  fused {role}: no config ran; using {best.name} ({r[:1]})")
        else:
            log(
                f"  fused {role:<8} {n_rows}x{k}: {best.name:<16} "
                f"{float(fastest['seconds']) * 1e6:7.1f} us {float(fastest['gb_s']):6.0f} GB/s "  # type: ignore[arg-type]
                f"({len(r)} configs, {time.time() - t0:.0f} s)"
            )
        del ws
    return chosen, rows


def layer_variants(
    tuned: dict[str, FusedLinearConfig], spec: ModelSpec, pdl: bool
) -> dict[str, LayerGemmPlan | None]:
    """The variants timed: base (None: the unfused path), fused without PDL, and where PDL is
    supported: fused+pdl; +rope (RoPE + K/V store in the q|k|v epilogue); pf-o (the o
    projection pulls its whole weight slice into L2 while attention runs, every GEMM streams
    evict-first); pf-all (as pf-o, and the other GEMMs pull their first two K blocks while
    the kernel before them drains); pf-o+rope."""
    q, o, gu, dn, qr = (tuned[r] for r in ("qkv", "o", "gate_up", "down", "qkv_rope"))
    out: dict[str, LayerGemmPlan | None] = {
        "base": None,
        "fused": LayerGemmPlan(q, o, gu, dn, pdl=False),
    }
    if not pdl:
        return out
    out["fused+pdl"] = LayerGemmPlan(q, o, gu, dn, pdl=True)
    out["+rope"] = LayerGemmPlan(qr, o, gu, dn, pdl=True, rope_in_qkv=True)
    ef = {"evict_first": True}
    o_all = replace(o, prefetch_k=spec.heads * spec.head_dim, **ef)
    out["pf-o"] = LayerGemmPlan(replace(q, **ef), o_all, replace(gu, **ef), replace(dn, **ef))
    out["pf-all"] = LayerGemmPlan(
        replace(q, prefetch_k=2 * q.block_k, **ef),
        o_all,
        replace(gu, prefetch_k=2 * gu.block_k, **ef),
        replace(dn, prefetch_k=2 * dn.block_k, **ef),
    )
    out["pf-o+rope"] = LayerGemmPlan(
        replace(qr, **ef), o_all, replace(gu, **ef), replace(dn, **ef), rope_in_qkv=True
    )
    return out


# ---- the verify step -------------------------------------------------------------------------------
class VerifyStep:
    """One verify forward (B = 1, N tokens, context C) + LM head + argmax, replayable."""

    def __init__(self, model: Decoder, tokens: int, context: int, device: torch.device):
        self.model, self.tokens, self.context = model, tokens, context
        self.cache = model.new_cache(1, context + tokens + 8)
        self.tok = torch.randint(0, model.spec.vocab, (1, tokens), device=device)
        self.pos = context + torch.arange(tokens, device=device).expand(1, tokens)
        self.mask = torch.ones((tokens, tokens), dtype=torch.bool, device=device).tril()[None]
        self.plan = TreeAttentionPlan(1, tokens, context, self.cache.capacity, model.heads, device)
        self.plan.set_mask(self.mask)
        self.out = torch.zeros((1, tokens), dtype=torch.int64, device=device)
        self.hidden = self.out  # the last call's final hidden [1, N, hidden]

    def __call__(self) -> None:
        """Session.verify_time's step: forward, LM head, argmax into `out`. `hidden` keeps the
        forward's output tensor (a graph's own buffer when captured, rewritten by replays)."""
        m = self.model
        h, _ = m.forward(self.tok, self.pos, self.cache, self.context, self.mask, plan=self.plan)
        self.hidden = h
        self.out.copy_(m.lm_head(h).argmax(dim=-1))


def replayable(fn: Callable[[], None], device: torch.device) -> tuple[Callable[[], None], object]:
    """fn as a CUDA-graph replay (after two warm-up calls) on CUDA, else fn itself."""
    if device.type != "cuda":
        return fn, None
    g = capture_graph(fn)
    torch.cuda.synchronize()
    return g.replay, g


def median_time(fn: Callable[[], None], reps: int, device: torch.device) -> float:
    for _ in range(3):
        fn()
    timer = PhaseTimer(("step",), reps, device)
    timer.run([fn])
    return timer.medians_s()["step"]


# ---- per-op breakdown --------------------------------------------------------------------------------
def op_breakdown(
    step: VerifyStep, variant: str, gemm: LayerGemmPlan, device: torch.device
) -> dict[str, float]:
    """Seconds per layer of each op of `variant`'s layer, timed alone over all layers' weights,
    plus the once-per-step ops (embedding, final norm, LM head + argmax)."""
    m = step.model
    spec = m.spec
    n = step.tokens
    hq, hk, d = spec.heads, spec.kv_heads, spec.head_dim
    layers = m.layers
    x = torch.randn((n, spec.hidden), device=device, dtype=m.dtype)
    res = torch.zeros_like(x)
    qkv = torch.randn((n, (hq + 2 * hk) * d), device=device, dtype=m.dtype)
    attn = torch.randn((n, hq * d), device=device, dtype=m.dtype)
    gu = torch.randn((n, 2 * spec.ffn), device=device, dtype=m.dtype)
    act = torch.randn((n, spec.ffn), device=device, dtype=m.dtype)
    ctx = step.context
    pdl = gemm.pdl

    def attend(i: int) -> None:
        kv = step.cache.layer(i, 1)
        args = (spec, kv, step.pos, ctx, 0, n, None, m.rope)
        _attend(qkv, 1, n, *args, step.plan, pdl if variant != "base" else False)

    ops: dict[str, Callable[[int], object]]
    if variant == "base":
        ops = {
            "qkv": lambda i: linear(x, layers[i].wqkv),
            "rope+attention": attend,
            "o": lambda i: linear(attn, layers[i].wo),
            "add_rmsnorm x2": lambda i: (
                add_rmsnorm(x, res, layers[i].norm_mlp),
                add_rmsnorm(x, res, layers[i].norm_attn),
            ),
            "gate_up": lambda i: linear(x, layers[i].w_gate_up),
            "down (silu fused or not)": lambda i: linear_gated(gu, layers[i].w_down),
        }
    else:
        ops = {
            "qkv+norm": lambda i: fused_linear(
                x, layers[i].wqkv, norm_weight=layers[i].norm_attn, config=gemm.qkv, pdl=pdl
            ),
            "rope+attention": attend,
            "o+residual": lambda i: fused_linear(
                attn, layers[i].wo, residual=res, config=gemm.o, pdl=pdl
            ),
            "gate_up+norm+silu": lambda i: fused_linear(
                x,
                layers[i].w_gate_up,
                norm_weight=layers[i].norm_mlp,
                gated=True,
                config=gemm.gate_up,
                pdl=pdl,
            ),
            "down+residual": lambda i: fused_linear(
                act, layers[i].w_down, residual=res, config=gemm.down, pdl=pdl
            ),
        }
    out: dict[str, float] = {}
    for name, op in ops.items():

        def every_layer(op: Callable[[int], object] = op) -> None:
            for i in range(len(layers)):
                op(i)

        out[name] = graph_time(every_layer, device, 10) / len(layers)
    h = torch.randn((1, n, spec.hidden), device=device, dtype=m.dtype)
    out["per step: embedding + final norm"] = graph_time(
        lambda: add_rmsnorm(torch.nn.functional.embedding(step.tok, m.embed), None, m.norm_final),
        device,
        10,
    )
    out["per step: lm_head + argmax"] = graph_time(lambda: m.lm_head(h).argmax(dim=-1), device, 10)
    return out


# ---- main ----------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for verify_floor.json")
    ap.add_argument("--model", default="llama-3.1-8b", help="preset name or model file")
    ap.add_argument("--tokens", type=int, default=64, help="tree tokens N (chain mask)")
    ap.add_argument("--context", type=int, default=4096, help="cached tokens C")
    ap.add_argument("--reps", type=int, default=30, help="graph replays timed per round")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds per variant")
    ap.add_argument("--quick", action="store_true", help="fewer fused GEMM candidates")
    ap.add_argument("--no-breakdown", action="store_true", help="skip the per-op breakdown")
    ap.add_argument(
        "--tune-budget-s", type=float, default=75.0,
        help="seconds for tuning the fused GEMMs (compiles included), split over the GEMM roles",
    )  # fmt: skip
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--variants", default="",
        help=f"comma-separated variants besides base (default: all of {', '.join(VARIANTS)})",
    )  # fmt: skip
    args = ap.parse_args(argv)
    for name in ("tokens", "context", "reps", "rounds", "tune_budget_s"):
        if not getattr(args, name) >= 1:  # also rejects NaN
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.tokens > 64:
        ap.error("--tokens must be <= 64 (one mask word per row)")
    unknown = set(filter(None, args.variants.split(","))) - set(VARIANTS)
    if unknown:
        ap.error(f"--variants: unknown {sorted(unknown)}; choose from {', '.join(VARIANTS)}")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    spec = load_model(args.model)
    if not cuda and spec.weight_bytes() > CPU_MAX_WEIGHT_BYTES:
        ap.error(
            f"{spec.name} ({spec.weight_bytes() / 1e9:.1f} GB of weights) needs a CUDA GPU; on "
            "CPU pass a small --model file to check the script itself"
        )
    gpu = torch.cuda.get_device_name(dev) if cuda else "cpu"
    log(
        f"{gpu}; torch {torch.__version__}; model {spec.name}; B=1 N={args.tokens} C={args.context}"
    )

    bw = copy_bandwidth(dev) if cuda else copy_bandwidth(dev, 1 << 24)
    fb = floor_bytes(spec, 1, args.context)
    floor_s = fb / bw
    log(f"floor {floor_s * 1e3:.3f} ms ({fb / 1e9:.2f} GB at {bw / 1e12:.2f} TB/s copy)")

    model = Decoder(spec, dev, dtype, max_pos=args.context + args.tokens + 72)
    doc: dict[str, object] = {
        "gpu": gpu, "torch": torch.__version__, "model": spec.name, "batch": 1,
        "tokens": args.tokens, "context": args.context, "copy_bytes_per_s": bw,
        "floor_bytes": fb, "floor_s": floor_s, "goal_ratio": GOAL_RATIO,
        "command": " ".join(sys.argv),
    }  # fmt: skip
    # the base path's GEMM plan at M = N (what Session autotunes at start) and attention tuning
    if cuda:
        shapes = sorted(set(weight_shapes(spec)))
        plan, gemm_rows = autotune(
            shapes, dev, buckets=(args.tokens,), gated=[(spec.hidden, spec.ffn)]
        )
        set_plan(plan)
        doc["base_gemm_plan"] = plan.to_dict()
        doc["base_gemm_rows"] = gemm_rows
        log(f"base GEMM plan at M={args.tokens}: {plan.to_dict()} ({time.time() - t0:.0f} s)")
    step = VerifyStep(model, args.tokens, args.context, dev)
    if cuda:
        doc["attention_rows"] = tune_tree_attention(
            1, args.tokens, args.context, step.cache.layers(1), spec.heads
        )
        step.plan = TreeAttentionPlan(
            1, args.tokens, args.context, step.cache.capacity, model.heads, dev
        )
        step.plan.set_mask(step.mask)
    doc["attention_launch"] = repr(step.plan.launch)
    tuned, fused_rows = tune_layer_gemms(
        spec, args.tokens, dev, dtype, args.quick, args.tune_budget_s
    )
    doc["fused_configs"] = {role: c.name for role, c in tuned.items()}
    doc["fused_rows"] = fused_rows
    log(f"fused configs {doc['fused_configs']} ({time.time() - t0:.0f} s)")
    write_json_atomic(out_dir / "verify_floor.json", doc)  # a checkpoint, should a limit cut in

    variants = layer_variants(tuned, spec, cuda and pdl_supported(dev))
    if args.variants:
        keep = {"base", *args.variants.split(",")}
        variants = {k: v for k, v in variants.items() if k in keep}
    replays: dict[str, Callable[[], None]] = {}
    graphs: list[object] = []
    outputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    errors: dict[str, str] = {}
    for name, gp in variants.items():
        model.fused = gp
        try:
            fn, g = replayable(step, dev)
            fn()
        except Exception as e:  # a variant that fails is reported, the others still run
            errors[name] = repr(e)[:400]
            log(f"variant {name} failed: {errors[name]}")
            if cuda:
                torch.cuda.synchronize()
            continue
        outputs[name] = (step.hidden.float().clone(), step.out.clone())
        replays[name] = fn
        graphs.append(g)
    model.fused = None
    doc["variant_plans"] = {k: (v.to_dict() if v else None) for k, v in variants.items()}
    doc["variant_errors"] = errors
    ref_h, ref_tok = outputs["base"]
    agreement = {
        name: {
            "hidden_rel_err": float((h - ref_h).norm() / ref_h.norm().clamp_min(1e-30)),
            "argmax_agreement": float((t == ref_tok).float().mean()),
        }
        for name, (h, t) in outputs.items()
    }
    doc["agreement_with_base"] = agreement
    rounds: dict[str, list[float]] = {name: [] for name in replays}
    for _ in range(args.rounds):  # alternate, so drift hits every variant alike
        for name, fn in replays.items():
            rounds[name].append(median_time(fn, args.reps, dev))
    doc["rounds_s"] = rounds
    step_s = {name: statistics.median(r) for name, r in rounds.items()}
    doc["step_s"] = step_s
    doc["ratio_to_floor"] = {name: t / floor_s for name, t in step_s.items()}
    del graphs, replays
    write_json_atomic(out_dir / "verify_floor.json", doc)
    log(
        "step ms: "
        + ", ".join(f"{k} {v * 1e3:.3f} ({v / floor_s:.3f}x)" for k, v in step_s.items())
        + f" ({time.time() - t0:.0f} s)"
    )

    breakdown: dict[str, dict[str, float]] = {}
    if not args.no_breakdown:
        for name, gp in variants.items():
            if name in ("base", "fused", "fused+pdl") and name in outputs:
                breakdown[name] = op_breakdown(step, name, gp or LayerGemmPlan(), dev)
                doc["breakdown_s"] = breakdown
                write_json_atomic(out_dir / "verify_floor.json", doc)
    doc["wall_s"] = time.time() - t0
    write_json_atomic(out_dir / "verify_floor.json", doc)

    # ---- the table -----------------------------------------------------------------------------
    base = step_s["base"]
    lines = [
        f"verify B=1 N={args.tokens} C={args.context} {spec.name} on {gpu}: floor "
        f"{floor_s * 1e3:.3f} ms ({fb / 1e9:.2f} GB / {bw / 1e12:.2f} TB/s), goal "
        f"{GOAL_RATIO}x = {GOAL_RATIO * floor_s * 1e3:.3f} ms",
        f"{'variant':<10} {'step ms':>8} {'x floor':>8} {'vs base':>8} {'rounds ms':>28} {'rel err':>8} {'argmax=':>7}",
    ]
    for name, err in errors.items():
        lines.append(f"{name:<10} failed: {err[:120]}")
    for name, t in step_s.items():
        rr = " ".join(f"{x * 1e3:.3f}" for x in rounds[name])
        a = agreement[name]
        lines.append(
            f"{name:<10} {t * 1e3:8.3f} {t / floor_s:8.3f} {t / base:8.3f} {rr:>28} "
            f"{a['hidden_rel_err']:8.1e} {a['argmax_agreement']:7.2f}"
        )
    for name, ops in breakdown.items():
        per_layer = sum(v for k, v in ops.items() if not k.startswith("per step"))
        once = sum(v for k, v in ops.items() if k.startswith("per step"))
        parts = per_layer * spec.layers + once
        lines.append(
            f"[{name}] ops alone, us per layer: "
            + ", ".join(
                f"{k} {v * 1e6:.1f}" for k, v in ops.items() if not k.startswith("per step")
            )
        )
        lines.append(
            f"[{name}] per step: "
            + ", ".join(
                f"{k[10:]} {v * 1e6:.1f} us" for k, v in ops.items() if k.startswith("per step")
            )
            + f"; sum of parts {parts * 1e3:.3f} ms vs step {step_s[name] * 1e3:.3f} ms "
            f"(boundaries {(step_s[name] - parts) * 1e3:+.3f} ms)"
        )
    lines.append(f"fused configs: {doc['fused_configs']}; wall {time.time() - t0:.0f} s")
    text = "\n".join(lines)
    (out_dir / "summary.txt").write_text(text + "\n")
    log(text)
    log(json.dumps({"floor_s": floor_s, "step_s": step_s, "ratio_to_floor": doc["ratio_to_floor"]}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
