"""How well does one GPU repeat its own timings from one process to the next? (CPU)

    python -m benchmarks.bench_repeat                 # every one-GPU folder of bench_refit
    python -m benchmarks.bench_repeat measurements/h200-newuser9

A new-user folder times the same policies twice, in two processes on the same GPU minutes
apart: spectune calibrate's short speculative runs (calibrate-run.json "spec_runs", 15 steps)
and spectune execute's (execute-planned.json, 30 steps x 2 repeats), both with the workload's
synthetic acceptance. Only dense trees are paired: a pruned tree's kept tokens and a shared
budget's split follow the drawn confidences, so their step is not the same work twice. A predicted speedup is checked
against the second with a calibration fitted to the first, so the second's departures from the
first bound how close any prediction can come. Per pair (same batch, same policy):
- the step without speculation, execute / calibrate - 1 (`ar`);
- the timing-only speedup ratio: (ar_e / ar_c) / (step_e / step_c) - 1, i.e. how much the
  measured speedup moved with acceptance held (check prices each run at its own measured
  acceptance, so draws do not enter a speedup error; timings do).
Within execute, `spread` is each run's (max - min) / mean step over its repeats. The plan
column says whether execute ran GEMM variants or tree-attention launches other than calibrate's
(gemm_plan / attention_plan; "-" when unrecorded). Where both runs of a pair recorded the GPU's
clock (gpu_state), `clock` is the mean of execute's median SM clock over calibrate's, - 1.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench_refit import FOLDERS, ROOT, _load


def _key(r: dict[str, Any]) -> tuple[Any, ...] | None:
    p = r["policy"]
    if p is None:
        return None
    return (
        r["batch"], p["builder"], p["depth"], p["topk"], p["budget"],
        p.get("prune_threshold", 0.0), p.get("graft_budget", 0), bool(p.get("shared_budget")),
    )  # fmt: skip


def pairs(folder: Path) -> tuple[list[dict[str, Any]], list[float], str]:
    """(pair rows, execute's within-process spreads, plan column) of one folder."""
    run = _load(folder / "calibrate-run.json")
    if "spec_runs" not in run:
        return [], [], "-"
    cal = {_key(r): r for r in run["spec_runs"]["runs"] if r["policy"] is not None}
    rows, spreads, differs = [], [], set()
    for f in sorted(folder.glob("execute-planned*.json")):
        doc = _load(f)
        if doc.get("tp", 1) != 1:
            continue
        for kind in ("gemm_plan", "attention_plan"):
            plan, theirs = run.get(kind, {}), doc.get(kind, {})
            if plan and theirs:
                differs.add(any(plan.get(k, v) != v for k, v in theirs.items()))
        for r in doc["runs"]:
            steps = (r.get("repeats") or {}).get("step_ms") or []
            if len(steps) > 1:
                spreads.append((max(steps) - min(steps)) / statistics.fmean(steps))
            c = cal.get(_key(r))
            if c is None or _key(r)[5:] != (0.0, 0, False):  # type: ignore[index]
                continue
            ar = r["ar_step_ms"] / c["ar_step_ms"]
            step = r["phases_ms"]["step"] / c["phases_ms"]["step"]
            clock = None
            if "gpu_state" in r and "gpu_state" in c:
                clock = r["gpu_state"]["sm_clock_mhz"] / c["gpu_state"]["sm_clock_mhz"] - 1
            rows.append(
                {"file": f.name, "batch": r["batch"], "label": r["label"],
                 "tree": _key(r)[2:5], "ar": ar - 1, "speedup": ar / step - 1,  # type: ignore[index]
                 "clock": clock}
            )  # fmt: skip
    col = "-" if not differs else ("differs" if True in differs else "same")
    return rows, spreads, col


def _stats(xs: list[float]) -> str:
    a = sorted(abs(x) for x in xs)
    if not a:
        return "-"
    p90 = a[min(len(a) - 1, int(0.9 * len(a)))]
    return f"mean {statistics.fmean(a):.2%} p90 {p90:.2%} max {a[-1]:.2%} (n {len(a)})"


def main(argv: list[str]) -> None:
    folders = argv or [f for f, extra in FOLDERS.items() if not extra]
    every, every_ar, every_spread = [], [], []
    print(
        f"{'folder':<42} {'plan':<8} {'timing-only speedup moves':<44} no-spec step (ar) by batch"
    )
    for name in folders:
        rows, spreads, col = pairs(ROOT / name)
        if not rows:
            continue
        by_batch: dict[int, list[float]] = {}
        seen = set()
        for r in rows:
            if (r["file"], r["batch"]) not in seen:  # one ar per document and batch
                seen.add((r["file"], r["batch"]))
                by_batch.setdefault(r["batch"], []).append(r["ar"])
                every_ar.append(r["ar"])
        ar = " ".join(f"B{b} {statistics.fmean(v):+.1%}" for b, v in sorted(by_batch.items()))
        clocks = [r["clock"] for r in rows if r["clock"] is not None]
        clk = f"  clock {statistics.fmean(clocks):+.1%}" if clocks else ""
        print(f"{name:<42} {col:<8} {_stats([r['speedup'] for r in rows]):<44} {ar}{clk}")
        every += rows
        every_spread += spreads
    print()
    print(f"timing-only speedup, execute vs calibrate: {_stats([r['speedup'] for r in every])}")
    print(f"step without speculation, execute vs calibrate: {_stats(every_ar)}")
    print(f"execute's own repeats, (max - min) / mean step: {_stats(every_spread)}")
    worst = sorted(every, key=lambda r: -abs(r["speedup"]))[:8]
    print("largest moves: " + "; ".join(
        f"B{r['batch']} {r['tree']} {r['speedup']:+.1%}" for r in worst
    ))  # fmt: skip


if __name__ == "__main__":
    main(sys.argv[1:])
