"""Issue 22's per-row goal as a CI gate on the fit: a new user's calibration (the one-GPU fit,
then each split grid's in-forward all-reduce offset and GEMM scale by row count, as
benchmarks/run_tp_gpu.sh runs `spectune calibrate`) predicts the speedup of every tensor-parallel
execution of a committed device run within 3%.

The executions (execute-tpN.json and their repeats) stay out of the fit, so these errors are out
of sample. Each folder is refitted on CPU by benchmarks.bench_refit.refit_calibration, the code
the device run's calibration came from; a change to the cost model or to spectune.validate.fit
that loses the goal on these runs fails here. Made on the device by `TP_REPEAT=1 bash
benchmarks/run_tp_gpu.sh`; the folders' READMEs give the cards and commits.
"""

from __future__ import annotations

import pytest

from benchmarks.bench_refit import FOLDERS
from benchmarks.bench_tp_rows import rows

#: the issue's goal: |predicted / measured speedup - 1| on every TP execution row
GOAL = 0.03

#: tp_h200x2_r: 2x H200, tp 2, 12 runs timed twice, made after the GEMM scale landed (worst
#: 1.9% on the device); tp_h200x4_e: 4x H200, tp 4, 12 runs, made with the current executor
#: (worst 1.8% refitted)
RUNS = ("benchmarks/results/tp_h200x2_r", "benchmarks/results/tp_h200x4_e")


@pytest.mark.slow
@pytest.mark.parametrize("folder", RUNS)
def test_every_tp_row_within_the_goal(folder: str) -> None:
    found = rows(folder, FOLDERS[folder])
    assert len(found) >= 12 and all(tp > 1 for tp, *_ in found)
    over = [(tp, b, label, f"{e:+.1%}") for tp, b, label, e in found if abs(e) > GOAL]
    assert not over, f"{folder}: TP speedup rows over {GOAL:.0%}: {over}"
