#!/usr/bin/env bash
# Install everything (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check services client tests benchmarks
mypy services client  # types: [tool.mypy] in pyproject.toml
if [ $# -gt 0 ]; then  # what you asked for, as you asked
    exec python -m pytest -q -p no:cacheprovider "$@"
fi
# The tests that compute inside pytest run on every core (an xdist worker per core, one torch thread
# each); then the tests that start worker processes (marker `processes`) run one at a time, with the
# machine to themselves, as their heartbeat and recovery timings assume.
python -m pytest -q -p no:cacheprovider -n "${SPD_TEST_WORKERS:-auto}" -m "not processes"
python -m pytest -q -p no:cacheprovider -m processes
