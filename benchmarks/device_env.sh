# Sourced by the one-GPU device scripts (run_forward_curve.sh, run_batch1_verify.sh), from the
# repo root: OUT (default ./out, created), PY (the Python), LOG ($OUT/run.log), PYTHONPATH with
# the repo; installs the wheels under .whl/ when the call carried them (optuna, simpy, hypothesis
# and their dependencies); defines device_header, which prints the date, the GPU and the torch /
# Triton versions.
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=$(command -v python3 || command -v python)
LOG="$OUT/run.log"
if compgen -G ".whl/*.whl" >/dev/null; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=$PYTHONPATH:/tmp/site
fi

device_header() {
    echo "== $(date -u +%FT%TZ)"
    nvidia-smi --query-gpu=name,uuid,memory.total,driver_version --format=csv,noheader 2>/dev/null
    $PY -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
}
