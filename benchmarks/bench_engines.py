"""Per engine preset: the planned optimum and the engine's own default config, predicted.

For Llama-3.1-8B + its EAGLE-3 head on an H100-SXM at MT-Bench acceptance, context 4096, each
engine profile (spectune's executor, SGLang 0.5.23, vLLM 0.33, TensorRT-LLM main) gets a search
per batch size (1, 8, 32, 64) within what that engine runs (planner.space.engine_space), priced
with its host overheads (specs.engine.EngineOverheads through CostModel.iteration), scored by
the planner's objective (`spectune plan`'s: saturated server, prefill turnover, KV cap). The
table gives the optimum's tokens/s, the engine default's (planner.space.engine_default; '-'
where the engine has none), and how the optimum's policy differs from spectune's own.

The engine overheads are first estimates (specs/engine_data, marked as not fitted), so the
absolute figures for engines are as good as those estimates; the ranking of policies within an
engine is what the plan uses.

    python benchmarks/bench_engines.py [--trials 96]

Last line: one JSON document.
"""

from __future__ import annotations

import argparse
import json
import time

from spectune.planner.buckets import BucketSpec
from spectune.planner.search import SearchSettings, search
from spectune.planner.space import engine_default, engine_space
from spectune.simulator.scoring import build_scorer
from spectune.specs.engine import load_engine
from spectune.specs.scenario import Scenario

ENGINES = ("spectune", "sglang", "vllm", "trtllm")
BATCHES = (1, 8, 32, 64)
CONTEXT = 4096


def run(trials: int) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    buckets = [BucketSpec((b, b), (CONTEXT, CONTEXT)) for b in BATCHES]
    for name in ENGINES:
        profile = load_engine(name)
        scenario = Scenario(engine=name)
        scorer, closed = build_scorer(scenario)
        settings = SearchSettings(
            trials=trials, space=engine_space(profile), engine=name, min_gain=0.0
        )
        t0 = time.perf_counter()
        results = search(scorer.objective, buckets, settings, latency=scorer.latency)
        dflt = engine_default(profile)
        for r in results:
            b = r.bucket.batch[0]
            rows.append(
                {
                    "engine": profile.name,
                    "batch": b,
                    "policy": "off" if r.policy is None else r.policy.label,
                    "tokens_per_s": r.tokens_per_s,
                    "speedup": r.speedup,
                    "default": None if dflt is None else dflt.label,
                    "default_tokens_per_s": None if dflt is None else closed(dflt, b, CONTEXT),
                    "off_tokens_per_s": r.off_tokens_per_s,
                    "search_s": time.perf_counter() - t0,
                }
            )
    return rows


def main() -> None:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=96, help="trials per batch (default 96)")
    args = ap.parse_args()
    rows = run(args.trials)
    own = {r["batch"]: r["policy"] for r in rows if r["engine"] == "spectune"}
    print(f"Llama-3.1-8B + EAGLE-3, H100-SXM, MT-Bench, context {CONTEXT}; predicted tok/s")
    head = (
        f"{'engine':<9} {'B':>3}  {'optimum':<22} {'tok/s':>8} {'vs off':>7}  "
        f"{'default':<20} {'tok/s':>8} {'opt/dflt':>8}  vs spectune's optimum"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        d = r["default_tokens_per_s"]
        ratio = "-" if d is None else f"{float(r['tokens_per_s']) / float(d):7.2f}x"  # type: ignore[arg-type]
        same = "same" if r["policy"] == own[r["batch"]] else f"was {own[r['batch']]}"
        dft = "-" if d is None else f"{float(d):8.0f}"  # type: ignore[arg-type]
        print(
            f"{r['engine']:<9} {r['batch']:>3}  {r['policy']!s:<22} "
            f"{float(r['tokens_per_s']):8.0f} {float(r['speedup']):6.2f}x  "  # type: ignore[arg-type]
            f"{r['default'] or '-'!s:<20} {dft:>8} {ratio:>8}  {same}"
        )
    print(json.dumps({"bench": "engines", "context": CONTEXT, "rows": rows}))


if __name__ == "__main__":
    main()
