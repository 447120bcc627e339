"""Where a pruned (ragged) verify spends its time beside the dense one, at small batch.

calibrate's pruned runs at batch 1 verify 6-7% slower than the cost model's price, on H100 and
H200 (measurements/h100-newuser14, h200-newuser6: 6/8/32 pruned at 0.05 measured 7.03 ms where
the dense 6/8/32 took 6.80 ms on the H100, though fewer tokens are verified). This probe splits
that step apart, with the same runner calibrate uses (Session.run_spec's SpecRunner):

1. each policy's phase medians (CUDA events, graphs replayed as in a timed run) and, for the
   pruned ones, the tokens kept and the buckets the steps ran at;
2. each captured verify graph replayed alone, back to back (no host sync): the dense phase
   graph and every ragged bucket graph, so graph content and the eager phase's sync + launch
   separate (phase median minus graph replay = what the host sync and launch cost);
3. one replay of each under torch.profiler: CUDA time per kernel name, ragged bucket vs the
   dense graph of the nearest token count, largest differences first.

    PYTHONPATH=$PWD python benchmarks/probe_pruned_verify.py --out $OUT/pruned.json [--batch 1]

Prints a table last; writes every row to --out. `--tiny` runs it on CPU (a two-layer model, no
graphs) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from spectune.executor.loop import SPEC_PHASES, SpecRunner
from spectune.executor.session import Session, SessionConfig
from spectune.executor.sources import tree_slots
from spectune.executor.verifiers.ragged import RaggedVerifier
from spectune.kernels.timing import PhaseTimer
from spectune.planner.acceptance import acceptance_model
from spectune.specs import ModelSpec, TreePolicy, load_model, write_json_atomic

#: --tiny: a two-layer target and head (tests/test_executor.py's shapes), to check the script
TINY = (
    ModelSpec(name="tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=96, vocab=300),
    ModelSpec(
        name="tiny-eagle", arch="eagle3-head", layers=1, hidden=64, heads=4, kv_heads=2,
        head_dim=16, ffn=96, vocab=300, draft_vocab=100,
    ),
)  # fmt: skip

POLICIES = (
    ("dense 6/8/32", TreePolicy("dynamic-topk", 6, 8, 32)),
    ("pruned 6/8/32 @0.05", TreePolicy("dynamic-topk", 6, 8, 32, 0.05)),
    ("dense 5/4/16", TreePolicy("dynamic-topk", 5, 4, 16)),
)


def replay_s(fn: Any, device: torch.device, reps: int) -> float:
    """Median seconds of fn() called back to back (CUDA events, no host sync between)."""
    timer = PhaseTimer(("g",), reps, device)
    timer.run([fn])
    return timer.medians_s()["g"]


def kernel_us(fn: Any) -> dict[str, float]:
    """CUDA microseconds per kernel name of one fn() call under torch.profiler."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    out: dict[str, float] = defaultdict(float)
    for ev in prof.key_averages():
        if ev.device_type.name == "CUDA":
            out[ev.key[:60]] += float(ev.self_device_time_total)
    return dict(out)


def probe_policy(
    session: Session, label: str, pol: TreePolicy, batch: int, context: int, steps: int
) -> dict[str, Any]:
    acc = acceptance_model("mt-bench")
    session.tune(batch, tree_slots(pol, acc, batch), context)
    r = SpecRunner(
        session.target, session.drafter, acc, pol, batch, context, session.tcache,
        session.dcache, use_graphs=session.cfg.use_graphs, use_kernels=session.use_kernels,
    )  # fmt: skip
    res = r.run(steps)
    row: dict[str, Any] = {
        "label": label,
        "policy": pol.label,
        "phases_ms": {k: v * 1e3 for k, v in res.phases_s.items()},
        "verified_mean": res.verified_mean,
        "ragged": r.ragged,
    }
    dev = session.device
    if dev.type != "cuda" or not r.graphs.captured:
        return row
    v = r.verifier
    if isinstance(v, RaggedVerifier):
        totals = list(v.totals)
        row["totals"] = totals[-steps:]
        row["route"] = {str(k): w for k, w in v.route.items()}
        buckets: dict[int, int] = defaultdict(int)
        for t in totals[-steps:]:
            b = v.plan.bucket(t)
            buckets[v.route.get(b, b)] += 1
        row["buckets_run"] = {str(k): n for k, n in sorted(buckets.items())}
        # the timed steps again, step by step: each step's verify phase beside its bucket
        fns = r.graphs.phases()
        timer = PhaseTimer(SPEC_PHASES, steps, dev)
        first = len(v.totals)
        timer.run(fns)
        per = timer.steps_s()["verify"]
        ran = [v.route.get(v.plan.bucket(t), v.plan.bucket(t)) for t in v.totals[first:]]
        row["steps_verify_ms"] = [x * 1e3 for x in per]
        row["steps_bucket"] = ran
        by: dict[int, list[float]] = defaultdict(list)
        for sec, bk in zip(per, ran, strict=False):
            by[bk].append(sec * 1e3)
        row["in_run_by_bucket_ms"] = {str(k): statistics.median(x) for k, x in sorted(by.items())}
        # the eager phase itself (host read of T, then the bucket's graph), called back to back
        row["eager_phase_ms"] = replay_s(r.verify, dev, 30) * 1e3
        # each bucket graph alone, with the plan holding at most that many tokens (a graph of a
        # bucket below the plan's total would read past its rows)
        tree, counts = r.source.tree, v.counts.clone()

        def fit_to(tokens: int) -> None:
            kept = counts.clamp(max=max(1, tokens // batch))
            v.plan.set_trees(tree.tokens, tree.depth, tree.mask, kept)

        graph_ms = {}
        for bk, g in sorted(v.graphs.items()):
            fit_to(bk)
            graph_ms[str(bk)] = replay_s(g.replay, dev, 30) * 1e3
        row["bucket_graph_ms"] = graph_ms
        # the two most run bucket graphs alternating, back to back and with a host sync before
        # each
        if len(v.graphs) >= 2:
            two = sorted(v.graphs, key=lambda k: -buckets.get(k, 0))[:2]
            fit_to(min(two))
            flip = [v.graphs[k] for k in two]

            def alternate(sync: bool) -> None:
                flip.reverse()
                if sync:
                    torch.cuda.synchronize()
                flip[0].replay()

            row["alternating_ms"] = replay_s(lambda: alternate(False), dev, 30) * 1e3
            row["alternating_sync_ms"] = replay_s(lambda: alternate(True), dev, 30) * 1e3
        most = max(buckets, key=lambda k: buckets[k])
        fit_to(most)
        row["kernels_us"] = kernel_us(v.graphs[most].replay)
        v.plan.set_trees(tree.tokens, tree.depth, tree.mask, counts)
        row["kernels_bucket"] = most
    else:
        dense = r.graphs.graphs[2]
        assert dense is not None
        row["graph_ms"] = replay_s(dense.replay, dev, 30) * 1e3
        row["kernels_us"] = kernel_us(dense.replay)
    del r
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--drafter", default="eagle3-llama-3.1-8b")
    ap.add_argument("--tiny", action="store_true", help="tiny model, short context (CPU check)")
    ap.add_argument("--out", type=Path, default=Path("out/pruned_verify.json"))
    args = ap.parse_args()
    target, drafter = TINY if args.tiny else (load_model(args.model), load_model(args.drafter))
    if args.tiny:
        args.context = min(args.context, 64)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    session = Session(
        target, drafter,
        SessionConfig(args.batch, args.context, 96), dev,
    )  # fmt: skip
    doc: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
        "batch": args.batch,
        "context": args.context,
        "steps": args.steps,
        "rows": [],
    }
    for label, pol in POLICIES:
        print(f"== {label}", flush=True)
        doc["rows"].append(probe_policy(session, label, pol, args.batch, args.context, args.steps))
        doc["wall_s"] = time.perf_counter() - t0
        write_json_atomic(args.out, doc)
    rows = doc["rows"]
    print(f"\n{doc['gpu']} B={args.batch} ctx={args.context}: verify phase vs its graph alone (ms)")
    print(f"{'policy':<22} {'kept':>6} {'phase':>8} {'graph':>8} {'step':>8}  buckets run")
    for r in rows:
        graph = r.get("graph_ms") or (
            sum(r["bucket_graph_ms"][k] * n for k, n in r["buckets_run"].items())
            / max(sum(r["buckets_run"].values()), 1)
            if "bucket_graph_ms" in r
            else float("nan")
        )
        print(
            f"{r['label']:<22} {r['verified_mean']:6.1f} {r['phases_ms']['verify']:8.3f} "
            f"{graph:8.3f} {r['phases_ms']['step']:8.3f}  {r.get('buckets_run', '')}"
        )
    for r in rows:
        if "eager_phase_ms" in r:
            fmt = {k: round(x, 3) for k, x in r["bucket_graph_ms"].items()}
            print(f"{r['label']}: bucket graphs alone {fmt}; eager phase back to back "
                  f"{r['eager_phase_ms']:.3f}; in the run by bucket "
                  f"{ {k: round(x, 3) for k, x in r['in_run_by_bucket_ms'].items()} }")  # fmt: skip
            if "alternating_ms" in r:
                print(f"  two buckets alternating: {r['alternating_ms']:.3f} back to back, "
                      f"{r['alternating_sync_ms']:.3f} with a host sync before each")  # fmt: skip
    dense = next((r for r in rows if not r["ragged"] and "kernels_us" in r), None)
    rag = next((r for r in rows if r["ragged"] and "kernels_us" in r), None)
    if dense and rag:
        d, g = dense["kernels_us"], rag["kernels_us"]
        names = sorted(set(d) | set(g), key=lambda k: -abs(g.get(k, 0.0) - d.get(k, 0.0)))
        print(f"kernels: {dense['label']} vs {rag['label']} bucket {rag['kernels_bucket']} "
              f"(us; totals {sum(d.values()):.0f} / {sum(g.values()):.0f})")  # fmt: skip
        for k in names[:14]:
            print(f"  {k:<60} {d.get(k, 0.0):8.0f} {g.get(k, 0.0):8.0f} "
                  f"{g.get(k, 0.0) - d.get(k, 0.0):+8.0f}")  # fmt: skip
    print(json.dumps({"out": str(args.out), "wall_s": round(doc["wall_s"], 1)}))


if __name__ == "__main__":
    main()
