"""`spectune simulate`: serve simulated traffic with a policy and compare with speculation off.

With a policy file, the scenario is the file's (target, drafter, GPU, TP, workload, calibration,
SLOs); a flag that changes one of them says so in one line on stderr.

One table per load level (request rate, closed-loop concurrency, or a replayed trace), the
speculation-off baseline beside it on the same arrivals and lengths. `--json` prints
{"runs": [...]} with one record per load level.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from spectune.cli.common import (
    add_intermediate,
    add_strict,
    check_out_path,
    float_range,
    floats,
    int_range,
    ints,
    json_text,
    scenario_with_flags,
    seed,
)
from spectune.cli.outputs import add_csv_plot, check_csv_plot, write_outputs
from spectune.planner.tokens_per_s import SERVED
from spectune.specs import PolicyTable, Scenario, SpecError, TreePolicy

DEFAULT_POLICY = "dynamic-topk:5,4,8"  # SGLang's EAGLE defaults: 5 steps, top-k 4, 8 tokens


def load_policy(text: str) -> PolicyTable | TreePolicy | None:
    """--policy: 'off', a policy label, a policy file (`spectune plan`), or an export's
    sidecar (`*.spectune.json` of `spectune export`: what that engine runs per batch range,
    planner.export.runs)."""
    from spectune.planner.export.runs import is_sidecar, sidecar_table
    from spectune.specs.io import loads_json, read_bytes_bounded

    if text == "off":
        return None
    p = Path(text)
    if text.lower().endswith(".yaml") and p.is_file():
        raise SpecError(
            f"--policy {text}: a TensorRT-LLM export is YAML without a sidecar; pass the policy "
            "file it was exported from, or an SGLang / vLLM export's *.spectune.json"
        )
    if text.lower().endswith(".json") or p.is_file():
        if not p.is_file():
            raise SpecError(f"--policy {text}: no such policy file or export")
        doc = loads_json(read_bytes_bounded(p), str(p))
        if is_sidecar(doc):
            return sidecar_table(doc, str(p))
        return PolicyTable.from_dict(doc, str(p))
    return TreePolicy.parse(text)


def _policy_text(p: PolicyTable | TreePolicy | None, arg: str) -> str:
    if p is None:
        return "off"
    if isinstance(p, PolicyTable):
        engine = p.provenance.get("export") and p.provenance.get("engine")
        if engine:
            return f"{engine} export {arg} ({len(p.buckets)} batch ranges)"
        return f"table {arg} ({len(p.buckets)} buckets)"
    return arg


def _loads(args: argparse.Namespace) -> list[tuple[str, Any]]:
    from spectune.simulator import ClosedLoop, Gamma, Poisson, load_trace

    if args.trace:
        trace = load_trace(args.trace)
        return [(f"trace {Path(args.trace).name}", trace)]
    if args.concurrency:
        think = args.think_ms / 1e3
        return [(f"concurrency {c}", ClosedLoop(c, think)) for c in args.concurrency]
    qps = args.qps or [1.0, 4.0, 16.0]
    if args.burstiness and args.burstiness != 1.0:
        return [(f"qps {q:g} (cv {args.burstiness:g})", Gamma(q, args.burstiness)) for q in qps]
    return [(f"qps {q:g}", Poisson(q)) for q in qps]


class _Progress:
    """Requests finished, on stderr, for runs that take more than a second."""

    def __init__(self, label: str, quiet: bool):
        self.label = label
        self.quiet = quiet
        self.t0 = time.perf_counter()
        self.last = self.t0
        self.tty = sys.stderr.isatty()
        self.shown = False

    def __call__(self, phase: str, done: int, total: int) -> None:
        if self.quiet:
            return
        now = time.perf_counter()
        if now - self.last < 1.0 and done < total:
            return
        if now - self.t0 < 1.0:
            return
        self.last = now
        end = "\r" if self.tty and done < total else "\n"
        print(
            f"  {self.label}: {phase} {done}/{total} requests ({now - self.t0:.0f} s)",
            end=end,
            file=sys.stderr,
            flush=True,
        )
        self.shown = True


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.1f}"


def _table(label: str, res: Any) -> str:
    m, o = res.spec.metrics, res.off.metrics if res.off is not None else None
    rows: list[tuple[str, str, str]] = []

    def row(name: str, f: Any) -> None:
        rows.append((name, f(m), f(o) if o is not None else "-"))

    row("requests", lambda x: f"{x.requests}")
    row(SERVED.label, lambda x: f"{x.throughput_tok_s:.1f}")
    row(
        "served goodput tok/s (in SLO)",
        lambda x: f"{x.goodput_tok_s:.1f} ({x.slo_attainment:.0%})",
    )
    for name in ("ttft", "tpot", "e2e"):
        row(
            f"{name.upper()} p50/p90/p99 ms",
            lambda x, n=name: "/".join(
                _ms(getattr(getattr(x, n), p)) for p in ("p50", "p90", "p99")
            ),
        )
    row("mean accepted tok/step", lambda x: f"{x.mean_accepted:.2f}")
    row("verify waste", lambda x: f"{x.verify_waste:.0%}")
    row("preemptions", lambda x: f"{x.preemptions}")
    row("busy", lambda x: f"{x.busy_fraction:.0%}")
    tb = m.time_breakdown_s
    total = sum(tb.values()) or 1.0
    w0 = max(len(r[0]) for r in rows)
    w1 = max(len(r[1]) for r in [*rows, ("", "spec", "")])
    lines = [f"== {label} ==", f"{'':<{w0}}  {'spec':>{w1}}  {'off':>12}"]
    lines += [f"{a:<{w0}}  {b:>{w1}}  {c:>12}" for a, b, c in rows]
    lines.append(
        "time on spec: " + ", ".join(f"{k} {v / total:.0%}" for k, v in tb.items() if v > 0)
    )
    if o is not None:
        lines.append(
            f"speedup vs off: {res.speedup_vs_off:.2f}x per output token (TPOT), "
            f"{res.throughput_ratio_vs_off:.2f}x throughput"
        )
    return "\n".join(lines)


INTERMEDIATE_FLAGS = ("intermediate", "intermediate_drafter")


def scenario_of(args: argparse.Namespace, policy: PolicyTable | TreePolicy | None) -> Scenario:
    """The scenario to simulate: a policy file's own, else the defaults, with the scenario
    flags the user passed on top (each one that changes a policy file's prints a line)."""
    flags = {
        name: getattr(args, name)
        for name in ("target", "drafter", "gpu", "tp", "workload", *INTERMEDIATE_FLAGS)
        if getattr(args, name, None) is not None
    }
    for name in ("slo_tpot_ms", "slo_ttft_ms"):
        if getattr(args, name) is not None:
            flags[name] = getattr(args, name) or None  # 0: no SLO
    if args.calibration == "none":
        flags["calibration"] = None
    elif args.calibration is not None:
        if not Path(args.calibration).is_file():
            raise SpecError(f"--calibration {args.calibration}: no such file")
        flags["calibration"] = str(Path(args.calibration).resolve())
    if isinstance(policy, PolicyTable):
        return scenario_with_flags(policy.scenario, flags, args.policy)
    return scenario_with_flags(Scenario(), flags, None)


def run(args: argparse.Namespace) -> int:
    from spectune.simulator import LengthDist, length_preset, parse_length, simulate
    from spectune.simulator.scoring import scenario_sim_config
    from spectune.simulator.trace_export import write_chrome_trace

    if args.chrome_trace is not None:
        check_out_path(args.chrome_trace, "--chrome-trace")
    check_csv_plot(args)
    policy = load_policy(args.policy)
    scenario = scenario_of(args, policy)
    resolved = scenario.resolve()
    hw, target, drafter, workload = (
        resolved.hardware,
        resolved.target,
        resolved.drafter,
        resolved.workload,
    )
    if policy is not None and drafter is None:
        raise SpecError("a policy needs a drafter; pass --drafter or --policy off")
    pols = [b.policy for b in policy.buckets] if isinstance(policy, PolicyTable) else [policy]
    hier = next((p for p in pols if p is not None and p.chain), None)
    if hier is not None and resolved.intermediate is None:
        raise SpecError(
            f"the policy {hier.label} is hierarchical: name its intermediate model with "
            "--intermediate MODEL"
        )
    prompt: LengthDist | None = None
    output: LengthDist | None = None
    if args.lengths:
        preset = length_preset(args.lengths)
        prompt, output = preset.prompt, preset.output
    if args.prompt_tokens:
        prompt = parse_length(args.prompt_tokens)
    if args.output_tokens:
        output = parse_length(args.output_tokens)
    for name in ("requests", "replicas", "max_batch_tokens"):
        if getattr(args, name) < 1:
            raise SpecError(f"--{name.replace('_', '-')} must be >= 1")
    if args.max_batch is not None and args.max_batch < 1:
        raise SpecError("--max-batch must be >= 1")
    loads = _loads(args)
    runs = []
    cal = f", calibration {Path(scenario.calibration).name}" if scenario.calibration else ""
    header = (
        f"{target.name} + {drafter.name if drafter else 'no drafter'}"
        f"{f' (intermediate {resolved.intermediate.name})' if resolved.intermediate else ''} on "
        f"{args.replicas} x {scenario.tp} x {hw.name}, workload {workload.name}{cal}, policy "
        f"{_policy_text(policy, args.policy)}, router {args.router}, seed {args.seed}"
    )
    if not args.json:
        print(header)
    for i, (label, arrivals) in enumerate(loads):
        cfg = replace(
            scenario_sim_config(resolved, arrivals),
            policy=policy,
            requests=args.requests,
            prompt=prompt,
            output=output,
            replicas=args.replicas,
            router=args.router,
            max_batch=args.max_batch,
            max_batch_tokens=args.max_batch_tokens,
            seed=args.seed,
            shared_budget=args.shared_budget,
            keep_iterations=bool(args.chrome_trace),
        )
        t0 = time.perf_counter()
        res = simulate(cfg, progress=_Progress(label, args.quiet))
        wall = time.perf_counter() - t0
        rec = res.summary()
        rec["wall_s"] = wall
        runs.append(rec)
        if args.chrome_trace and res.spec.log is not None:
            path = Path(args.chrome_trace)
            if len(loads) > 1:
                path = path.with_name(f"{path.stem}.{i}{path.suffix or '.json'}")
            write_chrome_trace(res.spec.log, path)
            if not args.json:
                print(f"chrome trace: {path}")
        if not args.json:
            print()
            print(_table(label, res))
            print(
                f"(max batch {res.max_batch}, KV {res.kv_tokens} tokens per replica; {wall:.1f} s)"
            )
    if args.json:
        print(json_text({"runs": runs}))
    write_outputs(
        args,
        [csv_row(label, r) for (label, _), r in zip(loads, runs, strict=True)],
        draw_runs([label for label, _ in loads], runs),
        title=header,
        xlabel="load level",
        ylabel=SERVED.label + " (simulated)",
        out=sys.stderr if args.json else None,
    )
    return 0


def csv_row(label: str, rec: dict[str, Any]) -> dict[str, Any]:
    """One load level of `simulate --json` as a flat CSV row (the off run's columns prefixed
    off_; seconds as in the JSON)."""
    key = "served_tok_per_s_incl_prefill"
    row: dict[str, Any] = {"load": label}
    for k, v in rec.items():
        if k == "off":
            continue
        row[key if k == "throughput_tok_s" else k] = v
    for k, v in (rec.get("off") or {}).items():
        row["off_" + (key if k == "throughput_tok_s" else k)] = v
    return row


def draw_runs(labels: list[str], runs: list[dict[str, Any]]) -> Any:
    """Simulated served tok/s per load level, speculation on and off."""

    def draw(ax: Any) -> None:
        xs = list(range(len(labels)))
        ax.plot(xs, [r["throughput_tok_s"] for r in runs], "o-", label="policy")
        off = [(r.get("off") or {}).get("throughput_tok_s") for r in runs]
        if all(v is not None for v in off):
            ax.plot(xs, off, "s--", label="speculation off")
        ax.set_xticks(xs, labels, rotation=20, fontsize=8)

    return draw


def add_scenario_options(p: argparse.ArgumentParser) -> None:
    """The scenario flags of simulate and capacity: each defaults to the policy file's (an
    export's source), else to Scenario()'s."""
    d = Scenario()
    p.add_argument(
        "--target",
        help=f"target model preset or spec file (default: the policy file's, else {d.target})",
    )
    add_intermediate(p, default_help="default: the policy file's, else none")
    p.add_argument(
        "--drafter",
        help=f"drafter preset or spec file, or 'none' (default: the policy file's, else {d.drafter})",
    )
    p.add_argument(
        "--gpu", help=f"GPU preset or spec file (default: the policy file's, else {d.gpu})"
    )
    p.add_argument(
        "--workload",
        help=f"workload preset or file (default: the policy file's, else {d.workload})",
    )
    p.add_argument(
        "--tp",
        type=int_range(1, 64),
        help=f"tensor-parallel GPUs per replica (default: the policy file's, else {d.tp})",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="price steps with this fitted calibration, or 'none' (default: the policy file's)",
    )
    add_strict(p)


def register(sub: argparse._SubParsersAction) -> None:
    from spectune.simulator.arrivals import MAX_CONCURRENCY, MAX_CV, MAX_QPS, MAX_THINK_S
    from spectune.simulator.config import MAX_REQUESTS

    p = sub.add_parser(
        "simulate",
        help="simulate serving traffic with a policy, against speculation off",
        description=__doc__,
    )
    add_scenario_options(p)
    load = p.add_mutually_exclusive_group()
    load.add_argument(
        "--qps",
        type=floats(0, MAX_QPS, lo_open=True),
        help="Poisson request rates, requests/s (default 1,4,16)",
    )
    load.add_argument(
        "--concurrency",
        type=ints(1, MAX_CONCURRENCY),
        help="closed-loop clients (concurrent requests), e.g. 1,8,64 (default: --qps)",
    )
    load.add_argument("--trace", help="replay a CSV/JSONL trace: arrival_s, prompt/output tokens")
    p.add_argument(
        "--burstiness",
        type=float_range(0, MAX_CV, lo_open=True),
        default=1.0,
        help="cv of inter-arrival times (>1: Gamma)",
    )
    p.add_argument(
        "--requests",
        type=int_range(1, MAX_REQUESTS),
        default=1000,
        help=f"requests per load level, at most {MAX_REQUESTS} (a trace: its first N)",
    )
    p.add_argument(
        "--think-ms",
        type=float_range(0, MAX_THINK_S * 1e3),
        default=0.0,
        help="closed loop: client pause between requests",
    )
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help="a policy file (spectune plan), an export's sidecar (sglang.spectune.json or "
        "vllm.spectune.json of spectune export: what that engine runs per batch size), "
        "static:DEPTH,TOPK,BUDGET, dynamic-topk:DEPTH,TOPK,BUDGET[,PRUNE[,GRAFT]][,echo] or off "
        f"(default {DEFAULT_POLICY}); ',echo': ECHO shared verify budget",
    )
    p.add_argument(
        "--shared-budget",
        action="store_true",
        help="ECHO: one verify budget per batch for every policy (overrides the policies' own "
        "shared_budget, which a policy file or a ',echo' policy sets per policy)",
    )
    p.add_argument(
        "--replicas", type=int_range(1, 1024), default=1, help="replicas behind the router"
    )
    p.add_argument("--router", choices=("rr", "least"), default="rr", help="request routing")
    p.add_argument(
        "--max-batch",
        type=int_range(1, 1 << 16),
        help="max running sequences (default: from KV, <= 256)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int_range(1, 1 << 24),
        default=8192,
        help="token budget per iteration",
    )
    p.add_argument(
        "--lengths", help="length preset: sharegpt, alpaca, mt-bench, humaneval, longbench"
    )
    p.add_argument("--prompt-tokens", help="prompt length: N or MEAN~CV (overrides the workload)")
    p.add_argument("--output-tokens", help="output length: N or MEAN~CV (overrides the workload)")
    slo = float_range(0, 1e7, lo_open=True)
    p.add_argument(
        "--slo-ttft-ms",
        type=slo,
        help="goodput SLO: time to first token, ms (default: the policy file's)",
    )
    p.add_argument(
        "--slo-tpot-ms",
        type=slo,
        help="goodput SLO: time per output token, ms (default: the policy file's)",
    )
    p.add_argument("--seed", type=seed, default=0, help="random seed")
    p.add_argument("--chrome-trace", help="write the iterations as a Chrome trace JSON")
    p.add_argument("--json", action="store_true", help='print {"runs": [...]} only')
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    add_csv_plot(p, "one row per load level (policy and speculation off)")
    p.set_defaults(func=run)
