#!/usr/bin/env bash
# Does running the calibrate run's GEMM plan (spectune execute --gemm-plan) change what execute
# measures? One GPU, one process per document, alternating: pinned, autotuned, pinned; then per
# document its plan's differences from the calibrate run's, each batch's step without and with
# speculation, and `spectune check` of the three with the calibration beside the calibrate run.
#
#     OUT=$OUT bash benchmarks/probe_gemm_plan_pin.sh [FOLDER]   # default measurements/h200-newuser9
#
# FOLDER holds calibrate-run.json (with its "gemm_plan"), calibration-<hw>.json and
# policy-planned.json. Writes $OUT/pin-{1,2,3}.json (+ the calibration, so `spectune check $OUT`
# re-predicts them) and $OUT/summary.txt. About 40 s per document on an H200.
set -uo pipefail
F=${1:-measurements/h200-newuser9}
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
cp "$F"/calibration-*.json "$OUT/" && rm -f "$OUT"/calibration-report.json
ARGS=(--policy "$F/policy-planned.json" --also dynamic-topk:5,4,8 --batch 1,8 --context 4096
      --steps 30 --repeat 2)
i=0
for mode in pinned autotuned pinned; do
    i=$((i + 1))
    PIN=()
    [ "$mode" = pinned ] && PIN=(--gemm-plan "$F/calibrate-run.json")
    echo "== pin-$i: $mode"
    timeout 120 python3 -m spectune execute "${ARGS[@]}" "${PIN[@]}" --out "$OUT/pin-$i.json" \
        >"$OUT/pin-$i.log" 2>&1 || echo "pin-$i failed: $(tail -2 "$OUT/pin-$i.log")"
done
python3 -m spectune check "$OUT" >"$OUT/check.txt" 2>&1
python3 - "$F" "$OUT" <<'PY' 2>&1 | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path

f, out = Path(sys.argv[1]), Path(sys.argv[2])
cal = json.loads((f / "calibrate-run.json").read_text())
plan = cal.get("gemm_plan", {})
ref = {r["batch"]: r["ar_step_ms"] for r in cal["spec_runs"]["runs"] if "ar_step_ms" in r}
print(f"calibrate run {f}: {len(plan)} plan entries; its steps without speculation (ms): "
      + ", ".join(f"B{b} {v:.3f}" for b, v in sorted(ref.items())))
for p in sorted(out.glob("pin-*.json")):
    d = json.loads(p.read_text())
    diff = {k: v for k, v in d.get("gemm_plan", {}).items() if plan.get(k) != v}
    mode = "pinned" if "--gemm-plan" in d.get("command", "") else "autotuned"
    print(f"{p.stem} ({mode}): {len(diff)} entries differ from calibrate's: {diff}")
    for r in d["runs"]:
        print(f"  B{r['batch']:<2} {r['label']:<22} step {r['phases_ms']['step']:8.3f} ms  "
              f"no-spec {r['ar_step_ms']:7.3f} ms  speedup {r['speedup']:.3f}x")
for line in (out / "check.txt").read_text().splitlines():
    if " speedup " in line or line.startswith(("PASS", "FAIL")):
        print(line)
PY
