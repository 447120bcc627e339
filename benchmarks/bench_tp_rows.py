"""Which TP speedup rows the cost model misses on every host, and by how much (CPU).

    python -m benchmarks.bench_tp_rows                       # every TP folder of bench_refit
    python -m benchmarks.bench_tp_rows benchmarks/results/tp_h100x2_h ...

Each folder is refitted as a new user's `spectune calibrate` would (bench_refit.refit_calibration:
the one-GPU fit, then each split grid's in-forward all-reduce offset) and checked. Its
executions (execute-tpN.json, and a second timing execute-tpN-repeat.json where the run had
TP_REPEAT=1) are out of sample. Per row (tp, GPU, batch, the run's label) over the folders: the
mean signed speedup error (predicted / measured - 1), its spread (population standard
deviation) and the largest |error|. A row whose mean sits far from 0 with a small spread is the
cost model's, the same on every host; a row with a mean near 0 and a wide spread is the hosts'.
The per-row goal (|error| <= 3% on every row) needs every mean and spread small together.
"""

from __future__ import annotations

import re
import statistics
import sys
from collections import defaultdict

from benchmarks.bench_refit import FOLDERS, ROOT, check_with, refit_calibration

#: an execution's speedup row as spectune check names it
ROW = re.compile(r"execute-tp(\d+)(?:-repeat)?\.json$")


def rows(folder: str, extra: tuple[str, ...]) -> list[tuple[int, int, str, float]]:
    """(tp, batch, label, signed speedup error) of every TP execution row of one folder."""
    cal, _ = refit_calibration(folder, extra)
    res = check_with(ROOT / folder, cal)
    out = []
    for r in res.speedup:
        m = ROW.match(r.file)
        if m is None:
            continue
        _, batch, label = r.what.split()[:3]
        out.append((int(m.group(1)), int(batch.removeprefix("B=")), label, r.error))
    return out


def gpu_of(folder: str) -> str:
    """The GPU kind a folder's name gives (the TP folders name theirs: tp_h100x2_h, h200x4-tp)."""
    return "h100" if "h100" in folder else "h200" if "h200" in folder else "?"


def main(argv: list[str]) -> int:
    folders = argv or [f for f in FOLDERS if list((ROOT / f).glob("verify-tp*.json"))]
    errors: dict[tuple[int, str, int, str], list[float]] = defaultdict(list)
    for folder in folders:
        if not (ROOT / folder / "calibrate-run.json").is_file():
            print(f"{folder}: no calibrate-run.json, skipped", file=sys.stderr)
            continue
        found = rows(folder, FOLDERS.get(folder, ()))
        for tp, batch, label, err in found:
            errors[(tp, gpu_of(folder), batch, label)].append(err)
        worst = max((abs(e) for *_, e in found), default=0.0)
        print(f"{folder}: {len(found)} rows, worst {worst:.1%}", file=sys.stderr, flush=True)
    print(
        f"{'tp':>2} {'gpu':<5} {'B':>3} {'label':<16} {'mean':>7} {'spread':>7} {'worst':>6} runs"
    )
    for (tp, gpu, batch, label), errs in sorted(errors.items()):
        print(
            f"{tp:>2} {gpu:<5} {batch:>3} {label:<16.16} {statistics.fmean(errs):>+7.2%} "
            f"{statistics.pstdev(errs):>7.2%} {max(abs(e) for e in errs):>6.1%} {len(errs):>4}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
