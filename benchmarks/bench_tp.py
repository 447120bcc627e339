"""Tensor-parallel executor vs the cost model's TP terms: the steps of benchmarks/run_tp_gpu.sh.

    python benchmarks/bench_tp.py sweep --out sweep.json            # all-reduce etc. by size
    python benchmarks/bench_tp.py merge RUN.json sweep.json          # sweep rows into a run doc
    python benchmarks/bench_tp.py plan --calibration CAL --tp 4 --target llama-3.1-70b \\
        --drafter eagle3-llama-3.1-70b --out policy-tp4.json         # planned table (CPU)
    python benchmarks/bench_tp.py run --tp 4 --policy policy-tp4.json --also dynamic-topk:5,4,8 \\
        --target llama-3.1-70b --drafter eagle3-llama-3.1-70b \\
        --out-measure execute-tp4.json --out-grid verify-tp4.json    # one launch: grid + runs
    python benchmarks/bench_tp.py summary DIR                        # the table, then JSON

`--dry-run` (sweep, run) runs the ranks on CPU over gloo: tiny models (`tiny-models DIR`
writes them), no timing value. The summary re-predicts every document of DIR with
`spectune check`'s code (spectune.validate.check.check_folder) and reports, for the documents
with tp > 1: verify-latency MAPE, the speedup errors, and the all-reduce cost per layer
measured in place (verify with its collectives minus the same shard compute without them) next
to the cost model's (its comm class: the collectives with their launches and the gather's copy).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from spectune.cli.common import ints

TINY = {
    # tp 2 and tp 4 dry runs: KV heads divisible by 4; vocab and draft vocab by 4
    "tiny-target": {"name": "tiny-target", "layers": 2, "hidden": 64, "heads": 4, "kv_heads": 4,
                    "head_dim": 16, "ffn": 96, "vocab": 320, "family": "llama-3"},
    "tiny-head": {"name": "tiny-head", "arch": "eagle3-head", "layers": 1, "hidden": 64,
                  "heads": 4, "kv_heads": 4, "head_dim": 16, "ffn": 96, "vocab": 320,
                  "draft_vocab": 128, "family": "llama-3", "draft_method": "eagle3"},
}  # fmt: skip


def _tiny(args: argparse.Namespace) -> int:
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    for name, spec in TINY.items():
        (d / f"{name}.json").write_text(json.dumps(spec))
    print(d)
    return 0


def _sweep(args: argparse.Namespace) -> int:
    import torch

    from spectune.executor.collectives import launch
    from spectune.executor.tp_jobs import CalibrateJob, calibrate_rank, sweep_tps

    world = args.gpus or (2 if args.dry_run else torch.cuda.device_count())
    if world < 2:
        print("one GPU: no collectives to time")
        return 2
    job = CalibrateJob(args.out, args.hardware, sweep_tps(world))
    if args.dry_run:
        job = CalibrateJob(args.out, args.hardware, sweep_tps(world), sizes=(4096, 65536), reps=2)
    launch(calibrate_rank, sweep_tps(world)[-1], (job,), backend="gloo" if args.dry_run else "")
    rows = json.loads(Path(args.out).read_text())
    print(f"{'op':<11} {'tp':>2} {'bytes':>10} {'us':>9} {'busbw GB/s':>10}")
    for r in rows:
        print(
            f"{r['op']:<11} {r['tp']:>2} {r['bytes']:>10} {r['seconds'] * 1e6:>9.1f} "
            f"{r['busbw_gb_s']:>10.1f}"
        )
    return 0


def _micro(args: argparse.Namespace) -> int:
    """spectune calibrate's one-GPU micro-benchmarks (no fit: the fit runs once, later, with
    the sweep and the one-GPU measurement)."""
    import torch

    from spectune.executor.calibrate import calibration_run
    from spectune.executor.session import Session, SessionConfig, require_cuda
    from spectune.specs import load_model, write_json_atomic

    device = require_cuda()
    cfg = SessionConfig(max(args.batch), max(args.context), max(args.tokens))
    session = Session(load_model(args.target), load_model(args.drafter), cfg, device)
    raw = calibration_run(
        session,
        gpu=torch.cuda.get_device_name(device),
        hardware=args.hardware,
        batches=args.batch,
        tokens=args.tokens,
        contexts=args.context,
        kernel_classes=args.kernel_classes,
        draft_widths=args.draft_widths,
    )
    write_json_atomic(args.out, raw)
    return 0


def _merge(args: argparse.Namespace) -> int:
    from spectune.specs import write_json_atomic

    run = json.loads(Path(args.run).read_text())
    run["collectives"] = json.loads(Path(args.sweep).read_text())
    write_json_atomic(args.run, run)
    return 0


def _plan(args: argparse.Namespace) -> int:
    import optuna

    from spectune.specs.scenario import Scenario
    from spectune.validate.planned import plan_table

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sc = Scenario(
        target=args.target,
        drafter=args.drafter,
        gpu=args.gpu,
        tp=args.tp,
        workload=args.workload,
        calibration=args.calibration,
    )
    table = plan_table(sc, batches=args.batch, context=args.context, trials=args.trials)
    table.save(args.out)
    for b in table.buckets:
        print(f"  tp{args.tp} B={b.batch[0]:<3} {b.policy.label if b.policy else 'off'}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from spectune.executor.collectives import launch
    from spectune.executor.tp_jobs import CalibrateJob, ExecuteJob, execute_rank
    from spectune.planner.acceptance import acceptance_model
    from spectune.specs import PolicyTable, TreePolicy, load_model, load_workload

    target, drafter = load_model(args.target), load_model(args.drafter)
    table = PolicyTable.load(args.policy) if args.policy else None
    defaults = [_engine_default(e) for e in args.engine]
    runs: list[tuple[int, TreePolicy | None, str]] = []
    for b in args.batch:
        if table is not None:
            pol = table.lookup(b, args.context)
            runs.append((b, pol, "planned" if pol else "off"))
        for label, text in (a.split("=", 1) for a in args.also):
            runs.append((b, TreePolicy.parse(text), label))
        runs.extend((b, pol, label) for label, pol in defaults)
    grid = CalibrateJob(
        args.out_grid, args.hardware, (), target, drafter,
        tuple(args.grid_batch), tuple(args.grid_tokens), (args.context,),
        use_graphs=not (args.dry_run or args.no_graphs), reps=2 if args.dry_run else 10,
        refs=(args.target, args.drafter), draft_widths=tuple(args.draft_widths),
    )  # fmt: skip
    job = ExecuteJob(
        target, drafter, tuple(runs), args.context,
        acceptance_model(load_workload(args.workload)), args.steps, args.warmup,
        args.out_measure,
        doc={"hardware": args.hardware, "workload": args.workload,
             "target": args.target, "drafter": args.drafter,
             "command": "python benchmarks/bench_tp.py " + " ".join(sys.argv[1:])},
        use_graphs=not (args.dry_run or args.no_graphs), grid=grid if args.out_grid else None,
    )  # fmt: skip
    launch(execute_rank, args.tp, (job,), backend="gloo" if args.dry_run else "nccl")
    return 0


# vLLM sets no default (num_speculative_tokens must be given): its EAGLE-3 chain of 3, the
# configuration of measurements/engines/vllm-qwen3-8b-eagle3-k3-h100.json
VLLM_CHAIN = "dynamic-topk:3,1,4"


def _engine_default(name: str) -> tuple[str, Any]:
    """(label, policy): the engine's default config (spectune.planner.space.engine_default),
    or for an engine without one (vLLM) the chain above, labelled so."""
    from spectune.planner.space import engine_default
    from spectune.specs import TreePolicy
    from spectune.specs.engine import load_engine

    pol = engine_default(load_engine(name))
    if pol is not None:
        return f"{name}-default", pol
    return f"{name}-k3", TreePolicy.parse(VLLM_CHAIN)


# ---- summary -----------------------------------------------------------------------------------
def _summary(args: argparse.Namespace) -> int:
    from spectune.planner.costmodel import CostModel
    from spectune.specs import load_hardware, load_model
    from spectune.validate.check import calibrations_in, check_folder

    d = Path(args.dir)
    docs = {p.name: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}
    tp_of = {n: int(doc.get("tp", 1)) for n, doc in docs.items() if isinstance(doc, dict)}
    res = check_folder(d)
    out: dict[str, Any] = {"files": res.files}
    lines = [f"TP check of {d} (spectune check's predictions at each document's tp)"]
    for tp in sorted(set(tp_of.values())):
        ver = [r for r in res.verify if tp_of.get(r.file) == tp]
        spd = [r for r in res.speedup if tp_of.get(r.file) == tp]
        if not ver and not spd:
            continue
        mape = sum(abs(r.error) for r in ver) / max(len(ver), 1)
        worst = max((abs(r.error) for r in spd), default=float("nan"))
        mean = sum(abs(r.error) for r in spd) / max(len(spd), 1)
        out[f"tp{tp}"] = {"verify_mape": mape, "verify_n": len(ver), "speedup_worst": worst,
                          "speedup_mean": mean, "speedup_n": len(spd)}  # fmt: skip
        lines.append(
            f"  tp {tp}: verify MAPE {mape:6.1%} over {len(ver):3}   speedup error worst "
            f"{worst:6.1%} mean {mean:6.1%} over {len(spd)} runs"
        )
    coll = [r for doc in docs.values() if isinstance(doc, dict) for r in doc.get("collectives", [])]
    out["collectives"] = _collectives_choice(coll, lines)
    cals = calibrations_in(d)
    lines.append(
        "  all-reduce cost per layer, measured in place (verify minus the same compute without"
        " collectives) vs the cost model, and 2 x the sweep's all-reduce at that size (us)"
    )
    lines.append(
        f"  {'file':<22} {'B':>3} {'N':>4} {'measured':>9} {'model':>9} {'error':>7} {'sweep':>9}"
    )
    per_layer = []
    for name, doc in docs.items():
        if not isinstance(doc, dict) or tp_of.get(name, 1) == 1 or "verify" not in doc:
            continue
        hw = load_hardware(doc["hardware"])
        target = load_model(doc["target"])
        cm = CostModel(
            hw, target, load_model(doc["drafter"]), tp=doc["tp"], calibration=cals.get(hw.name)
        )
        for r in doc["verify"]:
            if "seconds_nocomm" not in r:
                continue
            meas = (r["seconds"] - r["seconds_nocomm"]) / target.layers
            parts = cm.verify_breakdown(r["batch"], r["tokens"], r["context"])
            model = float(parts["comm"]) / target.layers  # launches and gather copy included
            per_layer.append(
                {"file": name, "batch": r["batch"], "tokens": r["tokens"],
                 "measured_us": meas * 1e6, "model_us": model * 1e6}
            )  # fmt: skip
            # the sweep's back-to-back all-reduces at this message size: 2 per layer
            msg = r["batch"] * r["tokens"] * target.hidden * 2
            swept = 2 * _swept(coll, doc["tp"], msg)
            per_layer[-1]["sweep_us"] = swept * 1e6
            err = model / meas - 1 if meas > 0 else float("nan")
            lines.append(
                f"  {name:<22.22} {r['batch']:>3} {r['tokens']:>4} {meas * 1e6:>9.1f} "
                f"{model * 1e6:>9.1f} {err:>+7.1%} {swept * 1e6:>9.1f}"
            )
    out["allreduce_per_layer"] = per_layer
    out["draft_steps"] = _draft_steps(docs, tp_of, cals, lines)
    agree = {
        n: doc["ranks_agree"]
        for n, doc in docs.items()
        if isinstance(doc, dict) and "ranks_agree" in doc
    }
    if agree:
        out["ranks_agree"] = agree
        lines.append(f"  ranks accepted alike (replicated loop): {agree}")
    for cal in cals.values():
        out["interconnect"] = {"efficiency": cal.interconnect_efficiency,
                               "latency_us": (cal.allreduce_latency_s or 0) * 1e6,
                               "step_latency_us": cal.allreduce_step_latency_s * 1e6,
                               "allreduce_law": [list(r) for r in cal.allreduce_law],
                               "allgather_law": [list(r) for r in cal.allgather_law]}  # fmt: skip
        lines.append(
            f"  interconnect fit ({cal.hardware}): ring law for other tp: efficiency "
            f"{cal.interconnect_efficiency:.3f}, latency {(cal.allreduce_latency_s or 0) * 1e6:.1f}"
            f" us + {cal.allreduce_step_latency_s * 1e6:.2f} us per ring step; per tp and regime"
            f" (beyond the launch, {(cal.launch_s or 0) * 1e6:.2f} us):"
        )
        for op, law in (("all-reduce", cal.allreduce_law), ("all-gather", cal.allgather_law)):
            for tp in sorted({int(r[0]) for r in law}):
                regimes = "; ".join(
                    f"from {r[1] / 2**20:.2f} MiB {r[2] * 1e6:.1f} us + {r[3] / 1e9:.0f} GB/s"
                    for r in sorted((r for r in law if int(r[0]) == tp), key=lambda r: r[1])
                )
                lines.append(f"    {op} tp {tp}: {regimes}")
        # the weight GEMMs' factor by row count per (tp, hidden) (Calibration.tp_gemm_scale)
        out["tp_gemm_scale"] = [list(r) for r in cal.tp_gemm_scale]
        for key in sorted({(int(r[0]), int(r[1])) for r in cal.tp_gemm_scale}):
            rows = sorted(r[2:] for r in cal.tp_gemm_scale if (int(r[0]), int(r[1])) == key)
            factors = ", ".join(f"{m:g} x{f:.3f}" for m, f in rows)
            lines.append(f"  weight GEMMs at tp {key[0]} (hidden {key[1]}) by rows: {factors}")
    out["phases"] = _phases(d, docs, cals, lines)
    out["repeats"] = _repeats(docs, res.speedup, lines)
    print("\n".join(lines))
    print(json.dumps(out))
    return 0


#: the second timing of a TP run's executions (run_tp_gpu.sh TP_REPEAT=1): execute-tpN.json's
#: runs again in a new process on the same GPUs, without the verify grid
REPEAT_SUFFIX = "-repeat.json"


def repeat_moves(first: dict[str, Any], second: dict[str, Any]) -> list[dict[str, Any]]:
    """Per speculative run of `first` that `second` ran too (same batch and label): how far the
    second timing moved the measured speedup per accepted token, (speedup_2 / tokens_2) /
    (speedup_1 / tokens_1) - 1 (tokens: tokens per step), which check's predicted speedup
    (tokens per step x the priced AR step / the priced step) shifts by exactly: (1 + error_1) /
    (1 + error_2) - 1; and the step and the no-speculation step each, step_2 / step_1 - 1. Both
    timings draw the same acceptance (executor.loop's common draws, stream 0), so their tokens
    per step agree ("same_accept"), and the move is how close any prediction of both can come."""
    theirs = {(r["batch"], r["label"]): r for r in second["runs"] if r["policy"] is not None}
    rows = []
    for r in first["runs"]:
        o = theirs.get((r["batch"], r["label"]))
        if r["policy"] is None or o is None:
            continue
        move = (o["speedup"] / o["tokens_per_step"]) / (r["speedup"] / r["tokens_per_step"])
        rows.append(
            {"batch": r["batch"], "label": r["label"], "move": move - 1,
             "step": o["phases_ms"]["step"] / r["phases_ms"]["step"] - 1,
             "ar": o["ar_step_ms"] / r["ar_step_ms"] - 1,
             "same_accept": abs(o["tokens_per_step"] - r["tokens_per_step"]) < 1e-9}
        )  # fmt: skip
    return rows


def _repeats(docs: dict[str, Any], speedup: list[Any], lines: list[str]) -> dict[str, Any]:
    """Each execute-tpN.json beside its repeat (REPEAT_SUFFIX): per run the timing-only move of
    the measured speedup between the two timings (repeat_moves) and check's speedup error of
    each; then over the runs the mean and largest |move| and |error|."""
    # check names a run "speedup B=<batch> <label> <tree>"
    err = {(r.file, *r.what.split()[1:3]): r.error for r in speedup}
    out: dict[str, Any] = {}
    for name, doc in docs.items():
        rep = name.removesuffix(".json") + REPEAT_SUFFIX
        if name.endswith(REPEAT_SUFFIX) or rep not in docs or "runs" not in doc:
            continue
        rows = repeat_moves(doc, docs[rep])
        if not rows:
            continue
        lines.append(
            f"  repeat: {name} timed again ({rep}): the measured speedup's move with acceptance "
            "held, and check's speedup error of each timing"
        )
        lines.append(
            f"  {'B':>5} {'label':<16} {'move':>7} {'step':>7} {'AR':>7} {'error':>7} {'repeat':>7}"
        )
        for r in rows:
            run = (f"B={r['batch']}", r["label"])
            r["error"], r["error_repeat"] = err.get((name, *run)), err.get((rep, *run))
            e1, e2 = (f"{x:+7.1%}" if x is not None else "      -"
                      for x in (r["error"], r["error_repeat"]))  # fmt: skip
            lines.append(
                f"  {r['batch']:>5} {r['label']:<16.16} {r['move']:>+7.1%} {r['step']:>+7.1%} "
                f"{r['ar']:>+7.1%} {e1} {e2}{'' if r['same_accept'] else '  (acceptance differs)'}"
            )
        moves = [abs(r["move"]) for r in rows]
        errs = [abs(x) for r in rows for x in (r["error"], r["error_repeat"]) if x is not None]
        summary = {"moves_mean": sum(moves) / len(moves), "moves_max": max(moves)}
        if errs:
            summary |= {"errors_mean": sum(errs) / len(errs), "errors_max": max(errs)}
        lines.append(
            f"  repeat moves |mean| {summary['moves_mean']:.2%} max {summary['moves_max']:.2%} "
            f"over {len(rows)} runs"
            + (f"; errors of both timings |mean| {summary['errors_mean']:.2%} max "
               f"{summary['errors_max']:.2%}" if errs else "")
        )  # fmt: skip
        out[name] = {"rows": rows, **summary}
    return out


def _swept(rows: list[dict[str, Any]], tp: int, nbytes: float) -> float:
    """Seconds of one all-reduce of `nbytes` on `tp` ranks interpolated (log-log) in the
    sweep's rows; NaN without rows for that tp."""
    import numpy as np

    pts = sorted(
        (r["bytes"], r["seconds"]) for r in rows if r["op"] == "all_reduce" and r["tp"] == tp
    )
    if not pts:
        return float("nan")
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.exp(np.interp(np.log(nbytes), x, y)))


def _draft_steps(
    docs: dict[str, Any], tp_of: dict[str, int], cals: dict[str, Any], lines: list[str]
) -> list[dict[str, Any]]:
    """The drafter steps the TP grid timed (forward + logits + top-k over B x W tokens, with
    and without collectives) beside the cost model's drafter forward with the top-k over its
    B x W rows (CostModel.draft_select_time) and its collectives (two all-reduces per layer and
    the logits all-gather with their launches: the forward's comm class). Where a tp 1
    document of the same models timed the same step (calibrate-run.json's rows "draft", bench_tp
    micro), the step's change from tp 1, measured and priced: what a prediction at tp N adds
    to the drafting the fit prices at tp 1 (a step's bookkeeping, draft_step_s, is in
    neither)."""
    from spectune.planner.costmodel import CostModel
    from spectune.specs import load_hardware, load_model

    def key(doc: dict[str, Any], r: dict[str, Any]) -> tuple[Any, ...]:
        return doc["target"], doc["drafter"], r["batch"], r["tokens"], r["context"]

    tp1 = {
        key(doc, r): r["seconds"]
        for name, doc in docs.items()
        if isinstance(doc, dict) and tp_of.get(name, 1) == 1
        for r in doc.get("draft") or []
    }
    rows: list[dict[str, Any]] = []
    for name, doc in docs.items():
        if not isinstance(doc, dict) or tp_of.get(name, 1) == 1 or not doc.get("draft"):
            continue
        if not rows:
            lines.append(
                "  drafter step (forward + logits + top-k), measured vs model (us): the whole"
                " step, its collectives in place (with minus without), and its change from"
                " tp 1's step (calibrate-run.json's)"
            )
            lines.append(
                f"  {'file':<22} {'B':>3} {'W':>4} {'step':>9} {'model':>9} {'error':>7}"
                f" {'coll.':>8} {'model':>8} {'error':>7} {'vs tp 1':>8} {'model':>8}"
            )
        hw = load_hardware(doc["hardware"])
        target, drafter = load_model(doc["target"]), load_model(doc["drafter"])
        cal = cals.get(hw.name)
        cm = CostModel(hw, target, drafter, tp=doc["tp"], calibration=cal)
        cm1 = CostModel(hw, target, drafter, tp=1, calibration=cal)

        def price(c: CostModel, b: int, w: int, ctx: int) -> tuple[float, float]:
            """(the step, its collectives with their launches) as `c` prices them."""
            parts = c.draft_step_breakdown(b, w, ctx)
            step = sum(float(v) for v in parts.values()) + float(c.draft_select_time(b * w))
            return step, float(parts.get("comm", 0.0))

        for r in doc["draft"]:
            b, w, ctx = r["batch"], r["tokens"], r["context"]
            model, m_coll = price(cm, b, w, ctx)
            coll = r["seconds"] - r["seconds_nocomm"]
            row = {"file": name, "batch": b, "width": w,
                   "measured_us": r["seconds"] * 1e6, "model_us": model * 1e6,
                   "collectives_us": coll * 1e6, "model_collectives_us": m_coll * 1e6}  # fmt: skip
            delta = ""
            if key(doc, r) in tp1:
                d_meas = r["seconds"] - tp1[key(doc, r)]
                d_model = model - price(cm1, b, w, ctx)[0]
                row.update(vs_tp1_us=d_meas * 1e6, model_vs_tp1_us=d_model * 1e6)
                delta = f" {d_meas * 1e6:>+8.1f} {d_model * 1e6:>+8.1f}"
            rows.append(row)
            lines.append(
                f"  {name:<22.22} {b:>3} {w:>4} {r['seconds'] * 1e6:>9.1f} "
                f"{model * 1e6:>9.1f} {model / r['seconds'] - 1:>+7.1%} {coll * 1e6:>8.1f} "
                f"{m_coll * 1e6:>8.1f} {m_coll / coll - 1 if coll > 0 else float('nan'):>+7.1%}"
                + delta
            )
    return rows


def _phases(
    d: Path, docs: dict[str, Any], cals: dict[str, Any], lines: list[str]
) -> list[dict[str, Any]]:
    """Measured vs predicted ms per phase of every speculative run (draft, verify, extend, the
    rest of the step, the step; the no-speculation step), from the StepBreakdown that check
    prices the run with: where each run's speedup error comes from."""
    from spectune.planner.costmodel import CostModel
    from spectune.specs import TreePolicy, load_hardware, load_model
    from spectune.validate.check import price_run

    lines.append(
        "  phases, measured / predicted ms (rest: tree, accept, compact, overhead; AR: the"
        " step without speculation)"
    )
    lines.append(
        f"  {'file':<18} {'B':>3} {'policy':<18} {'draft':>13} {'verify':>15} {'extend':>11}"
        f" {'rest':>11} {'step':>15} {'AR':>15}"
    )
    rows = []
    for name, doc in docs.items():
        if not isinstance(doc, dict) or doc.get("schema") != "spectune.measurement/v1":
            continue
        hw = load_hardware(doc["hardware"])
        cm = CostModel(hw, load_model(doc["target"]), load_model(doc["drafter"]),
                       tp=int(doc.get("tp", 1)), calibration=cals.get(hw.name))  # fmt: skip
        c = doc["context"]
        planned: dict[str, Any] = {}  # price_run's per-document cache
        for r in doc["runs"]:
            if r["policy"] is None:
                continue
            pol, ph, b = TreePolicy(**r["policy"]), r["phases_ms"], r["batch"]
            st, _ = price_run(cm, doc, r, planned)
            pred = {k: float(getattr(st, k)) * 1e3 for k in ("draft_s", "verify_s", "extend_s")}
            total = float(st.total_s) * 1e3
            meas_rest = ph["step"] - ph["draft"] - ph["verify"] - ph["extend"]
            row = {"file": name, "batch": b, "label": r["label"], "policy": pol.label,
                   "draft": (ph["draft"], pred["draft_s"]),
                   "verify": (ph["verify"], pred["verify_s"]),
                   "extend": (ph["extend"], pred["extend_s"]),
                   "rest": (meas_rest, total - sum(pred.values())),
                   "step": (ph["step"], total),
                   "ar": (r.get("ar_step_ms", float("nan")),
                          float(cm.iteration(None, b, c).total_s) * 1e3)}  # fmt: skip
            rows.append(row)
            cells = " ".join(
                f"{row[k][0]:>6.2f}/{row[k][1]:<{w}.2f}"
                for k, w in (("draft", 6), ("verify", 8), ("extend", 4), ("rest", 4),
                             ("step", 8), ("ar", 8))
            )  # fmt: skip
            tag = f"{r['label'][:8]} {pol.depth}/{pol.topk}/{pol.budget}"
            lines.append(f"  {name:<18.18} {b:>3} {tag:<18.18} {cells}")
    return rows


def _collectives_choice(rows: list[dict[str, Any]], lines: list[str]) -> dict[str, Any]:
    """Reduce-scatter + all-gather vs one all-reduce per tp (the executor's choice), and the
    broadcast that the replicated loop saves, from the sweep's rows."""
    out: dict[str, Any] = {}
    by = {(r["op"], r["tp"], r["bytes"]): r["seconds"] for r in rows}
    for tp in sorted({r["tp"] for r in rows}):
        sizes = sorted(b for (op, t, b) in by if op == "all_reduce" and t == tp)
        ratio = [by[("rs_ag", tp, b)] / by[("all_reduce", tp, b)] for b in sizes
                 if ("rs_ag", tp, b) in by]  # fmt: skip
        bcast = by.get(("broadcast", tp, sizes[0])) if sizes else None
        if not ratio:
            continue
        out[f"tp{tp}"] = {"rs_ag_over_all_reduce_min": min(ratio),
                          "rs_ag_over_all_reduce_max": max(ratio),
                          "broadcast_smallest_us": (bcast or 0) * 1e6}  # fmt: skip
        lines.append(
            f"  tp {tp}: reduce-scatter + all-gather / all-reduce {min(ratio):.2f}..{max(ratio):.2f}"
            f" over {sizes[0]}..{sizes[-1]} B; a {sizes[0]} B broadcast (saved by replicating the"
            f" loop) {(bcast or 0) * 1e6:.1f} us"
        )
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("tiny-models")
    s.add_argument("dir")
    s.set_defaults(func=_tiny)
    s = sub.add_parser("sweep")
    s.add_argument("--out", required=True)
    s.add_argument("--hardware", default="h100-sxm")
    s.add_argument("--gpus", type=int, default=0, help="GPUs to use (default: all)")
    s.add_argument("--dry-run", action="store_true")
    s.set_defaults(func=_sweep)
    s = sub.add_parser("micro")
    s.add_argument("--out", required=True)
    s.add_argument("--hardware", default="h100-sxm")
    s.add_argument("--target", default="llama-3.1-8b")
    s.add_argument("--drafter", default="eagle3-llama-3.1-8b")
    s.add_argument("--batch", type=ints(1, 4096), default=[1, 8, 32, 64])
    s.add_argument("--tokens", type=ints(1, 1024), default=[1, 16, 64])
    s.add_argument("--context", type=ints(1, 1 << 20), default=[4096])
    s.add_argument(
        "--kernel-classes",
        action="store_true",
        help="also profile each verify-grid point's kernel time by class (spectune calibrate's)",
    )
    s.add_argument(
        "--draft-widths",
        type=ints(1, 1024),
        default=[1, 4, 10],
        help="the drafter's step at tp 1 over --batch x these frontier widths (rows 'draft', "
        "beside which the summary sets the split grids' drafter steps)",
    )
    s.set_defaults(func=_micro)
    s = sub.add_parser("merge")
    s.add_argument("run")
    s.add_argument("sweep")
    s.set_defaults(func=_merge)
    s = sub.add_parser("plan")
    s.add_argument("--calibration", required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--drafter", required=True)
    s.add_argument("--gpu", default="h100-sxm")
    s.add_argument("--tp", type=int, required=True)
    s.add_argument("--workload", default="mt-bench")
    s.add_argument("--batch", type=ints(1, 4096), default=[1, 8, 32, 64])
    s.add_argument("--context", type=int, default=4096)
    s.add_argument("--trials", type=int, default=48)
    s.add_argument("--out", required=True)
    s.set_defaults(func=_plan)
    s = sub.add_parser("run")
    s.add_argument("--tp", type=int, required=True)
    s.add_argument("--target", required=True)
    s.add_argument("--drafter", required=True)
    s.add_argument("--policy", default=None, help="planned PolicyTable (runs labelled 'planned')")
    s.add_argument("--also", action="append", default=[], metavar="LABEL=POLICY")
    s.add_argument(
        "--engine", action="append", default=[], help="also run this engine's default (repeatable)"
    )
    s.add_argument("--workload", default="mt-bench")
    s.add_argument("--hardware", default="h100-sxm")
    s.add_argument("--batch", type=ints(1, 4096), default=[1, 8, 32, 64])
    s.add_argument("--context", type=int, default=4096)
    s.add_argument("--steps", type=int, default=20)
    s.add_argument("--warmup", type=int, default=3)
    s.add_argument("--grid-batch", type=ints(1, 4096), default=[1, 8, 32, 64])
    s.add_argument("--grid-tokens", type=ints(1, 1024), default=[1, 16, 64])
    s.add_argument(
        "--draft-widths",
        type=ints(1, 1024),
        default=[1, 4, 10],
        help="drafter steps timed with and without collectives over grid batches x these widths",
    )
    s.add_argument("--out-grid", default="", help="verify-grid run document ('' : no grid)")
    s.add_argument("--out-measure", required=True)
    s.add_argument("--no-graphs", action="store_true", help="run eagerly (no CUDA graphs)")
    s.add_argument("--dry-run", action="store_true")
    s.set_defaults(func=_run)
    s = sub.add_parser("summary")
    s.add_argument("dir")
    s.set_defaults(func=_summary)
    args = p.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
