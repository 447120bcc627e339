"""`spectune calibrate`: micro-benchmark this GPU (copy and read bandwidth, matmul rate, GEMMs by token
count and shape, attention by batch/context/tree size, per-step overhead, whole verify passes,
a short speculative run per tree builder) and fit the cost model's Calibration to them, every
efficiency bounded by the measured read or copy bandwidth and matmul rate. The report lists the fitted
values beside those ceilings and which parameters the data determined.

    spectune calibrate --gpu h100-sxm --out measurements/calibration-h100-sxm.json
    spectune calibrate --from-run calibrate-run.json --measurements run.json --out cal.json   (CPU)
    spectune calibrate --tp 4 --target llama-3.1-70b --drafter eagle3-llama-3.1-70b \
        --base cal.json --raw-out verify-tp4.json --out cal-tp4.json

On a host of several GPUs the one-GPU run also times all-reduces by message size on 2, 4, ...
of them, and the fit adds the interconnect terms (spectune.validate.fit.fit_interconnect).
With --tp N the verify grid runs with the target split over N GPUs (spectune.executor.tp), each
point also without its collectives; that run is for `spectune check` (it records "tp"), and
its calibration is --base with the interconnect terms refitted to its all-reduces (--base's
kept where the run has none, as in benchmarks/bench_tp.py's verify-tpN.json), and the
all-reduce law at N moved, message size by message size, by what each costs inside the split
forward beyond (or short of) it (spectune.validate.fit.fit_inforward_offset); then the
weight-GEMM time at N of models of the target's hidden size is scaled, row count by row count,
to what the grid's forwards measured (Calibration.tp_gemm_scale,
spectune.validate.fit.fit_tp_gemm_scale).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path
from typing import Any

from spectune.cli.common import check_out_path, int_range, ints
from spectune.specs import SpecError, load_hardware, load_model, load_workload, write_json_atomic
from spectune.specs.calibration import Calibration
from spectune.specs.io import loads_json, read_bytes_bounded


def _read(path: str) -> dict[str, Any]:
    """A JSON document within the reading bounds (specs.io), as a dict."""
    p = Path(path)
    doc = loads_json(read_bytes_bounded(p), str(p))
    if not isinstance(doc, dict):
        raise SpecError(f"{p}: expected a JSON object at the top level, got {type(doc).__name__}")
    return doc


def run(args: argparse.Namespace) -> int:
    from spectune.validate.fit import (
        fit_calibration,
        fit_inforward_offset,
        fit_interconnect,
        fit_tp_gemm_scale,
    )
    from spectune.validate.measure import doc_tp, validate_calibration_run, validate_measurement

    if args.dry_run and args.tp == 1:
        raise SpecError("--dry-run runs the ranks of --tp N (N > 1) on CPU; pass --tp")
    check_out_path(args.out)
    if args.raw_out is not None:
        check_out_path(args.raw_out, "--raw-out")
    base = Calibration.load(args.base) if args.base else None
    if args.report is not None:
        check_out_path(args.report, "--report")
    measurements = [_read(m) for m in args.measurements]
    for path, doc in zip(args.measurements, measurements, strict=True):
        validate_measurement(doc, path)
    if args.from_run:
        raw = _read(args.from_run)
        validate_calibration_run(raw, args.from_run)
    elif args.tp > 1:
        raw = _tp_run(args)
    else:
        raw = _one_gpu_run(args)
    if args.raw_out and not args.from_run:
        write_json_atomic(args.raw_out, raw)
    if doc_tp(raw, args.from_run or "the run") > 1:
        # a split target's verify grid is checked, not fitted: the efficiencies are one GPU's
        # (--base); the run's all-reduces refit the interconnect terms (a grid timed without
        # its own sweep, as benchmarks/bench_tp.py writes it, keeps --base's), and its grid
        # (timed with and without the collectives) gives what each costs inside the forward
        swept = any(r.get("op") == "all_reduce" for r in raw.get("collectives", []))
        if not swept and base is None:
            raise SpecError(
                f"{args.from_run or 'the run'}: a split run without all-reduce rows "
                '("collectives") refits no interconnect terms; pass --base, the calibration '
                "whose all-reduce law its grid shifts"
            )
        cal = base or Calibration()
        report: dict[str, Any] = {"interconnect": "--base's (the run has no all-reduce rows)"}
        if swept:
            cal, report = fit_interconnect(raw["collectives"], raw["hardware"], cal)
        # and what an all-reduce costs inside the split forward against the sweep's law (either sign)
        target, drafter = load_model(args.target), load_model(args.drafter)
        if (target.name, drafter.name) != (raw["target"], raw["drafter"]):  # --from-run
            target, drafter = load_model(raw["target"]), load_model(raw["drafter"])
        cal, offset = fit_inforward_offset(raw, cal, target=target, drafter=drafter)
        if offset is not None:
            report["inforward_allreduce"] = offset
        # then what the shard's weight GEMMs cost by row count against their price
        cal, scale = fit_tp_gemm_scale(raw, cal, target=target, drafter=drafter)
        if scale is not None:
            report["tp_gemm_scale"] = scale
    else:
        t = time.perf_counter()
        cal, report = fit_calibration(raw, measurements, base=base)
        print(f"[fit: {time.perf_counter() - t:.1f} s]", flush=True)
    cal.save(args.out)
    if args.report:
        write_json_atomic(args.report, report)
    print(format_report(report))
    print(f"wrote {args.out}")
    return 0


def _one_gpu_run(args: argparse.Namespace) -> dict[str, Any]:
    """The micro-benchmarks on GPU 0; on a host of several GPUs first the collectives sweep
    over 2, 4, ... of them (the interconnect terms' data)."""
    import torch

    from spectune.executor.calibrate import calibration_run, lap
    from spectune.executor.session import Session, SessionConfig, require_cuda

    device = require_cuda()
    name = torch.cuda.get_device_name(device)
    hardware = _hardware(args, name)
    rows = _sweep(hardware) if torch.cuda.device_count() > 1 and not args.no_collectives else []
    from spectune.executor.calibrate import SPEC_BATCHES, SPEC_POLICIES
    from spectune.executor.sources import cache_slots
    from spectune.planner.acceptance import acceptance_model

    target, drafter = load_model(args.target), load_model(args.drafter)
    wl = None if args.no_spec_runs else load_workload(args.workload, target=target, drafter=drafter)
    acc = None if wl is None else acceptance_model(wl)
    spec_batches = [] if acc is None else list(args.spec_batches or SPEC_BATCHES)
    slots = [cache_slots(p, acc, b) for p in SPEC_POLICIES for b in spec_batches]
    cfg = SessionConfig(
        max([*args.batch, *spec_batches]), max(args.context), max([*args.tokens, *slots])
    )
    t = time.perf_counter()
    session = Session(load_model(args.target), load_model(args.drafter), cfg, device)
    lap("models built, GEMM plan autotuned", t)
    raw = calibration_run(
        session,
        gpu=name,
        hardware=hardware,
        batches=args.batch,
        tokens=args.tokens,
        contexts=args.context,
        acceptance=acc,
        workload=args.workload,
        spec_batches=spec_batches,
        spec_steps=args.spec_steps,
        kernel_classes=args.kernel_classes,
    )
    if rows:
        raw["collectives"] = rows
    return raw


def _hardware(args: argparse.Namespace, gpu_name: str) -> str:
    from spectune.validate.measure import gpu_hardware_name

    hardware = load_hardware(args.gpu).name if args.gpu else gpu_hardware_name(gpu_name)
    if args.gpu and gpu_name != "cpu" and gpu_hardware_name(gpu_name) != hardware:
        raise SpecError(f"--gpu {args.gpu} but this machine's GPU is {gpu_name!r}")
    return hardware


def _sweep(hardware: str) -> list[dict[str, Any]]:
    """All-reduce (and reduce-scatter + all-gather, all-gather, broadcast) seconds by message
    size on 2, 4, ... GPUs of this host (spectune.executor.collectives.collective_sweep: small
    all-reduces timed after the GEMM that writes them, as a forward runs them)."""
    import tempfile

    import torch

    from spectune.executor.collectives import launch
    from spectune.executor.tp_jobs import CalibrateJob, calibrate_rank, read_sweep, sweep_tps

    tps = sweep_tps(torch.cuda.device_count())
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "sweep.json")
        launch(calibrate_rank, tps[-1], (CalibrateJob(out, hardware, tps),), backend="nccl")
        rows = read_sweep(out)
    for r in rows:
        if r["op"] == "all_reduce":
            print(
                f"  all_reduce tp{r['tp']} {r['bytes']:>10} B {r['seconds'] * 1e6:9.1f} us "
                f"busbw {r['busbw_gb_s']:6.1f} GB/s ({r.get('pattern', 'back_to_back')})",
                flush=True,
            )
    return rows


def _tp_run(args: argparse.Namespace) -> dict[str, Any]:
    """The verify grid with the target split over --tp GPUs (also without its collectives) and
    the collectives sweep on them, as a calibration-run document with "tp"."""
    import tempfile

    import torch

    from spectune.executor.collectives import launch
    from spectune.executor.tp_jobs import CalibrateJob, calibrate_rank, sweep_tps

    gpu = (
        "cpu"
        if args.dry_run
        else torch.cuda.get_device_name(0)
        if torch.cuda.is_available()
        else ""
    )
    if not gpu:
        from spectune.executor.session import require_cuda

        require_cuda()
    hardware = _hardware(args, gpu)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "run.json")
        job = CalibrateJob(
            out, hardware, sweep_tps(args.tp), load_model(args.target), load_model(args.drafter),
            tuple(args.batch), tuple(args.tokens), tuple(args.context),
            use_graphs=not args.dry_run,
        )  # fmt: skip
        if args.dry_run:  # gloo on CPU: two small messages, two replays
            job = dataclasses.replace(job, sizes=(4096, 65536), reps=2)
        launch(calibrate_rank, args.tp, (job,), backend="gloo" if args.dry_run else "nccl")
        return _read(out)


def format_report(report: dict[str, Any]) -> str:
    """The fit report as lines: each parameter with its bound and status, each efficiency as a
    fraction of its measured ceiling, the fixed costs fitted or left at their defaults, MAPEs."""
    ident = report.get("identified", {})
    status = {n: s for s in ("determined", "at_bound", "weak") for n in ident.get(s, [])}
    bounds = report.get("bounds", {})
    lines = []
    if bounds.get("copy_bytes_per_s"):
        lines.append(
            f"measured ceilings: copy {bounds['copy_bytes_per_s'] / 1e12:.2f} TB/s "
            f"({bounds['copy_fraction_of_peak']:.1%} of peak), read "
            f"{bounds.get('read_fraction_of_peak', bounds['copy_fraction_of_peak']):.1%} of peak, matmul "
            f"{(bounds.get('matmul_flops') or 0) / 1e12:.0f} TFLOP/s "
            f"({bounds['matmul_fraction_of_peak']:.1%} of peak)"
        )
    lines.append(f"{'parameter':<28} {'fitted':>12} {'of ceiling':>10} {'rel s.e.':>9}  status")
    for name, v in report.get("params", {}).items():
        b = bounds.get(name)
        of = f"{b['of_ceiling']:>10.1%}" if isinstance(b, dict) else f"{'':>10}"
        se = ident.get("rel_se", {}).get(name)
        se_text = f"{se:>9.2g}" if se is not None else f"{'-':>9}"
        lines.append(f"{name:<28} {v:>12.4g} {of} {se_text}  {status.get(name, '')}")
    stream = report.get("weight_stream")
    if isinstance(stream, dict):
        held = (
            f"held there; gemm_fixed_s held at {report.get('gemm_fixed_us', 0.0):.2f} us, what "
            "a GEMM keeps inside a forward"
            if stream.get("held")
            else "not held"
        )
        lines.append(
            f"GEMM micro-benchmarks: weights stream at {stream['bytes_per_s'] / 1e12:.2f} TB/s "
            f"(a read: the read ceiling takes it), fixed part {stream['fixed_us']:.2f} us per GEMM "
            f"timed alone with its launch, {stream.get('exposed', 0.0):.3f} of the math at peak "
            f"exposed (gemm_exposed_compute {held})"
        )
    tile = report.get("ragged_tile_m")
    if isinstance(tile, dict):
        ssr = ", ".join(f"{t}: {v:.3g}" for t, v in tile["ssr"].items())
        state = "determined" if tile["determined"] else "weak (kept)"
        lines.append(
            f"{'ragged_tile_m':<28} {tile['chosen']:>12} {'':>10} {'-':>9}  {state}; "
            f"squared log error by tile over {tile['rows']} shared-budget rows: {ssr}"
        )
    over = report.get("overheads", {})
    if over:
        lines.append(f"fixed costs fitted: {', '.join(over.get('fitted', [])) or '-'}")
        lines.append(f"fixed costs at defaults: {', '.join(over.get('default', [])) or '-'}")
    off = report.get("inforward_allreduce")
    if isinstance(off, dict):
        lines.append(
            f"all-reduce inside the split forward: {off['offset_us']:+.2f} us against the sweep's "
            f"law at tp {off['tp']} (median of {off['points']} grid points, interquartile range "
            f"{off['spread_us']:.2f} us); added to that law's latency by message size"
        )
        by_size = off.get("by_size") or []
        if by_size:
            lines.append(
                "  by size (points): "
                + ", ".join(
                    f"{_bytes(b['bytes'])} {b['offset_us']:+.1f} us ({b['points']})"
                    for b in by_size
                )
            )
    scale = report.get("tp_gemm_scale")
    if isinstance(scale, dict) and scale.get("by_rows"):
        lines.append(
            f"weight GEMMs at tp {scale['tp']} (hidden {scale['hidden']}) against their price, "
            "by rows (points): "
            + ", ".join(
                f"{b['rows']:g} x{b['scale']:.3f} ({b['points']})" for b in scale["by_rows"]
            )
        )
    shown = {
        "identified", "bounds", "params", "overheads", "ragged_tile_m", "weight_stream",
        "inforward_allreduce", "tp_gemm_scale",
    }  # fmt: skip
    for k, v in report.items():
        if k.startswith("mape_") or k == "rows" or (k not in shown and "params" not in report):
            lines.append(f"{k:<32} {v:.4g}" if isinstance(v, float) else f"{k:<32} {v}")
    return "\n".join(lines)


def _bytes(n: float) -> str:
    """A message size as the sweep names them: B, KiB or MiB."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "calibrate", help="micro-benchmark this GPU and fit the cost model's calibration"
    )
    p.add_argument(
        "--gpu", default=None, help="HardwareSpec preset of this GPU (default: from its name)"
    )
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument(
        "--raw-out", default=None, help="also write the raw micro-benchmark document here"
    )
    p.add_argument(
        "--from-run", default=None, help="fit from a saved calibration-run document (CPU)"
    )
    p.add_argument(
        "--measurements",
        action="append",
        default=[],
        metavar="FILE",
        help="measurement JSONs (spectune execute) whose phases join the fit (repeatable)",
    )
    p.add_argument(
        "--tp",
        type=int_range(1, 64),
        default=1,
        help="time the verify grid with the target split over this many GPUs (one process "
        "each); the fit then keeps --base's efficiencies and refits the interconnect terms",
    )
    p.add_argument(
        "--base",
        default=None,
        help="calibration whose fields the fit starts from (with --tp: keeps all but the "
        "interconnect terms)",
    )
    p.add_argument(
        "--no-collectives",
        action="store_true",
        help="skip the all-reduce sweep on a host of several GPUs",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --tp: run the ranks on CPU over gloo (tiny models; tests the launch, not timing)",
    )
    p.add_argument(
        "--report", default=None, help="also write the fit report (bounds, determined) here"
    )
    p.add_argument(
        "--workload",
        default="mt-bench",
        help="workload driving the speculative runs' synthetic acceptance (default mt-bench)",
    )
    p.add_argument(
        "--spec-steps",
        type=int_range(1, 10_000),
        default=20,
        help="timed steps per speculative run (default 20)",
    )
    p.add_argument(
        "--spec-batches",
        type=ints(1, 4096),
        default=None,
        help="batches of the speculative runs (default 1,8,32)",
    )
    p.add_argument(
        "--no-spec-runs",
        action="store_true",
        help="skip the speculative runs per tree builder (the fixed costs keep their defaults)",
    )
    p.add_argument(
        "--kernel-classes",
        action="store_true",
        help="also profile each verify-grid forward by kernel class (weight GEMMs + logits, "
        "attention; about 1.7 s per grid point): reported beside the fit, not fitted",
    )
    p.add_argument("--target", default="llama-3.1-8b", help="target model preset/file")
    p.add_argument("--drafter", default="eagle3-llama-3.1-8b", help="drafter preset/file")
    p.add_argument(
        "--batch", type=ints(1, 4096), default=[1, 4, 16, 64], help="verify-grid batches"
    )
    p.add_argument(
        "--tokens", type=ints(1, 1024), default=[1, 16, 64, 128], help="verify-grid tree tokens"
    )
    p.add_argument(
        "--context", type=ints(1, 1 << 20), default=[512, 4096], help="verify-grid contexts"
    )
    p.set_defaults(func=run)
