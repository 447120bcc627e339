#!/usr/bin/env bash
# The same Llama-3.1-8B verify forwards at tp 1 and tp 2 on one host, kernel time by class, to
# place what the tp 2 price misses at batch 32-64 and 4-8 tree tokens (issue 22: the 256-row
# verify is priced 3.5-5% low at tp 2 and within 1% at tp 1 on the same GPUs).
#
#     OUT=$OUT bash benchmarks/run_tp_classes.sh      # from the repo root, on 2 GPUs of one host
#
# benchmarks/probe_tp_forward.py at --tp 1 (GPU 0) and --tp 2 (GPUs 0, 1) over TPC_SHAPES
# (default B 1 / 32 / 64 x N 1 / 4 / 8 at context 4096), each shape with and without its
# collectives, under torch.profiler. About 3 minutes. Writes under $OUT: tp1_forward.json,
# tp2_forward.json (per shape: wall, kernel time by class, the longest kernels by name), run.log.
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
: >"$LOG"
SHAPES=${TPC_SHAPES:-1x1,1x4,1x8,32x1,32x4,32x8,64x1,64x4,64x8}
{
    device_header
    for tp in 1 2; do
        echo "== tp $tp"
        timeout "${TPC_PROBE_S:-200}" $PY benchmarks/probe_tp_forward.py --tp "$tp" \
            --shapes "$SHAPES" --out "$OUT/tp${tp}_forward.json" 2>&1 | grep -v -i warn
    done
} 2>&1 | tee -a "$LOG" | tail -40
