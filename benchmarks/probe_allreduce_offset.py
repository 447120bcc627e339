"""The all-reduces of a split forward against the collectives sweep: the offset, and the check with it (CPU)

    python -m benchmarks.probe_allreduce_offset                  # the TP folders below
    python -m benchmarks.probe_allreduce_offset benchmarks/results/tp_h100x2_c

The interconnect terms of a calibration come from the collectives sweep, which times each
all-reduce in place after a GEMM (executor.collectives.in_place_all_reduce). Inside a split
forward an all-reduce costs more or less than that: a TP verify grid (verify-tpN.json, each
point timed with and without its collectives) reads the difference off directly.

For each verify-tpN.json of a folder this probe takes the offsets `spectune calibrate --tp N`
adds to the all-reduce law at N (validate.fit.fit_inforward_offset: per grid point,
(seconds - seconds_nocomm - the model's collectives) / (2 x layers); the median per message
size timed twice or more, of all points for the others; it prints the median of all) and runs
`spectune check` of the folder with the shifted calibration. The grid that measured the offset
is then in sample; the executions (execute-tpN.json) are not. A folder whose calibration has no
law rows at a tp (older fits used the single ring law) is left unshifted there.

It prints, per folder, the offsets (us) and per tp > 1 document the verify MAPE and worst (mean)
speedup error with the committed calibration and with the shifted one, then one JSON document.
Nothing in the folders is written.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.bench_refit import FOLDERS, _cell, _load, _per_file, check_with
from spectune.specs.calibration import Calibration
from spectune.validate.check import calibrations_in
from spectune.validate.fit import fit_inforward_offset

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = tuple(f for f, extra in FOLDERS.items() if extra)  # bench_refit's TP folders


def offsets(folder: Path, cal: Calibration) -> tuple[Calibration, dict[int, float]]:
    """cal with each verify-tpN.json's offset added to its tp's all-reduce law
    (validate.fit.fit_inforward_offset), and tp -> offset, s."""
    out: dict[int, float] = {}
    for vf in sorted(folder.glob("verify-tp*.json")):
        cal, rep = fit_inforward_offset(_load(vf), cal)
        if rep is not None:
            out[int(rep["tp"])] = rep["offset_us"] * 1e-6
    return cal, out


def main(argv: list[str]) -> int:
    results: list[dict[str, Any]] = []
    for name in argv or DEFAULT:
        src = ROOT / name
        cal = next(iter(calibrations_in(src).values()))
        moved, offs = offsets(src, cal)
        before = _per_file(check_with(src, cal))
        after = _per_file(check_with(src, moved))
        print(f"{name}: offset per all-reduce " + ", ".join(
            f"tp {tp} {v * 1e6:.1f} us" for tp, v in sorted(offs.items())
        ))  # fmt: skip
        for f in sorted(before):
            if f.startswith(("execute-tp", "verify-tp")):
                print(f"  {f:<24} {_cell(before[f])}  ->  {_cell(after[f])}")
        results.append({"folder": name, "offset_s": offs, "before": before, "after": after})
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
