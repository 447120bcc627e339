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
import statistics
from collections import defaultdict
from pathlib import Path

from spectune.cli.common import check_out_path, engine_option, int_range
from spectune.specs.errors import SpecError
from spectune.specs.io import write_json_atomic

ENGINE_BASES = {"sglang": "sglang", "vllm": "vllm", "trtllm": "trtllm"}


def run(args: argparse.Namespace) -> int:
    from spectune.specs import load_hardware, load_model
    from spectune.validate.engine_acceptance import (
        ConfigAccept,
        fit_positional,
        fit_scale,
        positional_workload,
        scale_workload,
        workload_dict,
    )
    from spectune.validate.engine_fit import fit_overheads, format_fit, profile_document
    from spectune.validate.engine_logs import iter_observations
    from spectune.validate.engine_measure import EngineRun, engine_measurement_docs
    from spectune.validate.engine_points import points_from_document

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

    obs = list(iter_observations(args.files, require_speculative=True))
    if args.baseline:
        obs += list(iter_observations(args.baseline, require_speculative=False))
    stated = next((o.config.target_model for o in obs if o.config.target_model), None)
    run_ = EngineRun(
        engine=args.engine,
        gpu=hw.name,
        target=None if stated else (target.hf_repo or target.name),
        tp=args.tp,
        workload=args.workload,
        batch=args.batch,
        input_len=args.input_len,
        output_len=args.output_len,
    )
    docs = engine_measurement_docs(obs, run_, notes="spectune fit-engine")
    points, skipped = [], []
    for i, d in enumerate(docs):
        d["target_preset"] = target.name
        if d["spec"] is not None and drafter is not None:
            d["drafter_preset"] = drafter.name
        src = ", ".join(d["source"]["files"])
        p, s = points_from_document(d, f"{src} [{i}]", base)
        points += p
        skipped += s
    for s in skipped:
        print(f"skipped {s.where}: {s.reason}")
    if not points:
        raise SpecError(
            "no observation with an output throughput that spectune can price: "
            + ("; ".join(f"{s.where}: {s.reason}" for s in skipped[:3]) or "none")
        )
    fit = fit_overheads(points, base.overheads, params=params)
    print(format_fit(fit))

    # acceptance: per-position rates, else mean accept length per configuration
    spec_pts = [p for p in points if p.speculative and p.accept_measured]
    rates = [(o.per_position_accept, _drafts(o)) for o in obs if o.per_position_accept]
    by_batch: dict[int, list[float]] = defaultdict(list)
    for p in spec_pts:
        by_batch[p.batch].append(p.accept_length)
    if by_batch:
        print("\naccept length by batch: " + ", ".join(
            f"B={b}: {statistics.fmean(v):.3f} (n={len(v)})" for b, v in sorted(by_batch.items())
        ))
    wl = None
    src = f"{args.engine} output: {', '.join(args.files)}"
    if rates:
        pos = fit_positional(rates)
        print(
            "per-position acceptance: "
            + ", ".join(
                f"{a:.3f}" + ("" if math.isnan(s) else f"+/-{s:.3f}")
                for a, s in zip(pos.reach, pos.sigma, strict=True)
            )
            + f" -> accept length {pos.accept_length:.3f} for a chain of {len(pos.reach)}"
        )
        wl = positional_workload(
            pos, args.workload_name, target=target.name, drafter=_kind(drafter), source=src
        )
    if spec_pts and drafter is not None:
        groups: dict[object, list[float]] = defaultdict(list)
        for p in spec_pts:
            if p.policy is not None:
                groups[p.policy].append(p.accept_length)
        configs = [
            ConfigAccept(
                f"{pol.depth}/{pol.topk}/{pol.budget}", pol, statistics.fmean(v), float(len(v))
            )
            for pol, v in groups.items()  # type: ignore[misc]
        ]
        sc = fit_scale(configs, drafter.drafter_kind)
        sig = "undetermined (one configuration)" if math.isnan(sc.sigma) else f"{sc.sigma:.4f}"
        print(f"confidence scale ({sc.kind}): {sc.scale:.4f} +/- {sig}")
        for c, pr in zip(sc.configs, sc.predicted, strict=True):
            print(
                f"  steps/topk/tokens {c.label}: measured {c.accept_length:.3f}, "
                f"predicted {pr:.3f} ({pr / c.accept_length - 1:+.1%})"
            )
        if wl is None:
            wl = scale_workload(
                sc, args.workload_name, target=target.name, drafter=_kind(drafter), source=src
            )
    if args.workload_out and wl is None:
        raise SpecError(
            "--workload-out: the files have neither per-position acceptance rates nor "
            "speculative accept lengths with a model drafter"
        )

    # everything computed: write
    profile = profile_document(fit, base.name, data=[str(f) for f in args.files])
    write_json_atomic(args.out, profile)
    print(f"wrote {args.out} (engine profile, base {base.name})")
    if args.workload_out and wl is not None:
        write_json_atomic(args.workload_out, workload_dict(wl))
        print(f"wrote {args.workload_out} (workload {wl.name}, {wl.acceptance} acceptance)")
    if args.measurements_out:
        from spectune.validate.engine_measure import write_engine_measurement

        out = Path(args.measurements_out)
        out.mkdir(parents=True, exist_ok=True)
        for i, d in enumerate(docs):
            name = f"{args.engine}-{Path(d['source']['files'][0]).stem}-{i}.json"
            write_engine_measurement(d, out / name)
        print(f"wrote {len(docs)} engine measurement documents to {out}{os.sep}")
    return 0


def _drafts(o: object) -> int | None:
    """Drafts behind an observation's per-position rates: counted, or draft tokens / K."""
    drafts, tokens, k = o.drafts, o.draft_tokens, len(o.per_position_accept)  # type: ignore[attr-defined]
    return drafts if drafts else (tokens // k if tokens and k else None)


def _kind(drafter: object) -> str:
    from spectune.specs.compat import drafter_kind

    return drafter_kind(drafter)  # type: ignore[arg-type]


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
        "spec_iteration_s, per_draft_step_s, tree_s, tp_growth), or 'auto': every one the "
        "data determine (default)",
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
