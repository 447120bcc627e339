#!/usr/bin/env bash
# The same Llama-3.1-8B verify forwards at tp 1 and tp 2 on one host, kernel time by class, to
# place what the tp 2 price misses at batch 32-64 and 4-8 tree tokens (issue 22: the 256-row
# verify is priced 3.5-5% low at tp 2 and within 1% at tp 1 on the same GPUs).
#
#     OUT=$OUT bash benchmarks/run_tp_classes.sh      # from the repo root, on 2 GPUs of one host
#
# benchmarks/probe_tp_forward.py over TPC_SHAPES (default B 1 / 32 / 64 x N 1 / 4 / 8 at context
# 4096), each shape with and without its collectives, under torch.profiler; and the drafter's
# step over TPC_DRAFT_SHAPES (B x frontier width; default the TP runs' widths 1 / 4 / 10 at
# batch 1 and 8, width 1 and 4 at 32, 1 at 64; '' for none). Parts (TPC_PARTS,
# default "tp1 tp2"):
#   tp1    tp 1 on GPU 0                                   -> $OUT/tp1_forward.json
#   tp2    tp 2 on GPUs 0, 1                               -> $OUT/tp2_forward.json
#   gpu1   tp 1 on GPU 1: how far the two chips of one host differ -> $OUT/gpu1_forward.json
#   both   tp 1 on GPUs 0 and 1 at once (two processes): whether both busy slows either
#                                         -> $OUT/both0_forward.json, both1_forward.json
# About 1 minute a part. Also writes run.log and clocks.txt (each GPU's clocks and power limit).
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
: >"$LOG"
SHAPES=${TPC_SHAPES:-1x1,1x4,1x8,32x1,32x4,32x8,64x1,64x4,64x8}
DRAFT=${TPC_DRAFT_SHAPES-1x1,1x4,1x10,8x1,8x4,8x10,32x1,32x4,64x1}
PARTS=${TPC_PARTS:-tp1 tp2}
LIMIT=${TPC_PROBE_S:-200}
has() { [[ " $PARTS " == *" $1 "* ]]; }
probe() {  # probe TP OUTFILE [CUDA_VISIBLE_DEVICES]
    CUDA_VISIBLE_DEVICES=${3:-${CUDA_VISIBLE_DEVICES:-}} timeout "$LIMIT" $PY \
        benchmarks/probe_tp_forward.py --tp "$1" --shapes "$SHAPES" --draft-shapes "$DRAFT" \
        --out "$OUT/$2" 2>&1 \
        | grep -v -i warn
}
{
    device_header
    nvidia-smi --query-gpu=index,clocks.max.sm,clocks.max.mem,power.limit,temperature.gpu \
        --format=csv >"$OUT/clocks.txt" 2>&1
    cat "$OUT/clocks.txt"
    if has tp1; then echo "== tp 1, GPU 0"; probe 1 tp1_forward.json 0; fi
    if has tp2; then echo "== tp 2, GPUs 0,1"; probe 2 tp2_forward.json 0,1; fi
    if has gpu1; then echo "== tp 1, GPU 1"; probe 1 gpu1_forward.json 1; fi
    if has both; then
        echo "== tp 1 on GPU 0 and GPU 1 at once"
        probe 1 both0_forward.json 0 >"$OUT/both0.log" &
        probe 1 both1_forward.json 1 >"$OUT/both1.log"
        wait
        tail -n 12 "$OUT/both0.log" "$OUT/both1.log"
    fi
} 2>&1 | tee -a "$LOG" | tail -80
