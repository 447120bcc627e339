#!/usr/bin/env bash
# The serving engines' own configuration code, which judges spectune's exports in
# tests/test_engines_judge.py: SGLang 0.5.23 (ServerArgs resolution, the adaptive-config loader)
# and vLLM 0.33.0 (EngineArgs.create_engine_config, the dynamic schedule lookup).
# Everything goes in with --no-deps, pinned: the engines' own requirements pull CUDA torch
# builds (sglang pins torch 2.14.1, vllm torch 2.14.0); torch stays the CPU build on disk.
# The list below is what their config modules import, found by importing them on CPU.
# Idempotent: does nothing once every pinned version is installed.
set -euo pipefail
export PIP_DISABLE_PIP_VERSION_CHECK=1
PY=${PYTHON:-python3}
PINS=(
  sglang==0.5.23 vllm==0.33.0
  transformers==5.19.0 huggingface-hub==2.4.0 tokenizers==0.23.2 safetensors==0.8.0
  httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5
  psutil==7.2.2 pybase64==1.5.1 msgspec==0.22.0 pyzmq==27.3.0 dill==0.4.1 loguru==0.7.3
  aiohttp==3.14.5 multidict==7.2.1 yarl==1.25.1 propcache==0.5.4 aiohappyeyeballs==2.7.1
  aiosignal==1.4.0 frozenlist==1.8.0
  apache-tvm-ffi==0.1.11 sentencepiece==0.2.3 compressed-tensors==0.20.0 einops==0.8.2
  cbor2==6.3.0 openai-harmony==0.0.8 openai==3.57.0 cachetools==8.0.2 uvloop==0.23.0
  prometheus-client==0.26.0 xgrammar==0.2.8 fastapi==0.136.3 annotated-doc==0.0.7
  partial-json-parser==0.2.1.1.post7 llguidance==1.9.1
  regex==2026.11.19 pydantic==2.14.4 pydantic-core==2.50.5 typing-inspection==0.4.5
  annotated-types==0.8.0 sniffio==1.3.1 cloudpickle==3.1.3 py-cpuinfo==9.0.0 orjson==3.13.0
  ipython==9.18.1 traitlets==5.16.1
)
missing=$("$PY" - "${PINS[@]}" <<'PYEOF'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for pin in sys.argv[1:]:
    name, want = pin.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    if have != want:
        out.append(pin)
print(" ".join(out))
PYEOF
)
if [ -n "$missing" ]; then
  # shellcheck disable=SC2086
  "$PY" -m pip install -q --no-deps $missing
fi
