"""Refit every committed raw calibration run with the current fit and re-check its folder.

    python -m benchmarks.bench_refit                    # the folders below
    python -m benchmarks.bench_refit measurements/h100-newuser3 ...
    python -m benchmarks.bench_refit --tile-m 32 ...     # the fit with another gemm_tile_m
    python -m benchmarks.bench_refit --hold-weight-bw ...  # weight bandwidth held at the GEMM line's rate

A change to the cost model or to `spectune calibrate`'s fit (spectune.validate.fit) is judged
here the way a new user meets it: each folder's `calibrate-run.json` (the device's raw
micro-benchmarks, verify grid and short speculative runs) is refitted on CPU, with the
one-GPU measurement documents its README names as fit input (the TP folders'
measurement-tp1.json), each split grid (verify-tpN.json) moving the all-reduce law at its tp
by the in-forward offset and scaling the target's weight GEMMs there by row count
(validate.fit.fit_inforward_offset, fit_tp_gemm_scale), as `spectune calibrate --from-run
verify-tpN.json --base` does in benchmarks/run_tp_gpu.sh, and every document of the folder is
re-predicted with that calibration by `spectune check`'s code
(spectune.validate.check.check_folder). The executions of the new-user folders
(execute-*.json) and every tp > 1 document stay out of the fit, so their errors are out of
sample. Each line gives the committed calibration's figures (as the folder was
checked when it was made) beside the refit's: verify MAPE per file and the worst and mean
speedup error per file; then over the executions (goal_errors) the worst and mean error of
the goal's rows (the planned policy and the engines' defaults) and the mean and worst of every
execution. The last lines average these over the folders refitted. Nothing in the folders is
written. `--tile-m N` fits from a base calibration with gemm_tile_m N instead of the default's
(results/tile_m_cpu.txt compares 64 and 32).
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from spectune.specs.calibration import Calibration
from spectune.specs.io import loads_json, read_bytes_bounded
from spectune.validate.check import CALIBRATION_SCHEMA, CheckResult, check_folder
from spectune.validate.fit import fit_calibration, fit_inforward_offset, fit_tp_gemm_scale

ROOT = Path(__file__).resolve().parent.parent
#: folder -> measurement documents that join calibrate-run.json in the fit
FOLDERS: dict[str, tuple[str, ...]] = {
    "measurements/h100-newuser": (),
    "measurements/h100-newuser2": (),
    "measurements/h100-newuser3": (),
    "measurements/h100-newuser4": (),
    "measurements/h100-newuser5": (),
    "measurements/h100-newuser6": (),
    "measurements/h100-newuser7": (),
    "measurements/h100-newuser8": (),
    "measurements/h100-newuser9": (),
    "measurements/h100-newuser10": (),
    "measurements/h100-newuser11": (),
    "measurements/h100-newuser12": (),
    "measurements/h100-newuser13": (),
    "measurements/h100-newuser14": (),
    "measurements/h100-newuser15": (),
    "measurements/h100-newuser16": (),
    "measurements/h100-newuser17": (),
    "measurements/h100-newuser18": (),
    "measurements/h200-newuser": (),
    "measurements/h200-newuser2": (),
    "measurements/h200-newuser3": (),
    "measurements/h200-newuser4": (),
    "measurements/h200-newuser5": (),
    "measurements/h200-newuser6": (),
    "measurements/h200-newuser7": (),
    "measurements/h200-newuser8": (),
    "measurements/h200-newuser9": (),
    "measurements/h200-newuser10": (),
    "benchmarks/results/new_gpu_h100_repeat": (),
    "benchmarks/results/new_gpu_h100_calonly": (),
    "benchmarks/results/new_gpu_h200_rerun": (),
    "benchmarks/results/new_gpu_h100_tuner": (),
    "benchmarks/results/tp_h100x2": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_b": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_c": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_f": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_g": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_h": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_i": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x2_j": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100x4": ("measurement-tp1.json",),
    "benchmarks/results/tp_h100_rerun": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x4": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x4_b": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x4_c": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x4_d": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x4_e": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_b": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_c": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_d": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_e": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_f": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_h": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_i": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_j": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_k": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_l": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_m": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_n": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_o": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_p": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_q": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_r": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_s": ("measurement-tp1.json",),
    "benchmarks/results/tp_h200x2_t": ("measurement-tp1.json",),
    "measurements/h200x2-tp": ("measurement-tp1.json",),
    "measurements/h200x4-tp": ("measurement-tp1.json",),
}


def _load(p: Path) -> Any:
    return loads_json(read_bytes_bounded(p), str(p))


def _per_file(res: CheckResult) -> dict[str, dict[str, float]]:
    """file -> verify_sum/verify_n (|error| of its verify rows), speedup_sum/speedup_n/
    speedup_worst (|error| of its speedup rows)."""
    out: dict[str, dict[str, float]] = {}
    for kind, rows in (("verify", res.verify), ("speedup", res.speedup)):
        for r in rows:
            f = out.setdefault(r.file, {})
            f[f"{kind}_sum"] = f.get(f"{kind}_sum", 0.0) + abs(r.error)
            f[f"{kind}_n"] = f.get(f"{kind}_n", 0) + 1
            if kind == "speedup":
                f["speedup_worst"] = max(f.get("speedup_worst", 0.0), abs(r.error))
    return out


#: run labels of the goal's rows (issue 18 and 22): the planned policy and the engines' defaults
GOAL_LABELS = frozenset(
    {"policy", "planned", "sglang-default", "vllm-k3", "dynamic-topk:5,4,8",
     "dynamic-topk:7,10,60"}
)  # fmt: skip


def goal_errors(res: CheckResult) -> dict[str, float]:
    """Speedup errors of the out-of-sample executions (files execute-*.json): over the goal's
    rows (GOAL_LABELS: the planned policy, SGLang's 5/4/8, vLLM's 3/1/4, EAGLE's 7/10/60)
    "goal_worst" / "goal_mean" of |error|, and over every execution "all_mean" / "all_worst".
    Empty where a folder has no execution."""
    rows = [r for r in res.speedup if r.file.startswith("execute-")]
    goal = [abs(r.error) for r in rows if r.what.split()[2] in GOAL_LABELS]
    out: dict[str, float] = {}
    if goal:
        out |= {"goal_worst": max(goal), "goal_mean": sum(goal) / len(goal)}
    if rows:
        errs = [abs(r.error) for r in rows]
        out |= {"all_mean": sum(errs) / len(errs), "all_worst": max(errs)}
    return out


def n1_bias(res: CheckResult) -> dict[str, float | None]:
    """Mean signed error (predicted / measured - 1) of the one-token verify passes: the verify
    grid's N = 1 rows ("grid", calibrate-run.json) and the no-speculation step of the
    executions ("step", each measurement's "(baseline)" verify row). Every predicted speedup
    divides by that step, so a positive bias here lifts them all. None where a folder has none."""
    grid = [r.error for r in res.verify if " N=1 " in r.what and "(baseline)" not in r.what]
    step = [r.error for r in res.verify if r.what.endswith("(baseline)")]
    return {
        "grid": float(sum(grid) / len(grid)) if grid else None,
        "step": float(sum(step) / len(step)) if step else None,
    }


def check_with(src: Path, cal: Calibration) -> CheckResult:
    """`spectune check` of folder `src` with `cal` in place of its committed calibration (the
    folder is copied; nothing in it is written)."""
    with tempfile.TemporaryDirectory() as tmp:
        for p in src.glob("*.json"):
            data = _load(p)
            if isinstance(data, dict) and data.get("schema") == CALIBRATION_SCHEMA:
                continue
            shutil.copy(p, Path(tmp) / p.name)
        cal.save(Path(tmp) / f"calibration-{cal.hardware}.json")
        return check_folder(tmp)


def refit_calibration(
    folder: str, extra: tuple[str, ...], base: Calibration | None = None, **fit: bool
) -> tuple[Calibration, dict[str, Any]]:
    """The calibration `spectune calibrate` fits from folder's calibrate-run.json with the
    measurement documents `extra` (from `base`, with fit_calibration's `fit` options), each
    split grid (verify-tpN.json) then moving the all-reduce law at its tp by the in-forward
    offset and scaling the weight GEMMs there by row count, as `spectune calibrate --from-run
    verify-tpN.json --base` does; and the fit's report."""
    src = ROOT / folder
    run = _load(src / "calibrate-run.json")
    docs = [_load(src / name) for name in extra]
    cal, report = fit_calibration(run, docs, base=base, **fit)
    for grid in sorted(src.glob("verify-tp*.json")):
        cal, _ = fit_inforward_offset(_load(grid), cal)
        cal, _ = fit_tp_gemm_scale(_load(grid), cal)
    return cal, report


def refit(
    folder: str, extra: tuple[str, ...], base: Calibration | None = None, **fit: bool
) -> dict[str, Any]:
    """The committed and refitted check of one folder (fitted from `base`, default the
    default Calibration, with fit_calibration's `fit` options), and the refit's parameters."""
    src = ROOT / folder
    cal, report = refit_calibration(folder, extra, base, **fit)
    before = check_folder(src)
    after = check_with(src, cal)
    return {
        "folder": folder,
        "params": report["params"],
        "determined": report["identified"].get("determined", []),
        "before": {"verify_mape": before.verify_mape, "worst": before.worst_speedup_error,
                   "n1_bias": n1_bias(before), "files": _per_file(before),
                   "goal": goal_errors(before)},
        "after": {"verify_mape": after.verify_mape, "worst": after.worst_speedup_error,
                  "n1_bias": n1_bias(after), "files": _per_file(after),
                  "goal": goal_errors(after)},
    }  # fmt: skip


def _cell(f: dict[str, float]) -> str:
    v = f"{100 * f['verify_sum'] / f['verify_n']:5.2f}%" if f.get("verify_n") else "     -"
    s = (
        f"{100 * f['speedup_worst']:4.1f}% ({100 * f['speedup_sum'] / f['speedup_n']:3.1f}%)"
        if f.get("speedup_n")
        else "          -"
    )
    return f"{v} {s:>13}"


def _goal(g: dict[str, float]) -> str:
    if "goal_worst" not in g:
        return f"- | {100 * g['all_mean']:.2f} / {100 * g['all_worst']:.1f}%"
    return (
        f"{100 * g['goal_worst']:.1f} / {100 * g['goal_mean']:.2f} | "
        f"{100 * g['all_mean']:.2f} / {100 * g['all_worst']:.1f}%"
    )


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}%"


def main(argv: list[str]) -> int:
    base = None
    fit: dict[str, bool] = {}
    if argv[:1] == ["--hold-weight-bw"]:
        fit["hold_weight_bw"], argv = True, argv[1:]
    if argv[:1] == ["--tile-m"]:
        if len(argv) < 2 or not argv[1].isdigit() or int(argv[1]) < 1:
            print("--tile-m needs a positive integer (rows of a GEMM tile)", file=sys.stderr)
            return 2
        base, argv = Calibration(gemm_tile_m=int(argv[1])), argv[2:]
    folders = {f: FOLDERS.get(f, ()) for f in argv} if argv else FOLDERS
    results = []
    print("per file: verify MAPE, worst (mean) |speedup error|; committed calibration -> refit")
    for folder, extra in folders.items():
        if not (ROOT / folder / "calibrate-run.json").is_file():
            print(f"{folder}: no calibrate-run.json, skipped")
            continue
        r = refit(folder, extra, base, **fit)
        results.append(r)
        b, a = r["before"], r["after"]
        print(
            f"{folder}: verify MAPE {100 * b['verify_mape']:.2f}% -> {100 * a['verify_mape']:.2f}%"
            f", worst speedup error {100 * b['worst']:.1f}% -> {100 * a['worst']:.1f}%"
        )
        for name in sorted(a["files"]):
            print(f"  {name:<32} {_cell(b['files'].get(name, {}))}  ->  {_cell(a['files'][name])}")
        bias = " ".join(
            f"{k} {_pct(b['n1_bias'][k])} -> {_pct(a['n1_bias'][k])}" for k in ("grid", "step")
        )
        print(f"  N=1 bias (mean signed error): {bias}")
        if a["goal"]:
            print(
                f"  executions, goal rows worst / mean | all mean / worst: {_goal(b['goal'])}"
                f" -> {_goal(a['goal'])}"
            )
        split = r["params"].get("attention_split_us")
        print(
            f"  fitted attention_split_s {split:.1f} us; determined: {', '.join(r['determined'])}"
        )
    _summary(results)
    print(json.dumps(results))
    return 0


def _summary(results: list[dict[str, Any]]) -> None:
    """Means over the folders (committed -> refit): verify MAPE, and the execution errors of
    goal_errors (the goal rows' worst, its mean, and the largest goal row of any folder)."""
    if not results:
        return
    for side in ("before", "after"):
        rs = [r[side] for r in results]
        goals = [r["goal"] for r in rs if "goal_worst" in r["goal"]]
        line = f"mean of {len(rs)} ({side}): verify MAPE {100 * np.mean([r['verify_mape'] for r in rs]):.2f}%"
        if goals:
            line += (
                f"; goal rows worst {100 * np.mean([g['goal_worst'] for g in goals]):.2f}%"
                f" (max {100 * max(g['goal_worst'] for g in goals):.1f}%),"
                f" mean {100 * np.mean([g['goal_mean'] for g in goals]):.2f}% over {len(goals)}"
            )
        print(line)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
