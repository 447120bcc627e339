"""`spectune fit-engine FILES... --engine E --target T --drafter D --gpu G --out profile.json`:
fit an engine profile's host overheads, and the drafter's acceptance, to what the engine
printed (server logs, /metrics scrapes, benchmark results; formats detected per file,
validate.engine_logs).

The files become engine-measurement documents (validate.engine_measure; written with
--measurements-out), their points are priced by the cost model (validate.engine_points), the
overheads are fitted by least squares (validate.engine_fit) and the acceptance from the
per-position rates or the mean accept lengths (validate.engine_acceptance; written with
--workload-out). Every fitted value is printed with its uncertainty, every observation with its
residual; parameters the data cannot determine are left at the preset's value with the
observations that would determine them (or refused, when named in --fit). Files are read
before anything is written; a failure writes nothing.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.cli.common import check_out_path, engine_option, int_range
from spectune.specs.errors import SpecError
from spectune.specs.io import write_json_atomic

if TYPE_CHECKING:
    from spectune.validate.engine_acceptance import AcceptanceFit
    from spectune.validate.engine_logs import EngineObservation

ENGINE_BASES = {"sglang": "sglang", "vllm": "vllm", "trtllm": "trtllm"}


def run(args: argparse.Namespace) -> int:
    from spectune.specs import load_hardware, load_model
    from spectune.specs.compat import drafter_kind
    from spectune.validate.engine_acceptance import fit_acceptance, workload_dict
    from spectune.validate.engine_fit import fit_overheads, format_fit, profile_document
    from spectune.validate.engine_measure import EngineRun, write_engine_measurement
    from spectune.validate.engine_points import points_from_files

    base = engine_option(args.base or ENGINE_BASES[args.engine])
    if base.engine != args.engine:
        raise SpecError(f"--base {base.name} is a {base.engine} profile, not {args.engine}")
    hw = load_hardware(args.gpu)
    target = load_model(args.target)
    drafter = None if args.drafter.lower() == "none" else load_model(args.drafter)
    check_out_path(args.out)
    if args.workload_out:
        check_out_path(args.workload_out, "--workload-out")
    if args.measurements_out:
        check_out_path(args.measurements_out, "--measurements-out", folder=True)
    params = None if args.fit == "auto" else [p.strip() for p in args.fit.split(",") if p.strip()]

    run_ = EngineRun(
        engine=args.engine,
        gpu=hw.name,
        tp=args.tp,
        workload=args.workload,
        batch=args.batch,
        input_len=args.input_len,
        output_len=args.output_len,
    )
    obs, docs, points, skipped = points_from_files(
        args.files, args.baseline, run_, base, target=target, drafter=drafter
    )
    for s in skipped:
        print(f"skipped {s.where}: {s.reason}")
    if not points:
        raise SpecError(
            "no observation with an output throughput that spectune can price: "
            + ("; ".join(f"{s.where}: {s.reason}" for s in skipped[:3]) or "none")
        )
    fit = fit_overheads(points, base.overheads, params=params)
    print(format_fit(fit))

    rates = [(o.per_position_accept, _drafts(o)) for o in obs if o.per_position_accept]
    acc = fit_acceptance(rates, points, drafter.drafter_kind if drafter else None)
    _print_acceptance(acc)
    src = f"{args.engine} output: {', '.join(args.files)}"
    wl = acc.workload(
        args.workload_name, target=target.name, drafter=drafter_kind(drafter), source=src
    )
    if args.workload_out and wl is None:
        raise SpecError(
            "--workload-out: the files have neither per-position acceptance rates nor "
            "speculative accept lengths with a model drafter"
        )

    # everything computed: write
    write_json_atomic(args.out, profile_document(fit, base.name, data=list(args.files)))
    print(f"wrote {args.out} (engine profile, base {base.name})")
    if args.workload_out and wl is not None:
        write_json_atomic(args.workload_out, workload_dict(wl))
        print(f"wrote {args.workload_out} (workload {wl.name}, {wl.acceptance} acceptance)")
    if args.measurements_out:
        out = Path(args.measurements_out)
        out.mkdir(parents=True, exist_ok=True)
        for i, d in enumerate(docs):
            name = f"{args.engine}-{Path(d['source']['files'][0]).stem}-{i}.json"
            write_engine_measurement(d, out / name)
        print(f"wrote {len(docs)} engine measurement documents to {out}{os.sep}")
    return 0


def _print_acceptance(acc: AcceptanceFit) -> None:
    if acc.by_batch:
        shown = ", ".join(f"B={b}: {m:.3f} (n={n})" for b, m, n in acc.by_batch)
        print(f"\naccept length by batch: {shown}")
    if acc.positional is not None:
        pos = acc.positional
        rates = ", ".join(
            f"{a:.3f}" + ("" if math.isnan(s) else f"+/-{s:.3f}")
            for a, s in zip(pos.reach, pos.sigma, strict=True)
        )
        print(
            f"per-position acceptance: {rates} -> accept length {pos.accept_length:.3f} "
            f"for a chain of {len(pos.reach)}"
        )
    if acc.scale is not None:
        sc = acc.scale
        sig = "undetermined (one configuration)" if math.isnan(sc.sigma) else f"{sc.sigma:.4f}"
        print(f"confidence scale ({sc.kind}): {sc.scale:.4f} +/- {sig}")
        for c, pr in zip(sc.configs, sc.predicted, strict=True):
            print(
                f"  steps/topk/tokens {c.label}: measured {c.accept_length:.3f}, "
                f"predicted {pr:.3f} ({pr / c.accept_length - 1:+.1%})"
            )


def _drafts(o: EngineObservation) -> int | None:
    """Drafts behind an observation's per-position rates: counted, or draft tokens / K."""
    k = len(o.per_position_accept)
    if o.drafts:
        return o.drafts
    return o.draft_tokens // k if o.draft_tokens and k else None


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit-engine",
        help="fit an engine profile's overheads and the drafter's acceptance to engine output",
    )
    p.add_argument("files", nargs="+", help="engine logs, /metrics scrapes or benchmark results")
    p.add_argument("--engine", required=True, choices=sorted(ENGINE_BASES), help="engine")
    p.add_argument("--target", required=True, help="target model preset or config")
    p.add_argument("--drafter", required=True, help="drafter model preset or config, or 'none'")
    p.add_argument("--gpu", required=True, help="GPU preset or spec file")
    p.add_argument("--tp", type=int_range(1, 64), help="tensor-parallel degree (default: stated)")
    p.add_argument("--out", required=True, help="engine profile JSON to write")
    p.add_argument("--workload-out", help="workload JSON to write (fitted acceptance)")
    p.add_argument("--measurements-out", help="folder for the engine measurement documents")
    p.add_argument(
        "--base", help="engine preset (or profile file) the fit starts from (default: --engine)"
    )
    p.add_argument(
        "--fit",
        default="auto",
        help="overhead parameters to fit, comma-separated (iteration_s, per_request_s, "
        "spec_iteration_s, per_draft_step_s, tree_s, tp_growth, and per drafter kind "
        "drafter_step_s.KIND / drafter_iteration_s.KIND, e.g. drafter_step_s.eagle3), or "
        "'auto': every one the data determine, drafter kinds only where the base profile lists "
        "them (default)",
    )
    p.add_argument(
        "--baseline",
        nargs="+",
        default=[],
        help="files of the same engine with speculation off (a no-speculation baseline)",
    )
    p.add_argument("--workload", help="workload preset the runs served (context and acceptance)")
    p.add_argument("--workload-name", default="engine-fitted", help="name of the fitted workload")
    p.add_argument("--batch", type=int_range(1, 1 << 20), help="batch of one-batch results")
    p.add_argument("--input-len", type=int_range(1, 1 << 24), help="prompt tokens per request")
    p.add_argument("--output-len", type=int_range(1, 1 << 24), help="output tokens per request")
    p.set_defaults(func=run)
