"""Per engine preset: the engine-runnable plan and the engine's own default config, predicted.

For Llama-3.1-8B + its EAGLE-3 head on an H100-SXM at MT-Bench acceptance, context 4096, each
engine profile (spectune's executor, SGLang 0.5.23, vLLM 0.33, TensorRT-LLM main) gets a search
per batch size (1, 8, 32, 64) within what that engine runs (planner.space.engine_space), priced
with its host overheads (specs.engine.EngineOverheads through CostModel.iteration), scored by
the planner's objective (`spectune plan`'s: saturated server, prefill turnover, KV cap with and
without the drafter). For a serving engine the per-batch optima are then made into the one
configuration the engine runs for all four batch sizes (planner.engine_plan, as `spectune plan
--engine` does: one static tree, or a draft length per batch range where the engine has a
schedule). The table gives, per batch size: the engine-runnable plan's policy and tokens/s, its
speedup over no speculation, the engine's default config as the engine runs it when the user
sets nothing (planner.space.engine_default, under the engine's running-request cap:
planner.capacity.default_max_running, SGLang's 48; '-' where the engine has none), what the
per-batch optimum would give (the cost of the engine's constraint), and how the engine's plan
differs from spectune's own optimum.

The engine overheads are first estimates (specs/engine_data, marked as not fitted), so the
absolute figures for engines are as good as those estimates; the ranking of policies within an
engine is what the plan uses.

    python benchmarks/bench_engines.py [--trials 96] [--calibration FILE] [--engines spectune]

--calibration prices every engine with a fitted calibration of the H100 (spectune calibrate,
e.g. measurements/h100/calibration-h100-sxm.json) instead of the preset's defaults.

Last line: one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time

from spectune.planner.buckets import BucketSpec
from spectune.planner.capacity import default_max_running
from spectune.planner.engine_plan import engine_plan
from spectune.planner.search import SearchSettings, search
from spectune.planner.space import engine_default, engine_space
from spectune.simulator.scoring import build_scorer
from spectune.specs.engine import load_engine
from spectune.specs.scenario import Scenario

ENGINES = ("spectune", "sglang", "vllm", "trtllm")
BATCHES = (1, 8, 32, 64)
CONTEXT = 4096


def run(
    trials: int, calibration: str | None = None, engines: tuple[str, ...] = ENGINES
) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    buckets = [BucketSpec((b, b), (CONTEXT, CONTEXT)) for b in BATCHES]
    for name in engines:
        profile = load_engine(name)
        scenario = Scenario(engine=name, calibration=calibration)
        scorer, closed = build_scorer(scenario)
        settings = SearchSettings(
            trials=trials, space=engine_space(profile), engine=name, min_gain=0.0
        )
        t0 = time.perf_counter()
        optima = search(scorer.objective, buckets, settings, latency=scorer.latency)
        results = optima
        config = "per batch"
        if profile.engine != "spectune":
            planned = engine_plan(optima, profile, scorer)
            results, config = list(planned.results), planned.config.label
        elapsed = time.perf_counter() - t0
        dflt = engine_default(profile)
        cap = default_max_running(profile, True) or 1 << 30
        for r, o in zip(results, optima, strict=True):
            b = r.bucket.batch[0]
            rows.append(
                {
                    "engine": profile.name,
                    "batch": b,
                    "config": config,
                    "policy": "off" if r.policy is None else r.policy.label,
                    "tokens_per_s": r.tokens_per_s,
                    "speedup": r.speedup,
                    "optimum": "off" if o.policy is None else o.policy.label,
                    "optimum_tokens_per_s": o.tokens_per_s,
                    "default": None if dflt is None else dflt.label,
                    "default_tokens_per_s": None
                    if dflt is None
                    else closed(dflt, min(b, cap), CONTEXT),
                    "off_tokens_per_s": r.off_tokens_per_s,
                    "search_s": elapsed,
                }
            )
    return rows


def main() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=96, help="trials per batch (default 96)")
    ap.add_argument("--calibration", default=None, help="fitted H100 calibration JSON")
    ap.add_argument(
        "--engines", default=",".join(ENGINES), help=f"engines, comma-separated ({ENGINES})"
    )
    args = ap.parse_args()
    engines = tuple(e for e in args.engines.split(",") if e)
    if not engines or any(e not in ENGINES for e in engines):
        ap.error(f"--engines must name some of {', '.join(ENGINES)}, got {args.engines!r}")
    rows = run(args.trials, args.calibration, engines)
    own = {r["batch"]: r["policy"] for r in rows if r["engine"] == "spectune"}
    own = own or {r["batch"]: "-" for r in rows}
    print(f"Llama-3.1-8B + EAGLE-3, H100-SXM, MT-Bench, context {CONTEXT}; predicted tok/s")
    head = (
        f"{'engine':<9} {'B':>3}  {'engine-runnable plan':<22} {'tok/s':>6} {'vs off':>7}  "
        f"{'default (as run)':<18} {'tok/s':>6} {'plan/dflt':>9}  {'per-batch opt':>13}  "
        "vs spectune's optimum"
    )
    print(head)
    print("-" * len(head))
    configs: dict[str, str] = {}
    for r in rows:
        configs[str(r["engine"])] = str(r["config"])
        d = r["default_tokens_per_s"]
        tps, opt = float(r["tokens_per_s"]), float(r["optimum_tokens_per_s"])  # type: ignore[arg-type]
        ratio = "-" if d is None else f"{tps / float(d):8.2f}x"  # type: ignore[arg-type]
        same = "same" if r["policy"] == own[r["batch"]] else f"was {own[r['batch']]}"
        dft = "-" if d is None else f"{float(d):6.0f}"  # type: ignore[arg-type]
        print(
            f"{r['engine']:<9} {r['batch']:>3}  {r['policy']!s:<22} {tps:6.0f} "
            f"{float(r['speedup']):6.2f}x  "  # type: ignore[arg-type]
            f"{r['default'] or '-'!s:<18} {dft:>6} {ratio:>9}  "
            f"{opt:6.0f} {100 * (opt / tps - 1):+5.1f}%  {same}"
        )
    for engine, config in configs.items():
        print(f"{engine}: {config}")
    print(
        "default (as run): the engine's own config when the user sets nothing, under its "
        "running-request cap (SGLang: 48 with speculation on); per-batch opt: what each batch's "
        "own optimum would give, and how much more than the engine-runnable plan"
    )
    print(json.dumps({"bench": "engines", "context": CONTEXT, "rows": rows}))


if __name__ == "__main__":
    main()
