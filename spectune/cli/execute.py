"""`spectune execute`: run a policy table (or one policy) on this machine's GPU and write the
measurement JSON: per-phase ms, accepted lengths, tokens/s with and without speculation, speedup.

    spectune execute --policy policy.json --batch 1,8,32,64 --context 4096 --out run.json
    spectune execute --policy dynamic-topk:5,4,8 --also dynamic-topk:7,10,60 --batch 1,64
    spectune execute --policy dynamic-topk:5,4,8 --acceptance-trace data/traces/smollm2-mtbench.jsonl.gz
    spectune execute --policy p70.json --target llama-3.1-70b --tp 4     # 4 GPUs, one process each

With a policy file, the target, drafter and workload are its scenario's; a flag that changes
one of them says so in one line, and so does a GPU or TP other than the one it was planned for.

Every policy the planner emits runs: dynamic or static trees, pruned or not, ECHO's shared verify
budget, grafting. Acceptance is synthetic (random weights): drawn from the workload's acceptance
model, or with --acceptance-trace from a recorded trace (spectune.trace/v1): the candidate banks
are the recorded steps' draft probabilities of each expanded node's children with their 0/1
outcome against the target's token (planner.acceptance.TraceReplay), so each drafted node
replays one recorded node's children, and grafted tokens are accepted with the trace's own
retrieval statistics (traces.fit.fit_retrieval over its recorded retrieval candidates).

All policies at one batch see the same acceptance draws (common random numbers, executor/
draws.py). `--repeat R` measures each policy R times on R independent draw streams; the output
reports each policy's run-to-run spread beside every comparison with the batch's first policy.

With --tp N the target and the drafter are split over N GPUs of this host
(spectune.executor.tp: column/row-parallel layers, all-reduces, vocab-parallel LM heads); the
command spawns one process per GPU itself and the document records "tp": N, which
`spectune check` prices at that degree.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from spectune.cli.common import (
    check_out_path,
    int_range,
    ints,
    positive,
    scenario_with_flags,
)
from spectune.planner.space import check_runnable
from spectune.specs import (
    PolicyTable,
    Scenario,
    SpecError,
    TreePolicy,
    load_model,
    write_json_atomic,
)

if TYPE_CHECKING:
    from spectune.planner.acceptance import RetrievalProfile
    from spectune.specs.trace import TraceStep


def read_gemm_plan(path: str) -> tuple[dict[str, str], str | None]:
    """The "gemm_plan" of the document at `path` (a calibrate run or a measurement), read
    bounded and validated (specs.kernel_plan), and the GPU the document names ("gpu"); a
    SpecError when it has no plan."""
    from spectune.specs.io import loads_json, read_bytes_bounded
    from spectune.specs.kernel_plan import parse_plan

    doc = loads_json(read_bytes_bounded(path), path)
    if not isinstance(doc, dict) or not doc.get("gemm_plan"):
        raise SpecError(
            f"{path}: no 'gemm_plan' to run (documents of spectune calibrate --raw-out and "
            "spectune execute record the GEMM variants their process ran)"
        )
    parse_plan(doc["gemm_plan"], path)
    gpu = doc.get("gpu")
    return dict(doc["gemm_plan"]), gpu if isinstance(gpu, str) else None


def parse_policy_arg(text: str) -> tuple[PolicyTable | None, TreePolicy | None]:
    """A policy file (PolicyTable JSON) or the inline 'builder:DEPTH,TOPK,BUDGET' form; 'off'."""
    if text == "off":
        return None, None
    if ":" in text and not Path(text).exists():
        return None, TreePolicy.parse(text)
    return PolicyTable.load(text), None


def scenario_of(args: argparse.Namespace, table: PolicyTable | None) -> Scenario:
    """The scenario to run: the policy file's own (an old file without a workload: the
    default workload), else the defaults, with --target/--drafter/--workload on top (each one
    that changes a policy file's prints a line)."""
    flags = {
        name: getattr(args, name)
        for name in ("target", "drafter", "workload")
        if getattr(args, name) is not None
    }
    if table is None:
        return scenario_with_flags(Scenario(), flags, None)
    base = table.scenario
    if not base.workload:
        base = base.replace(workload=Scenario().workload)
    return scenario_with_flags(base, flags, args.policy)


def trace_retrieval(steps: Sequence[TraceStep]) -> RetrievalProfile:
    """The retrieval profile of a recorded trace (rho by match length and the root's match-length
    probabilities, traces.fit.fit_retrieval): the acceptance of grafted tokens under
    --acceptance-trace."""
    import numpy as np

    from spectune.planner.acceptance import RetrievalProfile
    from spectune.traces.fit import fit_retrieval

    match_max = max(1, max((int(s.match_len.max()) for s in steps), default=1))
    rows, probs = fit_retrieval(steps, match_max, TRACE_CHAIN_LEN)
    return RetrievalProfile(np.asarray(rows, dtype=np.float64), np.asarray(probs))


# longest retrieved chain the trace fit resolves (as traces.fit.fit_workload; data/traces record
# chains of up to 6 tokens: data/traces/README.md)
TRACE_CHAIN_LEN = 6


def run(args: argparse.Namespace) -> int:
    if args.dry_run and args.tp == 1:
        raise SpecError("--dry-run runs the ranks of --tp N (N > 1) on CPU; pass --tp")
    check_out_path(args.out)
    table, single = parse_policy_arg(args.policy)
    batches = args.batch
    for b in batches:
        positive(b, "batch")
    context = positive(args.context, "context")
    steps = positive(args.steps, "steps")
    scenario = scenario_of(args, table)
    if not scenario.has_drafter:
        raise SpecError("the executor needs a drafter model; pass --drafter")
    # the models and the workload only: the executor measures on this GPU, uncalibrated
    target, drafter = load_model(scenario.target), load_model(scenario.drafter)
    workload = scenario.workload
    # the workload's acceptance for this (target, drafter) pair (Scenario.resolve_pair)
    workload_spec = None if args.acceptance_trace else scenario.resolve_pair()[2]
    also = [TreePolicy.parse(a) for a in args.also]
    replay = None
    if args.acceptance_trace:  # read (and validate) before the GPU work starts
        from spectune.planner.acceptance import TraceReplay
        from spectune.specs.trace import read_trace

        _, trace_steps = read_trace(args.acceptance_trace)
        if not trace_steps:
            raise SpecError(f"{args.acceptance_trace}: the trace holds no steps (only a header)")
        replay = TraceReplay(trace_steps)
        replay.retrieval = trace_retrieval(trace_steps)
        workload = f"trace:{Path(args.acceptance_trace).name}"

    plan, plan_gpu = read_gemm_plan(args.gemm_plan) if args.gemm_plan else (None, None)
    plan_source = args.gemm_plan or "gemm_plan"  # names the plan's file in errors

    runs: list[tuple[int, TreePolicy | None, str]] = []
    for b in batches:
        pol = table.lookup(b, context) if table else single
        runs.append((b, pol, "policy" if pol else "off"))
        runs.extend((b, p, text) for text, p in zip(args.also, also, strict=True))
    for _, p, _ in runs:
        check_runnable(p, "spectune's executor")

    # torch and the GPU come in only here, after the arguments are known to be good
    import torch

    from spectune.executor.session import Session, SessionConfig, measure_runs, require_cuda
    from spectune.executor.sources import cache_slots
    from spectune.planner.acceptance import acceptance_model
    from spectune.validate.measure import (
        comparisons,
        format_table,
        gpu_hardware_name,
        measurement_doc,
    )

    if args.tp > 1 and args.dry_run:
        device = torch.device("cpu")
        gpu = "cpu"
    else:
        device = require_cuda()
        gpu = torch.cuda.get_device_name(device)
    hardware = args.hardware or gpu_hardware_name(gpu)
    if plan_gpu is not None and plan_gpu != gpu:
        print(f"note: {args.gemm_plan}'s GEMM plan was chosen on {plan_gpu}; this GPU is {gpu}")
    if table is not None and hardware != scenario.gpu:
        print(f"note: measuring on {hardware}; {args.policy} was planned for {scenario.gpu}")
    if table is not None and scenario.tp != args.tp:
        print(f"note: measuring at tp {args.tp}; {args.policy} was planned for tp {scenario.tp}")
    acc = acceptance_model(workload_spec) if workload_spec is not None else replay
    if args.tp > 1:
        from spectune.executor.collectives import launch
        from spectune.executor.tp_jobs import ExecuteJob, execute_rank

        job = ExecuteJob(
            target, drafter, tuple(runs), context, acc, steps, args.warmup, args.out,
            doc={"hardware": hardware, "workload": workload, "command": _command(args)},
            use_kernels=not args.no_kernels, use_graphs=not args.no_graphs, gemm_plan=plan,
            plan_source=plan_source,
        )  # fmt: skip
        launch(execute_rank, args.tp, (job,), backend="gloo" if args.dry_run else "nccl")
        return 0
    slots = [cache_slots(p, acc, b) for b, p, _ in runs if p is not None]
    cfg = SessionConfig(
        max(batches),
        context,
        max([1, *slots]),
        use_graphs=not args.no_graphs,
        use_kernels=not args.no_kernels,
    )
    session = Session(target, drafter, cfg, device, gemm_plan=plan, plan_source=plan_source)
    recs = measure_runs(session, runs, context, acc, steps, args.warmup, repeats=args.repeat)
    doc = measurement_doc(
        gpu=gpu,
        hardware=hardware,
        target=target.name,
        drafter=drafter.name,
        workload=workload,
        context=context,
        steps=steps,
        attention=session.attention_backend,
        runs=recs,
        extra={
            "command": _command(args),
            "repeats": args.repeat,
            "comparisons": comparisons(recs),
            **session.kernel_plans(),
        },
    )
    write_json_atomic(args.out, doc)
    print(format_table(doc))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("execute", help="run a policy on this GPU and write a measurement JSON")
    p.add_argument(
        "--policy",
        required=True,
        help="policy file (spectune plan's JSON), 'static:D,K,B' / 'dynamic-topk:D,K,B', or 'off'",
    )
    p.add_argument(
        "--batch",
        type=ints(1, 4096),
        default=[1, 8, 32, 64],
        help="batch sizes (default 1,8,32,64)",
    )
    p.add_argument(
        "--context",
        type=int_range(1, 1 << 20),
        default=4096,
        help="context length, tokens (default 4096)",
    )
    p.add_argument("--out", default="measurement.json", help="measurement JSON to write")
    p.add_argument(
        "--also",
        action="append",
        default=[],
        metavar="POLICY",
        help="another inline policy to measure at every batch (repeatable)",
    )
    p.add_argument(
        "--target", default=None, help="target model preset/file (default: the policy file's)"
    )
    p.add_argument(
        "--drafter", default=None, help="drafter preset/file (default: the policy file's)"
    )
    p.add_argument(
        "--workload",
        default=None,
        help="workload driving synthetic acceptance (default: the policy file's)",
    )
    p.add_argument(
        "--acceptance-trace",
        default=None,
        metavar="TRACE",
        help="drive acceptance by a recorded trace (JSONL[.gz], spectune.trace/v1) instead",
    )
    p.add_argument(
        "--hardware", default=None, help="HardwareSpec preset of this GPU (default: from its name)"
    )
    p.add_argument(
        "--steps", type=int_range(1, 100_000), default=40, help="timed steps per run (default 40)"
    )
    p.add_argument(
        "--warmup", type=int_range(0, 100_000), default=5, help="untimed steps per run (default 5)"
    )
    p.add_argument(
        "--tp",
        type=int_range(1, 64),
        default=1,
        help="split the target (and drafter) over this many GPUs of this host, one process each "
        "(torch.distributed + NCCL; default 1)",
    )
    p.add_argument(
        "--no-graphs", action="store_true", help="run the phases eagerly (no CUDA graphs)"
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="with --tp: run the ranks on CPU over gloo (tiny models; tests the launch, not timing)",
    )
    p.add_argument(
        "--repeat",
        type=int_range(1, 50),
        default=1,
        help="measure each policy this many times (independent acceptance-draw streams) and "
        "report its run-to-run spread beside each comparison (default 1)",
    )
    p.add_argument(
        "--no-kernels",
        action="store_true",
        help="torch attention/verify instead of spectune.kernels",
    )
    p.add_argument(
        "--gemm-plan",
        metavar="DOC",
        default=None,
        help="run the GEMM variants that DOC records (its 'gemm_plan': a calibrate run "
        "(--raw-out) or a measurement) instead of timing them at start, so this run's kernels "
        "are the ones the calibration was fitted on; shapes DOC lacks are still timed",
    )
    p.set_defaults(func=run)


def _command(args: argparse.Namespace) -> str:
    parts = [
        f"spectune execute --policy {args.policy}",
        "--batch " + ",".join(map(str, args.batch)),
        f"--context {args.context}",
        f"--steps {args.steps}",
    ]
    parts += [f"--also {a}" for a in args.also]
    if args.repeat > 1:
        parts.append(f"--repeat {args.repeat}")
    if args.acceptance_trace:
        parts.append(f"--acceptance-trace {args.acceptance_trace}")
    if args.tp > 1:
        parts.append(f"--tp {args.tp}")
    if args.gemm_plan:
        parts.append(f"--gemm-plan {args.gemm_plan}")
    return " ".join(parts)
