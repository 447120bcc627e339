"""`spectune capacity`: the largest request rate (requests/s) a server sustains within a TTFT
and a TPOT SLO, with the policy and with speculation off.

Each candidate rate is one simulated run (`spectune simulate`'s machinery: the scenario's
SimConfig, Poisson arrivals, --requests requests); it meets the SLOs when the --percentile of
time to first token and of time per output token are both within their bounds. The rate is
found by doubling from --start-qps, then bisection to --tolerance, never above the rate the
saturated server completes (spectune.simulator.slo_capacity). The policy is taken as `simulate --policy` takes it: a
policy file, an export's sidecar, a policy label, or off; the scenario is the policy file's
unless flags change it. Each probe prints one line on stderr.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import replace
from typing import Any

from spectune.cli.common import float_range, int_range, json_text, seed
from spectune.cli.simulate import (
    DEFAULT_POLICY,
    add_scenario_options,
    load_policy,
    scenario_of,
)
from spectune.planner.tokens_per_s import SERVED
from spectune.specs import SpecError

DEFAULT_SLO_TTFT_MS = 2000.0
DEFAULT_SLO_TPOT_MS = 50.0
DEFAULT_PERCENTILE = "p90"


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.1f}"


def run(args: argparse.Namespace) -> int:
    from spectune.simulator.scoring import scenario_sim_config
    from spectune.simulator.slo_capacity import Probe, max_rate

    policy = load_policy(args.policy)
    # the SLOs bound the search here; the scenario keeps its own (no override notes)
    scenario = scenario_of(
        argparse.Namespace(**{**vars(args), "slo_ttft_ms": None, "slo_tpot_ms": None}), policy
    )
    resolved = scenario.resolve()
    if policy is not None and resolved.drafter is None:
        raise SpecError("a policy needs a drafter; pass --drafter or --policy off")
    base = replace(
        scenario_sim_config(resolved),
        requests=args.requests,
        replicas=args.replicas,
        max_batch=args.max_batch,
        seed=args.seed,
    )
    pct = args.percentile
    slo = (
        f"TTFT {pct} <= {args.slo_ttft_ms:g} ms and TPOT {pct} <= {args.slo_tpot_ms:g} ms, "
        f"{args.requests} Poisson requests per probe"
    )
    if not args.json:
        print(f"spectune capacity: {resolved.label}; {slo}")
    found = {}
    runs = (("policy", policy), ("off", None)) if policy is not None else (("off", None),)
    for name, pol in runs:
        t0 = time.perf_counter()

        def show(p: Probe, name: str = name, t0: float = t0) -> None:
            if args.quiet:
                return
            print(
                f"  {name}: {p.qps:9.3f} req/s -> TTFT {pct} {_ms(p.ttft_s)} ms, TPOT {pct} "
                f"{_ms(p.tpot_s)} ms: {'meets' if p.meets else 'misses'} "
                f"({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

        if not args.quiet:
            print(
                f"  {name}: measuring the saturated completion rate (closed loop at the max "
                "batch), the ceiling of the search",
                file=sys.stderr,
                flush=True,
            )
        found[name] = max_rate(
            replace(base, policy=pol),
            slo_ttft_s=args.slo_ttft_ms / 1e3,
            slo_tpot_s=args.slo_tpot_ms / 1e3,
            percentile=pct,
            start_qps=args.start_qps,
            max_qps=args.max_qps,
            rel_tol=args.tolerance,
            progress=show,
        )
    if args.json:
        print(json_text({name: _record(c) for name, c in found.items()}))
        return 0
    label = "off" if policy is None else args.policy
    print(f"{'':<10} {'max req/s':>10} {'TTFT ' + pct:>10} {'TPOT ' + pct:>10} {SERVED.label:>27}")
    for name, c in found.items():
        b = c.best
        who = label if name == "policy" else "off"
        if b is None:
            print(
                f"{name:<10} {'< ' + format(c.fail_qps, '.3g'):>10}  no rate meets the SLOs ({who})"
            )
            continue
        bound = (
            ""
            if c.fail_qps < math.inf
            else f" (meets up to the saturated rate {c.saturated_qps:.3g} req/s / --max-qps)"
        )
        print(
            f"{name:<10} {c.max_qps:10.3f} {_ms(b.ttft_s) + ' ms':>10} {_ms(b.tpot_s) + ' ms':>10} "
            f"{b.throughput_tok_s:27,.0f}  {who}{bound}"
        )
    if "policy" in found and found["off"].max_qps > 0:
        gain = found["policy"].max_qps / found["off"].max_qps
        print(f"capacity with the policy: {gain:.2f}x speculation off")
    print(
        f"max req/s: largest rate found to meet the SLOs, within {args.tolerance:.0%} of the "
        f"smallest found to miss them, and at most the saturated completion rate; "
        f"{SERVED.label}: simulated, at that rate"
    )
    return 0


def _record(c: Any) -> dict[str, Any]:
    return {
        "max_qps": c.max_qps,
        "saturated_qps": c.saturated_qps,
        "fail_qps": c.fail_qps if c.fail_qps < math.inf else None,
        "probes": [
            {
                "qps": p.qps,
                "ttft_s": p.ttft_s,
                "tpot_s": p.tpot_s,
                "meets": p.meets,
                "served_tok_per_s_incl_prefill": p.throughput_tok_s,
            }
            for p in c.probes
        ],
    }


def register(sub: argparse._SubParsersAction) -> None:
    from spectune.simulator.arrivals import MAX_QPS
    from spectune.simulator.config import MAX_REQUESTS
    from spectune.simulator.slo_capacity import PERCENTILES

    p = sub.add_parser(
        "capacity",
        help="largest request rate meeting TTFT and TPOT SLOs, with and without speculation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_scenario_options(p)
    p.add_argument(
        "--policy",
        default=DEFAULT_POLICY,
        help="policy file, export sidecar (*.spectune.json), policy label or off, as for "
        f"`spectune simulate` (default {DEFAULT_POLICY})",
    )
    slo = float_range(0, 1e7, lo_open=True)
    p.add_argument(
        "--slo-ttft-ms",
        type=slo,
        default=DEFAULT_SLO_TTFT_MS,
        help=f"time-to-first-token SLO, ms (default {DEFAULT_SLO_TTFT_MS:g})",
    )
    p.add_argument(
        "--slo-tpot-ms",
        type=slo,
        default=DEFAULT_SLO_TPOT_MS,
        help=f"time-per-output-token SLO, ms (default {DEFAULT_SLO_TPOT_MS:g})",
    )
    p.add_argument(
        "--percentile",
        choices=PERCENTILES,
        default=DEFAULT_PERCENTILE,
        help=f"the percentile both SLOs bound (default {DEFAULT_PERCENTILE})",
    )
    p.add_argument(
        "--requests",
        type=int_range(1, MAX_REQUESTS),
        default=1000,
        help="simulated requests per probed rate (default 1000; more: steadier, slower)",
    )
    p.add_argument(
        "--start-qps",
        type=float_range(0, MAX_QPS, lo_open=True),
        default=1.0,
        help="first rate probed, requests/s (default 1)",
    )
    p.add_argument(
        "--max-qps",
        type=float_range(0, MAX_QPS, lo_open=True),
        default=1e4,
        help="highest rate probed, requests/s (default 10000)",
    )
    p.add_argument(
        "--tolerance",
        type=float_range(0, 0.5, lo_open=True),
        default=0.02,
        help="stop when the bracket is narrower than this fraction of its upper end (default 0.02)",
    )
    p.add_argument(
        "--replicas",
        type=int_range(1, 1024),
        default=1,
        help="replicas behind the router (default 1)",
    )
    p.add_argument(
        "--max-batch",
        type=int_range(1, 1 << 16),
        default=None,
        help="max running sequences per replica (default: what the KV cache holds, <= 256)",
    )
    p.add_argument("--seed", type=seed, default=0, help="random seed of every run (default 0)")
    p.add_argument("--json", action="store_true", help="print one JSON object with every probe")
    p.add_argument("--quiet", action="store_true", help="no per-probe progress on stderr")
    p.set_defaults(func=run)
