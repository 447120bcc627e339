"""`spectune calibrate`: micro-benchmark this GPU (GEMMs by token count and shape, attention by
batch/context/tree size, per-step overhead, whole verify passes) and fit the cost model's
Calibration to them.

    spectune calibrate --gpu h100-sxm --out measurements/calibration-h100-sxm.json
    spectune calibrate --from-run calibrate-run.json --measurements run.json --out cal.json   (CPU)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from spectune.cli.common import check_out_path, ints
from spectune.specs import SpecError, load_hardware, load_model, write_json_atomic
from spectune.specs.io import loads_json, read_bytes_bounded


def _read(path: str) -> dict[str, Any]:
    """A JSON document within the reading bounds (specs.io), as a dict."""
    p = Path(path)
    doc = loads_json(read_bytes_bounded(p), str(p))
    if not isinstance(doc, dict):
        raise SpecError(f"{p}: expected a JSON object at the top level, got {type(doc).__name__}")
    return doc


def run(args: argparse.Namespace) -> int:
    from spectune.validate.fit import fit_calibration
    from spectune.validate.measure import validate_calibration_run, validate_measurement

    check_out_path(args.out)
    if args.raw_out is not None:
        check_out_path(args.raw_out, "--raw-out")
    measurements = [_read(m) for m in args.measurements]
    for path, doc in zip(args.measurements, measurements, strict=True):
        validate_measurement(doc, path)
    if args.from_run:
        raw = _read(args.from_run)
        validate_calibration_run(raw, args.from_run)
    else:
        import torch

        from spectune.executor.calibrate import calibration_run
        from spectune.executor.session import Session, SessionConfig, require_cuda
        from spectune.validate.measure import gpu_hardware_name

        device = require_cuda()
        name = torch.cuda.get_device_name(device)
        hardware = load_hardware(args.gpu).name if args.gpu else gpu_hardware_name(name)
        if args.gpu and gpu_hardware_name(name) != hardware:
            raise SpecError(f"--gpu {args.gpu} but this machine's GPU is {name!r}")
        cfg = SessionConfig(max(args.batch), max(args.context), max(args.tokens))
        session = Session(load_model(args.target), load_model(args.drafter), cfg, device)
        raw = calibration_run(
            session,
            gpu=name,
            hardware=hardware,
            batches=args.batch,
            tokens=args.tokens,
            contexts=args.context,
        )
        if args.raw_out:
            write_json_atomic(args.raw_out, raw)
    cal, report = fit_calibration(raw, measurements)
    cal.save(args.out)
    for k, v in report.items():
        print(f"{k:<32} {v}")
    print(f"wrote {args.out}")
    return 0


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
