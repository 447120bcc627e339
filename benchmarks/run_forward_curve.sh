#!/usr/bin/env bash
# A target forward's time along the tree-token axis on one GPU, kernel by kernel, in one call:
# the GPU tests of the elementwise kernels (RoPE + K/V store among them), then
# benchmarks/probe_forward_kernels.py over batch 1 / 8 / 64 and 1-64 tree tokens at context 4096
# (Llama-3.1-8B real shape, the executor's verify graph under torch.profiler).
#
#     OUT=$OUT bash benchmarks/run_forward_curve.sh       # from the repo root; OUT defaults to ./out
#
# About 3-4 minutes on an H100 or H200. Knobs (environment):
#     FC_SHAPES   the probe's --shapes (BxN list)
#     FC_PROBE_S  the probe's time limit in seconds (420)
# Wheels under .whl/ (hypothesis and its dependencies, for the tests) are installed first when
# present (carry them with the call). Writes under $OUT: run.log, tests.log, forward_curve.json
# (the probe's rows), summary.txt (the table printed last).
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source benchmarks/device_env.sh
: >"$LOG"
SHAPES=${FC_SHAPES:-1x1,1x4,1x8,1x16,1x24,1x32,1x48,1x64,8x1,8x4,8x8,8x16,8x32,64x1,64x8,64x56,64x60,64x64}
{
    device_header
    echo "== GPU tests"
    timeout 170 $PY -m pytest -q -m gpu -p no:cacheprovider tests/test_kernels_elementwise.py 2>&1 \
        | tee "$OUT/tests.log" | tail -5
    echo "== probe"
    timeout "${FC_PROBE_S:-420}" $PY benchmarks/probe_forward_kernels.py --reps 5 --shapes "$SHAPES" \
        --out "$OUT/forward_curve.json" 2>&1 | grep -v '^{' | grep -v -i warn | tee "$OUT/summary.txt"
} 2>&1 | tee -a "$LOG" | tail -40
