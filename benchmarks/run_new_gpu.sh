#!/usr/bin/env bash
# What a new user does on a GPU no committed measurement has seen, in one device call:
#   1. spectune calibrate   (micro-benchmarks, verify grid, one short run per tree builder; the
#                            fit bounded by the measured read and copy bandwidths and matmul rate)
#   2. spectune plan        (with that calibration; batch buckets 1 / 2-8 / 9-32 / 33-64, context 4096)
#   3. spectune execute     the planned policy and both engine defaults at batch 1/8/32/64
#   4. spectune execute     ECHO vs its per-request twin, prune+graft (and prune alone) vs dense,
#                           batch 1/8/32/64, recorded-trace acceptance (HumanEval, then MT-Bench)
#   5. spectune check       re-predicts everything above with the calibration of step 1
# then prints a short table last: verify MAPE, speedup error per policy and batch.
#
#     OUT=$OUT bash benchmarks/run_new_gpu.sh          # on the device, from the repo root
#     NEW_GPU_DRY_RUN=1 OUT=/tmp/x bash benchmarks/run_new_gpu.sh   # CPU: the plumbing only
#
# Machine: nvidia-h100-x1 or nvidia-h200 (one GPU; Llama-3.1-8B + EAGLE-3 at real shape).
# Time: a budget of NEW_GPU_BUDGET_S (default 480 s) for the GPU parts; each part gets at most
# what is left (minus the check's reserve), the MT-Bench trace part is skipped when under 60 s
# remain, and the summary says which parts ran and which hit their limit.
# Writes $OUT/<hardware>/ in measurements/h200's layout: calibrate-run.json (the raw run,
# incl. spec_runs), calibration-<hardware>.json, calibration-report.json (bounds, determined
# parameters), policy-planned.json, execute-planned.json, execute-trace-humaneval.json,
# execute-trace-mtbench.json, *-log.txt, check.txt, summary.txt and README.md; `spectune check
# $OUT/<hardware>` gates it once committed (e.g. as measurements/h100/).
#
# On the device, whose calls return at most 8 files, keep OUT outside the returned folder and
# archive it there: NEW_GPU_ARCHIVE=$OUT/newuser.tgz OUT=/tmp/nu bash benchmarks/run_new_gpu.sh
#
# Parts: NEW_GPU_PARTS (default "calibrate execute humaneval mtbench"; plan and check always run)
# picks what runs, e.g. NEW_GPU_PARTS="humaneval mtbench" NEW_GPU_CALIBRATION=<file> in a
# second call when the first ran out of budget (the calibration is copied into the folder).
#
# Dry run (NEW_GPU_DRY_RUN=1, CPU): the GPU commands are run with their arguments until they
# stop at "no CUDA GPU" (so their arguments, policy files and traces are known good), and the
# calibration is fitted from measurements/h200/calibrate-run.json instead (CPU fit), so the
# plan, check and table steps run for real on stand-in measurements (measurements/h200's).
set -uo pipefail
OUT=${OUT:-out}
DRY=${NEW_GPU_DRY_RUN:-0}
BUDGET=${NEW_GPU_BUDGET_S:-480}
CONTEXT=4096
BATCHES=1,8,32,64
STEPS=${NEW_GPU_STEPS:-30}
REPEAT=${NEW_GPU_REPEAT:-2}
PARTS=" ${NEW_GPU_PARTS:-calibrate execute humaneval mtbench} "
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=$(command -v python3 || command -v python)
START=$(date +%s)
mkdir -p "$OUT"

if [ "$DRY" = 1 ]; then
    HW=h100-sxm
else
    HW=$($PY -c 'import torch; from spectune.validate.measure import gpu_hardware_name as g; print(g(torch.cuda.get_device_name(0)))') || {
        echo "no GPU with a hardware preset here (set NEW_GPU_DRY_RUN=1 for the CPU dry run)"
        exit 2
    }
fi
D="$OUT/$HW"
mkdir -p "$D"
: >"$D/.status"
status() { echo "$1" >>"$D/.status"; }
left() { echo $((BUDGET - ($(date +%s) - START))); }
# limit for a part: its own cap, at most what is left of the budget minus the check's reserve
limit() { local l; l=$(($(left) - 30)); [ "$l" -gt "$1" ] && l=$1; [ "$l" -lt 1 ] && l=1; echo "$l"; }

# a GPU command: run it (timed, logged); in the dry run, run it until it stops at the GPU check
gpu() {
    local name=$1 cap=$2 log=$3
    shift 3
    echo "== $name: $*" | tee -a "$log"
    if [ "$DRY" = 1 ]; then
        "$@" >"$log.dry" 2>&1
        local rc=$?
        cat "$log.dry" >>"$log"
        if [ $rc -eq 2 ] && grep -q "no CUDA GPU" "$log.dry"; then
            status "$name dry-run ok (arguments accepted; stopped at the GPU check)"
        else
            status "$name dry-run FAILED rc=$rc"
        fi
        rm -f "$log.dry"
        return 0
    fi
    local t0
    t0=$(date +%s)
    timeout "$(limit "$cap")" "$@" 2>&1 | tee -a "$log"
    status "$name rc=${PIPESTATUS[0]} ($(($(date +%s) - START)) s)"
    printf '%s\t%s\t%s\n' "$name" "$t0" "$(date +%s)" >>"$D/parts.tsv"
}

{
    echo "== $(date -u +%FT%TZ) rev $(git rev-parse --short HEAD 2>/dev/null || echo unknown) hardware $HW"
    nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' 2>/dev/null
} 2>&1 | tee "$D/run-log.txt"

# the GPU's SM clock, power and temperature every 500 ms while the parts run (gpu-clocks.csv;
# parts.tsv: each GPU part's start and end, epoch seconds): the summary gives each part's clock,
# so a part that ran throttled (sustained compute at the power limit) shows in its table
CLOCKS_PID=
if [ "$DRY" != 1 ] && command -v nvidia-smi >/dev/null; then
    Q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,power.limit
    nvidia-smi -i 0 --query-gpu=$Q --format=csv,noheader,nounits -lms 500 >"$D/gpu-clocks.csv" 2>/dev/null &
    CLOCKS_PID=$!
    trap '[ -n "$CLOCKS_PID" ] && kill "$CLOCKS_PID" 2>/dev/null' EXIT
fi

# ---- 1. calibrate ------------------------------------------------------------------------------
CAL="$D/calibration-$HW.json"
if [[ "$PARTS" == *" calibrate "* ]]; then
    # NEW_GPU_KERNEL_CLASSES=1: the verify grid also profiled by kernel class (about +60 s)
    CAL_ARGS=()
    # the speculative runs at calibrate's default batches (executor.calibrate.SPEC_BATCHES:
    # 1, 8, 32), as a new user runs it, unless NEW_GPU_SPEC_BATCHES says (1,32 saves ~45 s);
    # measurements/h200-newuser5 is the first run so made
    SPEC_BATCHES=${NEW_GPU_SPEC_BATCHES:-1,8,32}
    # an H100 needs ~360 s for calibrate's default runs and fit (h100-newuser13's first call
    # was stopped at 340 s after its speculative runs, during the fit); an H200 ~300 s
    CAL_CAP=420
    if [ "${NEW_GPU_KERNEL_CLASSES:-0}" = 1 ]; then CAL_ARGS=(--kernel-classes); CAL_CAP=500; fi
    # NEW_GPU_TOKENS: the verify grid's tree tokens (default calibrate's 1,16,64,128); e.g.
    # 1,8,16,32,64,128 adds the tree sizes engines default to (8, 32) between the powers of 4
    # (about +2 s a point, +4 s with kernel classes)
    if [ -n "${NEW_GPU_TOKENS:-}" ]; then CAL_ARGS+=(--tokens "$NEW_GPU_TOKENS"); CAL_CAP=$((CAL_CAP + 60)); fi
    gpu calibrate $CAL_CAP "$D/calibrate-log.txt" $PY -m spectune calibrate --gpu "$HW" --out "$CAL" \
        --raw-out "$D/calibrate-run.json" --report "$D/calibration-report.json" \
        --spec-batches "$SPEC_BATCHES" --spec-steps 15 "${CAL_ARGS[@]}"
elif [ -n "${NEW_GPU_CALIBRATION:-}" ]; then
    cp "$NEW_GPU_CALIBRATION" "$CAL"
    status "calibrate skipped: $NEW_GPU_CALIBRATION"
fi
if [ "$DRY" = 1 ]; then  # stand-in: the committed H200 run, fitted on this CPU
    M=measurements/h200
    HW=h200
    D2="$OUT/$HW"
    mkdir -p "$D2"
    mv "$D"/* "$D"/.status "$D2"/ 2>/dev/null
    rmdir "$D" 2>/dev/null
    D=$D2
    CAL="$D/calibration-$HW.json"
    cp $M/calibrate-run.json $M/measurement-trees.json $M/execute-static.json "$D/"
    $PY -m spectune calibrate --from-run "$D/calibrate-run.json" --measurements \
        "$D/measurement-trees.json" --measurements "$D/execute-static.json" --out "$CAL" \
        --report "$D/calibration-report.json" 2>&1 | tee -a "$D/calibrate-log.txt"
    status "calibrate (CPU fit of $M) rc=${PIPESTATUS[0]}"
fi

# ---- 2. plan -----------------------------------------------------------------------------------
POLICY="$D/policy-planned.json"
echo "== plan" | tee -a "$D/plan-log.txt"
timeout "$(limit 60)" $PY -m spectune plan --calibration "$CAL" --workload mt-bench \
    --batch-edges "$BATCHES" --context-edges "$CONTEXT" --out "$POLICY" --quiet 2>&1 \
    | tee -a "$D/plan-log.txt"
status "plan rc=${PIPESTATUS[0]}"

# the engine defaults (planner.space.engine_default); vLLM has none (num_speculative_tokens is
# required), so its place is taken by the EAGLE default the executor's plans are compared with
read -r SGL VLLM <<<"$($PY - <<'EOF'
from spectune.planner.space import EAGLE_DEFAULT, engine_default
from spectune.specs.engine import load_engine
print(*((engine_default(load_engine(e)) or EAGLE_DEFAULT).label for e in ("sglang", "vllm")))
EOF
)"
echo "engine defaults: sglang $SGL, vllm $VLLM" | tee -a "$D/run-log.txt"

# the executions run the GEMM variants calibrate ran (and the fit saw): a process that timed its
# own could pick another of variants tied within a few percent (measurements/h200-newuser9:
# the gate|up GEMM at one token ran cuBLAS in calibrate and split-K in execute, and execute's
# batch-1 step without speculation ran 3.2% faster than calibrate's). NEW_GPU_GEMM_PLAN names
# another document to take the plan from (e.g. with NEW_GPU_CALIBRATION); "none": autotune
PLAN_DOC=${NEW_GPU_GEMM_PLAN:-$D/calibrate-run.json}
PIN=()
if [ "$PLAN_DOC" != none ] && grep -qs '"gemm_plan"' "$PLAN_DOC"; then PIN=(--gemm-plan "$PLAN_DOC"); fi
echo "execute GEMM plan: ${PIN[*]:-autotuned}" | tee -a "$D/run-log.txt"

# ---- 3. the planned policy and the engine defaults ---------------------------------------------
[[ "$PARTS" == *" execute "* ]] && gpu execute-planned 110 "$D/execute-log.txt" $PY -m spectune execute --policy "$POLICY" \
    --batch "$BATCHES" --context "$CONTEXT" --also "$SGL" --also "$VLLM" --steps "$STEPS" \
    --repeat "$REPEAT" --out "$D/execute-planned.json" "${PIN[@]}"

# ---- 4. ECHO vs its twin, prune+graft vs dense, recorded-trace acceptance ----------------------
for trace in humaneval mtbench; do
    [[ "$PARTS" == *" $trace "* ]] || continue
    if [ "$DRY" != 1 ] && [ "$(left)" -lt 90 ]; then
        status "trace-$trace skipped: $(left) s of the budget left"
        continue
    fi
    gpu "trace-$trace" 90 "$D/execute-trace-log.txt" $PY -m spectune execute \
        --policy dynamic-topk:6,8,32 --also dynamic-topk:6,8,32,echo \
        --also dynamic-topk:6,8,32,0.05,0 --also dynamic-topk:6,8,32,0.05,8 \
        --batch "$BATCHES" --context "$CONTEXT" \
        --steps "$STEPS" --repeat "$REPEAT" \
        --acceptance-trace "data/traces/smollm2-$trace.jsonl.gz" \
        --out "$D/execute-trace-$trace.json" "${PIN[@]}"
done
if [ "$DRY" = 1 ]; then  # stand-ins for the execute documents: measurements/h200's
    cp measurements/h200/execute-planned.json "$D/execute-planned.json"
fi

# ---- 5. check and the table --------------------------------------------------------------------
[ -n "$CLOCKS_PID" ] && kill "$CLOCKS_PID" 2>/dev/null
CLOCKS_PID=
$PY -m spectune check "$D" >"$D/check.txt" 2>&1
status "check rc=$?"
cat >"$D/README.md" <<EOF
# spectune on a never-calibrated $HW: calibrate, plan, execute, check

Made by \`OUT=... bash benchmarks/run_new_gpu.sh\` (rev $(git rev-parse --short HEAD 2>/dev/null || echo unknown), $(date -u +%F)).
Llama-3.1-8B + its EAGLE-3 head at real shape (random bf16 weights), context $CONTEXT.

| file | what |
| --- | --- |
| calibrate-run.json | spectune calibrate's raw run: copy bandwidth, matmul rate, GEMMs, attention, verify grid, spec_runs (one short run per tree builder) |
| calibration-$HW.json | the fitted Calibration (efficiencies bounded by the measured copy bandwidth and matmul rate) |
| calibration-report.json | the fit's report: each efficiency beside its ceiling, which parameters the data determined |
| policy-planned.json | spectune plan --calibration (mt-bench, batch buckets $BATCHES, context $CONTEXT) |
| execute-planned.json | the planned policy, SGLang's default ($SGL) and the second reference ($VLLM; vLLM has no default) at batch $BATCHES, $REPEAT repeats |
| execute-trace-humaneval.json, execute-trace-mtbench.json | dense 6/8/32, its ECHO twin, pruned (0.05) and prune+graft (0.05, 8), recorded-trace acceptance (data/traces), $REPEAT repeats |
| check.txt | spectune check of this folder |
| summary.txt | the table below |
| gpu-clocks.csv, parts.tsv | the GPU's SM / memory clock (MHz), power (W) and temperature (C) every 500 ms; each GPU part's start and end (epoch s) |
EOF
$PY - "$D" <<'EOF' 2>&1 | tee "$D/summary.txt"
"""The short table: parts and exit codes, the fit's bounds, verify MAPE, speedup error per
policy and batch (spectune.validate.check on this folder), the ECHO / graft comparisons."""
import json
import re
import sys
from pathlib import Path

from spectune.validate.check import check_folder

d = Path(sys.argv[1])
status = (d / ".status").read_text().split("\n") if (d / ".status").exists() else []
status = [s for s in status if s]
legend = " (rc 124: the part hit its time limit)" if any("rc=124" in s for s in status) else ""
print("parts:", (" | ".join(status) or "-") + legend)
rep = d / "calibration-report.json"
if rep.exists():
    r = json.loads(rep.read_text())
    b = r.get("bounds", {})
    eff = {k: v for k, v in b.items() if isinstance(v, dict)}
    print(
        "fit: copy %.2f TB/s, read %.2f TB/s, matmul %.0f TFLOP/s; "
        % ((b.get("copy_bytes_per_s") or 0) / 1e12, (b.get("read_bytes_per_s") or 0) / 1e12,
           (b.get("matmul_flops") or 0) / 1e12)
        + ", ".join(f"{k.replace('_efficiency', '')} {v['of_ceiling']:.0%}" for k, v in eff.items())
        + " of ceiling; determined: " + ", ".join(r.get("identified", {}).get("determined", []))
    )
def part_clocks(d: Path) -> None:
    """Per GPU part, over gpu-clocks.csv's samples inside its parts.tsv span: the median SM
    clock while busy (power >= 40% of the limit; idle gaps drop the clock to its floor), the
    lowest, and the share of the part's samples at the power limit (>= 97%), where the GPU
    lowers its clock: sustained runs reach it, calibrate's short timings mostly do not."""
    from datetime import datetime
    from statistics import median

    samples = []
    for line in (d / "gpu-clocks.csv").read_text().splitlines()[:100_000]:
        f = [x.strip() for x in line.split(",")]
        try:
            t = datetime.strptime(f[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((t, float(f[1]), float(f[3]), float(f[5])))
        except (ValueError, IndexError):
            continue  # a header, a cut last line or [N/A]
    for line in (d / "parts.tsv").read_text().splitlines():
        name, t0, t1 = line.split("\t")
        sel = [(c, w, lim) for t, c, w, lim in samples if float(t0) <= t <= float(t1)]
        busy = [c for c, w, lim in sel if w >= 0.4 * lim]
        if busy:
            capped = sum(w >= 0.97 * lim for _, w, lim in sel) / len(sel)
            print(f"clock {name}: SM {median(busy):.0f} MHz median while busy, {min(busy):.0f} "
                  f"lowest; {capped:.0%} of the time at the power limit ({sel[0][2]:.0f} W)")


if (d / "gpu-clocks.csv").exists() and (d / "parts.tsv").exists():
    part_clocks(d)
try:
    res = check_folder(d)
except Exception as e:  # noqa: BLE001 (the table says what failed)
    print(f"check failed: {e}")
    sys.exit(0)
print(f"verify MAPE {res.verify_mape:.2%} over {len(res.verify)} rows (goal <= 2%)")
print(f"{'file':<32} {'policy':<36} {'batch':>5} {'pred':>7} {'meas':>7} {'error':>7}")
for row in res.speedup:
    m = re.match(r"speedup B=(\d+) (.*)", row.what)
    batch, label = (m.group(1), m.group(2)) if m else ("", row.what)
    print(f"{row.file:<32.32} {label:<36.36} {batch:>5} {row.predicted:>6.3f}x {row.measured:>6.3f}x "
          f"{row.error:>+7.1%}")
worst = res.worst_speedup_error
print(f"worst speedup error {worst:.1%} over {len(res.speedup)} runs (goal <= 3%)")
for kind, name, run_name, diff in res.plan_notes:  # kernels other than calibrate's
    print(f"{name}: {len(diff)} {kind} entries differ from {run_name}'s: "
          + ", ".join(f"{k} {a} -> {b}" for k, (a, b) in list(diff.items())[:3]))
for f in sorted(d.glob("execute-trace-*.json")):
    doc = json.loads(f.read_text())
    for c in doc.get("comparisons", []):
        print(f"{f.stem:<24} B={c['batch']:<3} {c['label']:<28} vs {c['versus']:<20} "
              f"x{c['tokens_per_s_ratio']:.3f} (spread {c['spread_rel']:.1%} / "
              f"{c['versus_spread_rel']:.1%})")
EOF
rm -f "$D/.status"
if [ -n "${NEW_GPU_ARCHIVE:-}" ]; then  # one file for the device to bring back (it returns <= 8)
    tar czf "$NEW_GPU_ARCHIVE" -C "$(dirname "$D")" "$(basename "$D")" && echo "archived $D -> $NEW_GPU_ARCHIVE"
fi
