#!/usr/bin/env bash
# Which GEMM variants a tp 2 forward should run at the 32-row bucket, timed inside the forward
# (issue 22: on every 2x H200 pair the step without speculation at batch 32 is priced 2.5-3.4%
# low at tp 2 and 1.3% low at tp 1; host_b's profile (results/tp_classes_h200) shows the shard's
# GEMMs at 32 rows, cuBLAS split-K with a reduce kernel after each, costing what 64 rows cost).
#
#     OUT=$OUT bash benchmarks/run_gemm_bucket_probe.sh    # from the repo root, on 2 GPUs of one host
#
# benchmarks/probe_tp_forward.py at tp 2 over GBP_SHAPES (default B 1 / 16 / 32 / 64 x 1 token
# and B 8 x 4 tokens, context 4096), three times:
#   tuned   the autotuned plan                              -> $OUT/tuned_forward.json
#   as16    every shape's 32-row bucket running its 16-row bucket's variant -> $OUT/as16_forward.json
#   as64    every shape's 32-row bucket running its 64-row bucket's variant -> $OUT/as64_forward.json
#   nolt    every bucket that runs cuBLASLt ("cublaslt") running the default cuBLAS instead
#                                                           -> $OUT/nolt_forward.json
# (GBP_PLANS: the plans after "tuned", default "as16 as64"), then a table of wall and
# linear-class time per shape and plan (printed last, also table.txt). About 1 minute a plan.
set -uo pipefail
# shellcheck source=benchmarks/device_env.sh
source benchmarks/device_env.sh
export NCCL_NVLS_ENABLE=0
: >"$LOG"
SHAPES=${GBP_SHAPES:-1x1,16x1,32x1,64x1,8x4}
LIMIT=${GBP_PROBE_S:-200}
PLANS=${GBP_PLANS:-as16 as64}
probe() {  # probe NAME [PLANFILE]
    timeout "$LIMIT" $PY benchmarks/probe_tp_forward.py --tp 2 --shapes "$SHAPES" \
        --draft-shapes '' --out "$OUT/$1_forward.json" ${2:+--gemm-plan "$2"} 2>&1 | grep -v -i warn
}
{
    device_header
    echo "== tuned"; probe tuned
    $PY - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
plan = json.load(open(f"{out}/tuned_forward.json"))["gemm_plan"]
plans = {
    name: {k: plan[k.replace("@32", src)] if "@32" in k else v for k, v in plan.items()}
    for name, src in (("as16", "@16"), ("as64", "@64"))
}
plans["nolt"] = {k: "cublas" if v == "cublaslt" else v for k, v in plan.items()}
for name, new in plans.items():
    json.dump({"gemm_plan": new}, open(f"{out}/plan_{name}.json", "w"), indent=1)
    print(name, {k: new[k] for k in new if new[k] != plan[k]})
PY
    for name in $PLANS; do echo "== $name"; probe "$name" "$OUT/plan_$name.json"; done
    $PY - "$OUT" $PLANS <<'PY' | tee "$OUT/table.txt"
import json, sys
out = sys.argv[1]
docs = {n: json.load(open(f"{out}/{n}_forward.json")) for n in ("tuned", *sys.argv[2:])}
print("tp 2 forward, us: wall with collectives / linear class, per GEMM plan")
print(f"{'B':>3} {'N':>3} " + " ".join(f"{n:>17}" for n in docs))
for i, row in enumerate(docs["tuned"]["shapes"]):
    cells = []
    for d in docs.values():
        c = d["shapes"][i]["comm"]
        cells.append(f"{c['wall_us']:8.1f}/{c['by_class_us'].get('linear', 0):8.1f}")
    print(f"{row['batch']:>3} {row['tokens']:>3} " + " ".join(cells))
PY
} 2>&1 | tee -a "$LOG" | tail -40
