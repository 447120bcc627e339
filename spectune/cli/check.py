"""`spectune check`: the CI regression gate. Re-predicts every committed measurement with the
current cost model (+ the calibration committed beside it) and fails when a predicted speedup or
the verify-latency MAPE drifts past tolerance. CPU only; needs no torch.

    spectune check measurements/
"""

from __future__ import annotations

import argparse

from spectune.cli.common import float_range


def run(args: argparse.Namespace) -> int:
    from spectune.validate.check import check_folder, format_check

    res = check_folder(args.folder)
    print(format_check(res, args.speedup_tol, args.mape_tol))
    return 0 if res.passed(args.speedup_tol, args.mape_tol) else 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("check", help="re-predict committed measurements; exit 1 on drift (CI gate)")
    p.add_argument("folder", nargs="?", default="measurements", help="folder of measurement JSONs")
    p.add_argument(
        "--speedup-tol",
        type=float_range(0, 10),
        default=0.10,
        help="largest allowed |predicted/measured - 1| of any speedup (default 0.10)",
    )
    p.add_argument(
        "--mape-tol",
        type=float_range(0, 10),
        default=0.10,
        help="largest allowed verify-latency MAPE (default 0.10)",
    )
    p.set_defaults(func=run)
