"""Executor benchmark: one GPU call that calibrates, checks the roofline target and measures
policies, Llama-3.1-8B + its EAGLE-3 head at real shape.

    PYTHONUNBUFFERED=1 python benchmarks/bench_executor.py --out $OUT [--policy plan.json]
        [--skip-calibration] [--candidates]

Writes under --out: calibrate-run.json (micro-benchmarks + verify grid), floor.json (verify at
batch 1, 64 tree tokens, context 4096 against weight+KV bytes / measured copy bandwidth, for each
attention backend), measurement.json (engine-default trees, the planned table if given, and
optional candidate trees, each against the no-speculation baseline). Prints a table, then one
JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from spectune.executor.calibrate import calibration_run
from spectune.executor.model import floor_bytes
from spectune.executor.session import Session, SessionConfig, measure_runs
from spectune.planner.acceptance import acceptance_model
from spectune.specs import PolicyTable, TreePolicy, load_model, write_json_atomic
from spectune.validate.measure import (
    format_table,
    gpu_hardware_name,
    measurement_doc,
    script_command,
)

ENGINE_DEFAULTS = {
    "sglang": TreePolicy("dynamic-topk", 5, 4, 8),
    "eagle": TreePolicy("dynamic-topk", 7, 10, 60),
}
CANDIDATES = {
    "chain2": TreePolicy("dynamic-topk", 2, 1, 3),
    "chain4": TreePolicy("dynamic-topk", 4, 1, 5),
    "k2b8": TreePolicy("dynamic-topk", 4, 2, 8),
    "k4b16": TreePolicy("dynamic-topk", 5, 4, 16),
    "k8b32": TreePolicy("dynamic-topk", 6, 8, 32),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--policy", default=None, help="planned PolicyTable JSON to measure")
    ap.add_argument("--skip-calibration", action="store_true")
    ap.add_argument("--candidates", action="store_true", help="also measure CANDIDATES")
    ap.add_argument("--batches", default="1,8,32,64")
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--workload", default="mt-bench")
    ap.add_argument(
        "--profile", action="store_true", help="kernel table of one B=1 SGLang-tree step"
    )
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    dev = torch.device("cuda")
    gpu = torch.cuda.get_device_name(dev)
    hw = gpu_hardware_name(gpu)
    target, drafter = load_model("llama-3.1-8b"), load_model("eagle3-llama-3.1-8b")
    batches = [int(b) for b in args.batches.split(",")]
    grid_b, grid_n, grid_c = (1, 4, 16, 64), (1, 16, 64, 128), (512, 4096)
    cfg = SessionConfig(
        max_batch=max(64, *batches), max_context=max(4096, args.context), max_tree=128
    )
    session = Session(target, drafter, cfg, dev)
    print(
        f"{gpu} ({hw}); session up in {time.time() - t0:.1f} s; attention: {session.attention_backend}",
        flush=True,
    )
    summary: dict[str, object] = {"gpu": gpu, "hardware": hw}
    from spectune.kernels.span_attention import BACKENDS

    print(
        f"span attention self-check: rel err {session.attention_check:.2e}; backends: {BACKENDS}",
        flush=True,
    )
    write_json_atomic(
        out / "gemm-autotune.json", {"plan": session.gemm_plan, "rows": session.gemm_rows}
    )
    for row in session.gemm_rows:
        key = f"{row['n']}x{row['k']}@{row['m']}{'+silu' if row.get('gated') else ''}"
        if row.get("m") in (1, 64) and row.get("variant") == session.gemm_plan.get(key):
            print(
                f"  gemm {row['n']}x{row['k']} M={row['m']:<3} {row['variant']:<22} "
                f"{row['seconds'] * 1e6:7.1f} us {row['gb_s']:6.0f} GB/s",
                flush=True,
            )

    # ---- roofline floor: verify at B=1, N=64, C=4096 for each attention backend --------------
    from spectune.executor.calibrate import copy_bandwidth

    bw = copy_bandwidth(dev)
    fb = floor_bytes(target, 1, 4096)
    floor_s = fb / bw
    floor = {"copy_bytes_per_s": bw, "floor_bytes": fb, "floor_s": floor_s, "backends": {}}
    for name, kern in (("kernels", True), ("torch", False)):
        if kern and not session.use_kernels:
            continue
        t = session.verify_time(1, 64, 4096, reps=20, use_kernels=kern)
        floor["backends"][name] = {"seconds": t, "ratio": t / floor_s}  # type: ignore[index]
        print(
            f"floor check [{name}]: verify B=1 N=64 C=4096 {t * 1e3:.3f} ms, floor {floor_s * 1e3:.3f} ms "
            f"({fb / 1e9:.2f} GB at {bw / 1e12:.2f} TB/s) -> {t / floor_s:.2f}x",
            flush=True,
        )
    best = min(floor["backends"].items(), key=lambda kv: kv[1]["seconds"])  # type: ignore[union-attr]
    session.use_kernels = best[0] == "kernels"
    floor["chosen"] = best[0]
    write_json_atomic(out / "floor.json", {"gpu": gpu, "hardware": hw, **floor})
    summary["floor_ratio"] = best[1]["ratio"]  # type: ignore[index]

    # ---- calibration micro-benchmarks -----------------------------------------------------------
    if not args.skip_calibration:
        doc = calibration_run(
            session, gpu=gpu, hardware=hw, batches=grid_b, tokens=grid_n, contexts=grid_c
        )
        write_json_atomic(out / "calibrate-run.json", doc)
        print(f"calibration run done at {time.time() - t0:.0f} s", flush=True)

    # ---- policies ------------------------------------------------------------------------------
    acc = acceptance_model(args.workload)
    table = PolicyTable.load(args.policy) if args.policy else None
    if table is not None:
        planned = table.scenario
        measured = planned.replace(
            target=target.name, drafter=drafter.name, gpu=hw, tp=1, workload=args.workload
        )
        for name, was, now in planned.changes(measured):
            print(f"note: {args.policy} was planned for {name} {was}; measuring {now}", flush=True)
    runs: list[tuple[int, TreePolicy | None, str]] = []
    for b in batches:
        if table is not None:
            pol = table.lookup(b, args.context)
            runs.append((b, pol, "planned" if pol else "planned-off"))
        for label, pol in ENGINE_DEFAULTS.items():
            runs.append((b, pol, label))
        if args.candidates:
            runs.extend((b, pol, label) for label, pol in CANDIDATES.items())
    recs = measure_runs(session, runs, args.context, acc, args.steps, keep_going=True)
    mdoc = measurement_doc(
        gpu=gpu,
        hardware=hw,
        target=target.name,
        drafter=drafter.name,
        workload=args.workload,
        context=args.context,
        steps=args.steps,
        attention=session.attention_backend,
        runs=recs,
        extra={"command": script_command("benchmarks/bench_executor.py", vars(args))},
    )
    write_json_atomic(out / "attention-tuning.json", session.attention_rows)
    write_json_atomic(out / "measurement.json", mdoc)
    if args.profile:
        _profile(session, acc, args.context)
    print(f"total {time.time() - t0:.0f} s")
    print(format_table(mdoc))
    summary["runs"] = [
        {k: r[k] for k in ("batch", "label", "tokens_per_s", "speedup")} for r in recs
    ]
    print(json.dumps(summary))


def _profile(session: Session, acc: object, context: int) -> None:
    """Per-kernel CUDA time of each phase of one eager step (SGLang tree) at batch 1 and 32."""
    from torch.profiler import ProfilerActivity, profile

    from spectune.executor.loop import SpecRunner

    for batch in (1, 32):
        r = SpecRunner(
            session.target,
            session.drafter,
            acc,
            ENGINE_DEFAULTS["sglang"],
            batch,
            context,
            session.tcache,
            session.dcache,
            use_graphs=False,
            use_kernels=session.use_kernels,
        )
        for _ in range(2):
            for f in (r.draft, r.build, r.verify, r.accept, r.compact, r.extend):
                f()
        torch.cuda.synchronize()
        for name, fn in (("draft", r.draft), ("extend", r.extend)):
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            print(f"--- profile: {name} (B={batch}, sglang 5/4/8, eager) ---")
            table = prof.key_averages().table(
                sort_by="cuda_time_total", row_limit=22, max_name_column_width=50
            )
            for line in table.splitlines():
                if line.strip() and not line.startswith("-"):
                    cols = line.split()
                    print("P " + line[:50] + " " + " ".join(cols[-4:]))


if __name__ == "__main__":
    main()
