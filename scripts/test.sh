#!/usr/bin/env bash
# Install everything (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check services client tests benchmarks
mypy services client  # types: [tool.mypy] in pyproject.toml
python -m pytest -q -p no:cacheprovider "$@"
