#!/usr/bin/env bash
# Issue 18's batch-1 verify on one GPU, in one call:
#   1. GPU tests of the tree attention and its plans (the tuner's PDL / half-partial candidates);
#   2. bench_verify_floor.py, base path only: verify B=1 N=64 ctx 4096 against the HBM floor,
#      per-op breakdown;
#   3. probe_forward_kernels.py at batch 1 and 8: the verify graph kernel by kernel, attention
#      tuned as a Session tunes it;
#   4. probe_pruned_verify.py at batch 1 and 8: the pruned (ragged) verify beside the dense one.
#
#     OUT=$OUT bash benchmarks/run_batch1_verify.sh     # from the repo root; OUT defaults to ./out
#
# About 6-8 minutes on an H100 or H200. Wheels under .whl/ (optuna, simpy, hypothesis and their
# dependencies) are installed first when present (carry them with the call). Writes under $OUT:
# run.log, tests.log, floor/verify_floor.json + floor/summary.txt, forward.json,
# pruned_b1.json / .log, pruned_b8.json / .log, summary.txt (the tables printed last).
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source benchmarks/device_env.sh
SUM="$OUT/summary.txt"
: >"$LOG"
: >"$SUM"
{
    device_header
    echo "== GPU tests"
    timeout 150 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_attention.py \
        tests/test_kernels_plan.py 2>&1 | tee "$OUT/tests.log" | tail -3
    echo "== verify floor (base)"
    timeout 200 $PY benchmarks/bench_verify_floor.py --out "$OUT/floor" --variants base --quick \
        --tune-budget-s 5 2>&1 | grep -v -i warn | tail -14
    echo "== forward kernels"
    timeout 200 $PY benchmarks/probe_forward_kernels.py --reps 5 --shapes 1x16,1x32,1x64,8x16,8x32 \
        --out "$OUT/forward.json" 2>&1 | grep -v '^{' | grep -v -i warn | tail -12
    for b in 1 8; do
        echo "== pruned verify B=$b"
        timeout 240 $PY benchmarks/probe_pruned_verify.py --batch "$b" --out "$OUT/pruned_b$b.json" \
            >"$OUT/pruned_b$b.log" 2>&1
        echo "rc=$?"
        sed -n '/verify phase vs/,$p' "$OUT/pruned_b$b.log"
        grep -A3 Traceback "$OUT/pruned_b$b.log" | tail -4
    done
} 2>&1 | tee -a "$LOG" | tee "$SUM" | tail -70
