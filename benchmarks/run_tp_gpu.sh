#!/usr/bin/env bash
# Tensor-parallel executor vs the cost model's TP terms, on one host of 4 GPUs (nvidia-h100-x4:
# tp 4 and tp 2) or 2 GPUs (nvidia-h100-x2 / nvidia-h200-x2: tp 2 only). Every part has its own
# time limit. Measured wall times: on 2 GPUs 4-6 minutes (227 s; 286-331 s with TP_REPEAT=1, 2x
# H200); on 4 GPUs with TP_PARTS="sweep one fit plan tp4 offset check" 6-8 minutes (365 s on one
# 4x H200 host; another reached tp 4 only after 259 s, its one-GPU part taking 157 s and its fit
# 66 s, and ran out of a 400 s call there), so leave 9 minutes of a time-limited machine for it;
# tp 4 and tp 2 together (the 4-GPU default) take longer than one 10-minute call:
#
#     OUT=$OUT bash benchmarks/run_tp_gpu.sh             # from the repo root; OUT defaults to ./out
#     TP2_TARGET=70b OUT=$OUT bash benchmarks/run_tp_gpu.sh    # tp 2 with Llama-3.1-70B (H200)
#     OUT=/tmp/tpdry bash benchmarks/run_tp_gpu.sh --dry-run   # CPU: gloo, tiny models, no timing
#
# Everything lands in $OUT/tp-results.tar.gz (the check folder tp/, sweep.json, logs); beside it
# stay only summary.txt, check.txt and run.log (the device returns a few files).
#
# Needs optuna (the planner's search): on the device, install the wheels first
# (python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl;
# export PYTHONPATH=/tmp/site). NVLink SHARP stays off (NCCL_NVLS_ENABLE=0).
#
# Parts, writing the check folder $OUT/tp/ in the layout of measurements/h200/:
#   sweep   all-reduce / reduce-scatter+all-gather / all-gather / broadcast by message size on
#           2 and 4 GPUs (graph-captured NCCL)                              -> $OUT/sweep.json
#   one     in parallel on separate GPUs (220 s: an H100 took ~150 s for the execute without
#           the static trees), the one-GPU micro-benchmarks of `spectune calibrate`
#           (Llama-3.1-8B, GPU 0) and one-GPU spec decoding (SGLang 5/4/8, a vLLM-style chain
#           3/1/4 and EAGLE's 7/10/60 at B 1/8/32/64, GPU 1: three top-k for the fit's cost per
#           frontier slot, Calibration.draft_slot_s; the static chain 3/1/4 and static 5/4/8,
#           so the static builder's step cost is fitted, as the planner picks static chains)
#                                               -> tp/calibrate-run.json, tp/measurement-tp1.json
#   fit     `spectune calibrate --from-run` over both + the sweep (interconnect terms; the GEMM
#           and attention micro-benchmarks give gemm_fixed_s and attention_fixed_s)
#                                                                  -> tp/calibration-<gpu>.json
#   plan    planned tables for Llama-3.1-70B at tp 4 and Llama-3.1-8B at tp 2 (calibrated)
#   tp4     Llama-3.1-70B + its EAGLE-3 head at real shape, random bf16 weights, split over 4
#           GPUs: verify grid B{1,8,32,64} x N{1,4,8,16,64} at C 4096 and drafter steps B{1,8,32,64}
#           x W{1,4,10} (each with and without its collectives), then the planned policy, the
#           SGLang default and the vLLM chain at B 1/8/32/64
#                                                    -> tp/verify-tp4.json, tp/execute-tp4.json
#   tp2     the same for Llama-3.1-8B on 2 GPUs      -> tp/verify-tp2.json, tp/execute-tp2.json
#   offset  `spectune calibrate --from-run verify-tpN.json --base` per split grid: the law at N
#           moved by what an all-reduce costs inside the split forward, per message size, then
#           the target's weight GEMMs at N scaled by row count to what the grid's forwards
#           measured, as `calibrate --tp N` does (the one-GPU fit is kept as
#           calibration-1gpu-<gpu>.json beside tp/)
#                                                                  -> tp/calibration-<gpu>.json
#   check   `spectune check $OUT/tp`, then the summary table (printed last, also summary.txt):
#           TP verify MAPE, speedup errors, all-reduce cost per layer measured vs the model's.
# Knobs (environment): TP_PARTS (default "sweep one fit plan tp4 tp2 offset check", without tp4 on a
# host of fewer than 4 GPUs), TP_STEPS (15), TP_GRAPHS=0 (the TP runs without CUDA graphs,
# should capturing NCCL collectives fail), TP2_GPUS (default 0,1), TP2_TARGET (8b, default; or
# 70b: Llama-3.1-70B at tp 2 needs ~71 GB of weights + ~43 GB of KV at B 64 per GPU, so H200
# only), TP_GPUS (GPUs of the host; default: nvidia-smi's count, 4 for --dry-run),
# TP_REPEAT=1 (each tp run's executions timed again in a new process, without the grid:
# execute-tpN-repeat.json, which the summary pairs with execute-tpN.json run by run; about +50 s
# at tp 2), TP_KERNEL_CLASSES=1 (the one-GPU verify grid also profiled by kernel class: calibrate-run.json's
# verify rows then carry linear_s / attention_s, as `spectune calibrate --kernel-classes` writes).
set -uo pipefail
OUT=${OUT:-out}
D="$OUT/tp"
mkdir -p "$D"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=$(command -v python3 || command -v python)
if [[ "${1:-}" == "--dry-run" ]]; then
    GPUS=${TP_GPUS:-4}
else
    GPUS=${TP_GPUS:-$(nvidia-smi --query-gpu=name --format=csv,noheader | wc -l)}
fi
if ((GPUS >= 4)); then
    PARTS=${TP_PARTS:-sweep one fit plan tp4 tp2 offset check}
elif ((GPUS >= 2)); then
    PARTS=${TP_PARTS:-sweep one fit plan tp2 offset check}
else
    echo "this script needs 2 or 4 GPUs of one host; found $GPUS" && exit 2
fi
STEPS=${TP_STEPS:-15}  # timed steps per TP run (the one-GPU runs take 20)
NOGRAPHS=()
[[ "${TP_GRAPHS:-1}" == 0 ]] && NOGRAPHS=(--no-graphs)
LOG="$OUT/run.log"
: >"$LOG"
rm -f "$OUT/.status"
status() { echo "$1" >>"$OUT/.status"; }
has() { [[ " $PARTS " == *" $1 "* ]]; }
# part NAME LIMIT_S CMD...: run with a time limit (its whole process group), log, record rc
part() {
    local name=$1 limit=$2
    shift 2
    echo "== $name ($(date -u +%T), limit ${limit}s): $*" | tee -a "$LOG"
    timeout -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
    status "$name rc=${PIPESTATUS[0]}"
}

if [[ "${1:-}" == "--dry-run" ]]; then
    # CPU: the ranks over gloo on tiny models; the one-GPU part replaced by the committed H200
    # run (its fit, with the dry sweep's rows, exercises the interconnect fit)
    DRY=(--dry-run)
    HW=h200
    export TRITON_INTERPRET=1
    "$PY" benchmarks/bench_tp.py tiny-models "$OUT/models" >/dev/null
    T70="$OUT/models/tiny-target.json" H70="$OUT/models/tiny-head.json"
    T8=$T70 H8=$H70
    CTX=16 BATCH=1,2 GRID=(--grid-batch 1,2 --grid-tokens 1,4 --draft-widths 1,2) STEPS=2
    FIT_LIMIT=180  # the committed H200 run's fit, on a shared CPU
else
    DRY=()
    case "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" in
    *H200*) HW=h200 ;;
    *H100*) HW=h100-sxm ;;
    *) echo "unknown GPU; this script prices H100 SXM or H200" && exit 2 ;;
    esac
    T70=llama-3.1-70b H70=eagle3-llama-3.1-70b T8=llama-3.1-8b H8=eagle3-llama-3.1-8b
    # tokens 4 and 8: the engines' default trees, and (B 32 x 8, B 64 x 4) the 2 MiB all-reduce
    # at hidden 4096, where NCCL's LL protocol costs most inside a forward
    CTX=4096 BATCH=1,8,32,64 GRID=(--grid-batch 1,8,32,64 --grid-tokens 1,4,8,16,64)
    # the fit takes 18-21 s of a 2x H200 host's CPU and over 50 s on a 2x H100 host's (the
    # same number of rows; 366-388 s on a 2-core CI machine: results/tp_h100x2_d)
    FIT_LIMIT=150
fi
TP4_LIMIT=240 TP2_LIMIT=140
case "${TP2_TARGET:-8b}" in
8b) ;;
70b)
    if [[ ${#DRY[@]} -eq 0 && "$HW" != h200 ]]; then
        echo "TP2_TARGET=70b needs H200s (~114 GB per GPU at B 64); this host has $HW" && exit 2
    fi
    T8=$T70 H8=$H70 TP2_LIMIT=270
    ;;
*) echo "TP2_TARGET must be 8b or 70b, got ${TP2_TARGET}" && exit 2 ;;
esac
# on CPU (gloo, the Triton interpreter, a shared machine) the same parts take minutes
SWEEP_LIMIT=75 PLAN_LIMIT=25  # the sweep times small all-reduces twice more (in place)
[[ ${#DRY[@]} -gt 0 ]] && TP4_LIMIT=900 TP2_LIMIT=900 SWEEP_LIMIT=300 PLAN_LIMIT=120

{
    echo "== $(date -u +%FT%TZ) rev $(git rev-parse --short HEAD 2>/dev/null || echo unknown) hw $HW"
    nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader 2>/dev/null
    "$PY" -c 'import torch; print("torch", torch.__version__, "nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else "-")'
    echo "GPUs $GPUS, parts: $PARTS; tp 2 target $T8"
} 2>&1 | tee -a "$LOG"

has sweep && part sweep "$SWEEP_LIMIT" "$PY" benchmarks/bench_tp.py sweep --out "$OUT/sweep.json" \
    --hardware "$HW" "${DRY[@]}"

if has one; then
    if [[ ${#DRY[@]} -eq 0 ]]; then
        echo "== one ($(date -u +%T), limit 220s)" | tee -a "$LOG"
        CUDA_VISIBLE_DEVICES=1 timeout -k 10 220 "$PY" -m spectune execute \
            --policy dynamic-topk:5,4,8 --also dynamic-topk:3,1,4 \
            --also dynamic-topk:7,10,60 --also static:3,1,4 --also static:5,4,8 --batch "$BATCH" \
            --context "$CTX" --steps 20 --warmup 3 --out "$D/measurement-tp1.json" \
            >"$OUT/one-execute.log" 2>&1 &
        # TP_KERNEL_CLASSES=1: the one-GPU verify grid also by kernel class (linear / attention /
        # the rest; about +4 s a point), what a class-by-class fit of the cost model needs
        MICRO_ARGS=() MICRO_LIMIT=170
        if [ "${TP_KERNEL_CLASSES:-0}" = 1 ]; then MICRO_ARGS=(--kernel-classes) MICRO_LIMIT=230; fi
        CUDA_VISIBLE_DEVICES=0 timeout -k 10 "$MICRO_LIMIT" "$PY" benchmarks/bench_tp.py micro \
            --out "$D/calibrate-run.json" --hardware "$HW" "${MICRO_ARGS[@]}" 2>&1 | tee -a "$LOG"
        status "one-micro rc=${PIPESTATUS[0]}"
        wait $!
        status "one-execute rc=$?"
        cat "$OUT/one-execute.log" >>"$LOG"
        tail -6 "$OUT/one-execute.log"
    else
        cp measurements/h200/calibrate-run.json "$OUT/calibrate-run.json"
    fi
fi

if has fit; then
    if [[ ${#DRY[@]} -eq 0 ]]; then
        RUN="$D/calibrate-run.json" MEAS=(--measurements "$D/measurement-tp1.json")
    else
        RUN="$OUT/calibrate-run.json" MEAS=()
    fi
    "$PY" benchmarks/bench_tp.py merge "$RUN" "$OUT/sweep.json"
    part fit "$FIT_LIMIT" "$PY" -m spectune calibrate --from-run "$RUN" "${MEAS[@]}" \
        --out "$D/calibration-$HW.json"
fi

plan_tp() { # plan_tp N TARGET DRAFTER: the planned table the tp-N run executes
    part "plan-tp$1" "$PLAN_LIMIT" "$PY" benchmarks/bench_tp.py plan --calibration "$D/calibration-$HW.json" \
        --gpu "$HW" --tp "$1" --target "$2" --drafter "$3" --batch "$BATCH" --context "$CTX" \
        --out "$D/policy-tp$1.json"
}
if has plan; then
    has tp4 && plan_tp 4 "$T70" "$H70"
    has tp2 && plan_tp 2 "$T8" "$H8"
fi

tp_run() { # tp_run N TARGET DRAFTER LIMIT [repeat]: the grid and the executions, or with
    # "repeat" the executions alone again (a new process, no grid) -> execute-tpN-repeat.json
    local n=$1 t=$2 h=$3 limit=$4 pol=() name="tp$1"
    local out=("${GRID[@]}" --out-grid "$D/verify-tp$1.json")
    [[ -f "$D/policy-tp$n.json" ]] && pol=(--policy "$D/policy-tp$n.json")
    [[ "${5:-}" == repeat ]] && name="tp$n-repeat" out=(--out-grid "")
    part "$name" "$limit" "$PY" benchmarks/bench_tp.py run --tp "$n" --target "$t" --drafter "$h" \
        "${pol[@]}" --engine sglang --engine vllm --hardware "$HW" --batch "$BATCH" \
        --context "$CTX" --steps "$STEPS" --warmup 3 "${out[@]}" \
        --out-measure "$D/execute-$name.json" "${DRY[@]}" "${NOGRAPHS[@]}"
}
has tp4 && tp_run 4 "$T70" "$H70" "$TP4_LIMIT"
has tp2 && CUDA_VISIBLE_DEVICES=${TP2_GPUS:-0,1} tp_run 2 "$T8" "$H8" "$TP2_LIMIT"
if [[ "${TP_REPEAT:-0}" == 1 ]]; then
    has tp4 && tp_run 4 "$T70" "$H70" "$TP4_LIMIT" repeat
    has tp2 && CUDA_VISIBLE_DEVICES=${TP2_GPUS:-0,1} tp_run 2 "$T8" "$H8" "$TP2_LIMIT" repeat
fi

# what `spectune calibrate --tp N` adds: each split grid's in-forward all-reduce offset on the
# law at its tp (validate.fit.fit_inforward_offset); the one-GPU fit stays beside the folder
if has offset && [[ -f "$D/calibration-$HW.json" ]]; then
    cp "$D/calibration-$HW.json" "$OUT/calibration-1gpu-$HW.json"
    for v in "$D"/verify-tp*.json; do
        [[ -f "$v" ]] || continue
        part "offset-$(basename "$v" .json)" 60 "$PY" -m spectune calibrate --from-run "$v" \
            --base "$D/calibration-$HW.json" --out "$D/calibration-$HW.json"
    done
fi

if has offset; then
    OFFSET_NOTE="then, per split grid, spectune calibrate --from-run verify-tpN.json --base: the law at N moved by the in-forward all-reduce offset per message size (either sign), then the target's weight GEMMs at N scaled by row count to what the grid measured (validate.fit.fit_inforward_offset, fit_tp_gemm_scale; the fit before it is calibration-1gpu-$HW.json in the archive)"
else
    OFFSET_NOTE="no in-forward offset (TP_PARTS without offset)"
fi
cat >"$D/README.md" <<EOF
# Tensor-parallel executor measurements on $HW ($(date -u +%F))

Made by \`OUT=... bash benchmarks/run_tp_gpu.sh\` (rev $(git rev-parse --short HEAD 2>/dev/null || echo unknown)),
one device call on $GPUS GPUs of one host, NCCL_NVLS_ENABLE=0; real-shape models with random bf16
weights, synthetic acceptance from the mt-bench workload, context $CTX. \`spectune check\` re-predicts
every document here at its own "tp" with the calibration beside it.

| file | what |
| --- | --- |
| calibrate-run.json | one-GPU micro-benchmarks (Llama-3.1-8B, GPU 0; verify grid B{$BATCH} x N{1,16,64}; the drafter's step at tp 1, rows "draft") + the collectives sweep on 2$( ((GPUS >= 4)) && echo " and 4") GPUs (rows "collectives") |
| measurement-tp1.json | one GPU (GPU 1, run beside the micro-benchmarks on GPU 0): SGLang 5/4/8, the chain 3/1/4 and 7/10/60, static 3/1/4 and 5/4/8 at B{$BATCH} |
| calibration-$HW.json | \`spectune calibrate --from-run calibrate-run.json --measurements measurement-tp1.json\`: efficiencies and fixed costs from one GPU, interconnect terms (validate.fit.fit_interconnect: per tp, the all-reduce and all-gather laws by message-size regime) from the sweep; $OFFSET_NOTE |
| policy-tp4.json, policy-tp2.json | planned tables (validate.planned.plan_table, calibrated, tp 4 / tp 2) |
| verify-tp4.json, verify-tp2.json | verify grid of the split target ($T70 at tp 4 where run, $T8 at tp 2); "seconds_nocomm": the same shard compute without its collectives |
| execute-tp4.json, execute-tp2.json | planned policy, SGLang default (engine_default), vLLM-style chain 3/1/4 (vLLM has no default) vs no speculation at B{$BATCH}; "ranks_agree": every rank accepted alike |
| execute-tpN-repeat.json (TP_REPEAT=1) | the same runs timed again in a new process, without the grid |

The TP runs (execute-tpN.json) are out of sample: nothing measured at tp > 1 enters the fit; the
split grids (verify-tpN.json) give only the in-forward all-reduce offset and the weight GEMMs'
scale by row count at that tp, where they ran.
EOF

if has check; then
    if [[ ! -f "$D/calibration-$HW.json" ]]; then
        # the tp runs do not read it, but the check prices every document with it
        echo "no $D/calibration-$HW.json (the fit did not run or failed): the check prices with the uncalibrated defaults" | tee -a "$LOG"
        status "no-calibration (check on defaults)"
    fi
    "$PY" -m spectune check "$D" --speedup-tol 0.03 --mape-tol 0.03 >"$OUT/check.txt" 2>&1
    status "check rc=$?"
    tail -40 "$OUT/check.txt" >>"$LOG"
    echo "exit codes: $(tr '\n' ' ' <"$OUT/.status") (124: the part hit its time limit)" | tee "$OUT/summary.txt"
    "$PY" benchmarks/bench_tp.py summary "$D" 2>&1 | tee -a "$OUT/summary.txt"
fi

# one archive of everything (the device returns only a few files); summary, check and log beside
tar -czf "$OUT/tp-results.tar.gz" -C "$OUT" --exclude tp-results.tar.gz .
find "$OUT" -mindepth 1 -maxdepth 1 ! -name tp-results.tar.gz ! -name summary.txt \
    ! -name check.txt ! -name run.log -exec rm -rf {} +
ls -l "$OUT"
