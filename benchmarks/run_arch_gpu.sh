#!/usr/bin/env bash
# Kernels + executor on one GPU, for before/after comparisons of a change to either: the GPU tests
# of tests/test_kernels_*.py and tests/test_executor*.py, benchmarks/bench_kernels.py (tree
# attention against PyTorch and the roofline, greedy verify, sampling, KV compaction) and a short
# benchmarks/bench_executor.py (Llama-3.1-8B + EAGLE-3 at real shape: roofline floor check and
# the engine-default trees at batch 1 and 8). It calls only entry points and options that
# exist on main, so the same script gives the "before" figures there.
#
#     OUT=$OUT bash benchmarks/run_arch_gpu.sh        # from the repo root; OUT defaults to ./out
#
# About 6-9 minutes on an H100 or H200 from a cold Triton cache; each part has its own time limit
# so the whole stays under 10 minutes. Knobs (environment):
#     ARCH_PARTS           parts to run, default "tests kernels executor" (run them in separate
#                          calls when one call has less than 10 minutes)
#     ARCH_KERNELS_ARGS    bench_kernels options, default "--quick --flex-budget-s 0"
#                          (two attention shapes; FlexAttention's compile skipped)
#     ARCH_EXECUTOR_ARGS   bench_executor options, default
#                          "--skip-calibration --batches 1,8 --steps 20"
#     ARCH_TESTS_S / ARCH_KERNELS_S / ARCH_EXECUTOR_S   per-part limits in seconds (200/150/220)
# Writes under $OUT (7 files): run.log (everything printed), kernels.json, executor/ (floor,
# measurement, attention tuning, GEMM autotune JSON) and summary.txt, the table printed last.
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT/executor"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=$(command -v python3 || command -v python)
PARTS=${ARCH_PARTS:-tests kernels executor}
LOG="$OUT/run.log"
: >"$LOG"
status() { echo "$1" >>"$OUT/.status"; }
rm -f "$OUT/.status"

{
    echo "== $(date -u +%FT%TZ) rev $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee -a "$LOG"

if [[ " $PARTS " == *" tests "* ]]; then
    echo "== GPU tests" | tee -a "$LOG"
    timeout "${ARCH_TESTS_S:-200}" $PY -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_kernels_*.py tests/test_executor*.py 2>&1 | tee -a "$LOG"
    status "tests rc=${PIPESTATUS[0]}"
fi

if [[ " $PARTS " == *" kernels "* ]]; then
    echo "== bench_kernels" | tee -a "$LOG"
    # shellcheck disable=SC2086  # the options are meant to split
    timeout "${ARCH_KERNELS_S:-150}" $PY benchmarks/bench_kernels.py \
        ${ARCH_KERNELS_ARGS:---quick --flex-budget-s 0} --out "$OUT/kernels.json" 2>&1 | tee -a "$LOG"
    status "kernels rc=${PIPESTATUS[0]}"
fi

if [[ " $PARTS " == *" executor "* ]]; then
    echo "== bench_executor" | tee -a "$LOG"
    # shellcheck disable=SC2086
    timeout "${ARCH_EXECUTOR_S:-220}" $PY benchmarks/bench_executor.py --out "$OUT/executor" \
        ${ARCH_EXECUTOR_ARGS:---skip-calibration --batches 1,8 --steps 20} 2>&1 | tee -a "$LOG"
    status "executor rc=${PIPESTATUS[0]}"
fi

$PY - "$OUT" <<'EOF' 2>&1 | tee "$OUT/summary.txt"
"""The short table: GPU test counts, tree attention per shape, verify/sampling/compaction, and
the executor's floor ratio and runs, from what the parts wrote (missing parts are said so)."""
import json
import re
import sys
from pathlib import Path

out = Path(sys.argv[1])
log = (out / "run.log").read_text(errors="replace")
status = (out / ".status").read_text().split("\n") if (out / ".status").exists() else []
lines = log.splitlines()
part = next((i for i, x in enumerate(lines) if i and x.startswith("== ")), len(lines))
print("arch GPU check:", " | ".join(x.strip(" =") for x in lines[:part]))
print("exit codes:", ", ".join(s for s in status if s) or "-", "(124: the part hit its time limit)")


def load(path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


counts = r"\d+ (?:passed|failed|errors?|skipped|deselected)"
tests = re.findall(rf"^=* ?({counts}(?:, {counts})* in [\d.]+s.*?) ?=*$", log, re.M)
if tests:
    print("gpu tests:", tests[-1])
k = load(out / "kernels.json")
if k:
    bw = k.get("copy_bytes_per_s", 0.0)
    print(f"tree attention ({k.get('card')}, copy {bw / 1e12:.2f} TB/s), us of GPU time per call:")
    print(f"  {'B':>3} {'ctx':>6} {'N':>3} {'ours':>7} {'default':>7} {'floor':>6} {'%bw':>5} {'sdpa':>7} {'flash':>7}")
    for r in k.get("attention", []):
        def f(x):
            return "-" if x is None else f"{x:.1f}"
        sdpa = min((t for t in (r.get("sdpa_mask_packed_us"), r.get("sdpa_gqa_us")) if t), default=None)
        print(f"  {r['batch']:>3} {r['ctx']:>6} {r['tree_tokens']:>3} {f(r.get('ours_us')):>7} "
              f"{f(r.get('ours_default_us')):>7} {f(r.get('floor_us')):>6} "
              f"{100 * r.get('ours_bw_frac', 0):>5.1f} {f(sdpa):>7} {f(r.get('flash_unmasked_us')):>7}")
    v, c = k.get("verify"), k.get("compact")
    if v:
        walk = [x for key, x in v.items() if re.fullmatch(r"walk_block\d+_us", key) and x]
        arg = [v[key] for key in v if key.startswith("argmax_block") and v[key]]
        gum = [v[key] for key in v if key.startswith("gumbel_block") and v[key]]
        print(f"  walk B=64 x N=64 {min(walk, default=float('nan')):.1f} us; argmax 4096 x 128k "
              f"{min(arg, default=float('nan')):.0f} us (torch {v.get('torch_argmax_us', float('nan')):.0f}); "
              f"gumbel {min(gum, default=float('nan')):.0f} us")
    if c:
        best = [c[key] for key in c if re.fullmatch(r"block\d+_us", key) and c[key]]
        print(f"  kv compaction 32 layers x 64 seqs: {min(best, default=float('nan')):.1f} us")
else:
    print("bench_kernels: no kernels.json")
fl = load(out / "executor" / "floor.json")
m = load(out / "executor" / "measurement.json")
if fl:
    parts = [f"{n} {b['seconds'] * 1e3:.3f} ms ({b['ratio']:.2f}x floor)" for n, b in fl.get("backends", {}).items()]
    print("executor verify B=1 N=64 C=4096:", "; ".join(parts))
if m:
    print(f"executor runs ({m.get('target')} + {m.get('drafter')}, ctx {m.get('context')}), ms per step:")
    runs = m.get("runs", [])
    w = max([len(r["label"]) for r in runs] + [5])
    print(f"  {'B':>3} {'label':<{w}} {'step':>7} {'draft':>6} {'tree':>6} {'verify':>7} {'accept':>6} "
          f"{'compact':>7} {'extend':>6} {'tok/s':>8} {'x':>5}")
    for r in runs:
        p = r.get("phases_ms", {})
        print(f"  {r['batch']:>3} {r['label']:<{w}} {p.get('step', 0):7.3f} {p.get('draft', 0):6.3f} "
              f"{p.get('tree', 0):6.3f} {p.get('verify', 0):7.3f} {p.get('accept', 0):6.3f} "
              f"{p.get('compact', 0):7.3f} {p.get('extend', 0):6.3f} {r.get('tokens_per_s', 0):8.0f} "
              f"{r.get('speedup', 0):5.2f}")
elif fl is None:
    print("bench_executor: no floor.json / measurement.json")
EOF
rm -f "$OUT/.status"
