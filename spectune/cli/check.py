"""`spectune check`: the CI regression gate. Re-predicts every committed measurement with the
current cost model (+ the calibration committed beside it) and fails when a predicted speedup or
the verify-latency MAPE drifts past tolerance, or when an engine's predicted tokens/s or accept
length (engine measurement documents, with the engine's preset or a fitted profile) drifts past
its MAPE limit. CPU only; needs no torch.

    spectune check measurements/
    spectune check measurements/ --engine-profile vllm=fitted-vllm.json
"""

from __future__ import annotations

import argparse

from spectune.cli.common import float_range
from spectune.specs.errors import SpecError


def run(args: argparse.Namespace) -> int:
    from spectune.specs.engine import load_engine
    from spectune.validate.check import check_folder, format_check

    profiles = {}
    for item in args.engine_profile:
        engine, sep, path = item.partition("=")
        if not sep or not path:
            raise SpecError(f"--engine-profile {item}: expected ENGINE=PROFILE, e.g. vllm=fit.json")
        try:
            prof = load_engine(path)
        except SpecError as e:
            raise SpecError(f"--engine-profile {item}: {e}") from None
        if prof.engine != engine:
            raise SpecError(f"--engine-profile {item}: the profile is for {prof.engine}")
        profiles[engine] = prof
    res = check_folder(args.folder, profiles)
    tols = (args.speedup_tol, args.mape_tol, args.engine_tol, args.accept_tol)
    print(format_check(res, *tols))
    return 0 if res.passed(*tols) else 1


def register(sub: argparse._SubParsersAction) -> None:
    from spectune.validate.check import ACCEPT_TOL, ENGINE_TOL

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
    p.add_argument(
        "--engine-tol",
        type=float_range(0, 10),
        default=ENGINE_TOL,
        help=f"largest allowed per-engine tokens/s MAPE (default {ENGINE_TOL})",
    )
    p.add_argument(
        "--accept-tol",
        type=float_range(0, 10),
        default=ACCEPT_TOL,
        help=f"largest allowed per-engine accept-length MAPE (default {ACCEPT_TOL})",
    )
    p.add_argument(
        "--engine-profile",
        action="append",
        default=[],
        metavar="ENGINE=PROFILE",
        help="predict ENGINE's documents with this profile (preset or fit-engine output); "
        "default: the preset named by the engine",
    )
    p.set_defaults(func=run)
