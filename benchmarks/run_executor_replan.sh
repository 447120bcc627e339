#!/usr/bin/env bash
# Executor measurements for measurements/h200-replan (one GPU process per command; run on the
# device from the repo root). Part A: GPU tests, the re-planned table (min_gain 0, pruning
# allowed) beside the engine defaults at B 1/8/32/64, and a longer repeat at B 32/64 (the
# planned-vs-default margin there is a few %, so it needs more steps than the usual 40).
# Part B: recorded-trace acceptance and the pruned-tree benchmark. Part C: the ragged-path
# overhead runs alone.
#     OUT=... bash benchmarks/run_executor_replan.sh A|B|C
set -uo pipefail
OUT=${OUT:-out}
M=measurements/h200-replan
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
part=${1:-A}
if [ "$part" = A ]; then
    python -m pytest -q -m gpu tests/test_executor_prune.py tests/test_executor.py \
        tests/test_kernels_attention.py 2>&1 | tail -3
    python -m spectune execute --policy $M/policy-planned-nomargin.json --batch 1,8,32,64 \
        --context 4096 --also dynamic-topk:5,4,8 --also dynamic-topk:7,10,60 --steps 100 \
        --out "$OUT/execute-planned.json" 2>&1 | tee "$OUT/execute-log.txt"
    python -m spectune execute --policy $M/policy-planned-nomargin.json --batch 32,64 \
        --context 4096 --also dynamic-topk:5,4,8 --also dynamic-topk:4,2,8 --steps 300 \
        --out "$OUT/execute-repeat.json" 2>&1 | tee -a "$OUT/execute-log.txt"
elif [ "$part" = C ]; then
    # the ragged path again after its padding sequence stopped counting toward the split choice
    python -m spectune execute --policy static:5,5,87 --also static:5,5,87,1e-09,0 \
        --also static:5,5,87,0.01,0 --also dynamic-topk:6,10,32 \
        --also dynamic-topk:6,10,32,1e-09,0 --batch 1,8,32 --context 4096 --steps 60 \
        --out "$OUT/execute-ragged.json" 2>&1 | tee "$OUT/execute-ragged-log.txt"
else
    python -m spectune execute --policy dynamic-topk:5,4,8 --also dynamic-topk:4,4,16 \
        --also dynamic-topk:6,8,32 --batch 1,8,32 --context 4096 --steps 60 \
        --acceptance-trace data/traces/smollm2-mtbench.jsonl.gz \
        --out "$OUT/execute-trace.json" 2>&1 | tee "$OUT/execute-trace-log.txt"
    # what the ragged (pruned) path costs by itself: a threshold of 1e-9 prunes nothing, so
    # it verifies the same tokens as the dense run through the ragged path
    python -m spectune execute --policy static:5,5,87 --also static:5,5,87,1e-09,0 \
        --also static:5,5,87,0.01,0 --also dynamic-topk:6,10,32 \
        --also dynamic-topk:6,10,32,1e-09,0 --batch 1,8,32 --context 4096 --steps 60 \
        --out "$OUT/execute-ragged.json" 2>&1 | tee "$OUT/execute-ragged-log.txt"
    python benchmarks/bench_executor_prune.py --out "$OUT" 2>&1 | tee "$OUT/prune-log.txt"
fi
