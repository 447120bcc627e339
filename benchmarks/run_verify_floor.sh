#!/usr/bin/env bash
# Issue 18's batch-1 goal on one GPU, in one call: the GPU tests of the kernels the fused verify
# path touches, then benchmarks/bench_verify_floor.py (verify B=1 N=64 ctx 4096, Llama-3.1-8B
# real shape: the base path and the fused layers timed in the same process, ratio to the HBM
# floor, per-op breakdown).
#
#     OUT=$OUT bash benchmarks/run_verify_floor.sh      # from the repo root; OUT defaults to ./out
#
# About 5-7 minutes on an H100 or H200 from a cold Triton cache (tests <= 170 s, bench <= 300 s,
# each under its own time limit; the bench writes verify_floor.json at each stage, so a cut run
# still leaves what it measured). Knobs (environment):
#     VF_PARTS    parts to run, default "tests bench"
#     VF_ARGS     extra bench_verify_floor.py options (e.g. "--quick", "--no-breakdown",
#                 "--variants fused+pdl,pf-o", "--tune-budget-s 60")
#     VF_TESTS_S / VF_BENCH_S   per-part limits in seconds (170 / 300)
# Writes under $OUT: run.log (everything printed), tests.log, verify_floor.json (all rows) and
# summary.txt (the table printed last).
set -uo pipefail
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=$(command -v python3 || command -v python)
PARTS=${VF_PARTS:-tests bench}
LOG="$OUT/run.log"
: >"$LOG"
STATUS=()

{
    echo "== $(date -u +%FT%TZ) rev $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
} 2>&1 | tee -a "$LOG"

if [[ " $PARTS " == *" tests "* ]]; then
    echo "== GPU tests" | tee -a "$LOG"
    timeout "${VF_TESTS_S:-170}" $PY -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_kernels_gemm_fused.py tests/test_executor_fused.py \
        tests/test_kernels_attention.py tests/test_kernels_elementwise.py 2>&1 | tee "$OUT/tests.log" | tee -a "$LOG" | tail -15
    STATUS+=("tests rc=${PIPESTATUS[0]}")
fi

if [[ " $PARTS " == *" bench "* ]]; then
    echo "== bench_verify_floor" | tee -a "$LOG"
    # shellcheck disable=SC2086  # the options are meant to split
    timeout "${VF_BENCH_S:-300}" $PY benchmarks/bench_verify_floor.py --out "$OUT" ${VF_ARGS:-} \
        2>&1 | tee -a "$LOG"
    STATUS+=("bench rc=${PIPESTATUS[0]}")
fi

echo "== ${STATUS[*]}" | tee -a "$LOG"
if [[ -f "$OUT/tests.log" ]]; then
    echo "== GPU tests: $(grep -E 'passed|failed|error|skipped|deselected' "$OUT/tests.log" | tail -1)"
fi
if [[ -f "$OUT/summary.txt" ]]; then
    echo "== summary"
    cat "$OUT/summary.txt"
fi
