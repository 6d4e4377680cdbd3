#!/usr/bin/env bash
# Install everything (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check services client tests benchmarks
# Types ([tool.mypy] in pyproject.toml): the SDK, the runtime, the HTTP gateway, validation and model
# loading are checked; spd.core, train, eval, eagle, k8s and commands are not clean yet.
mypy -p spd_client -p spd.runtime -p spd.http_api -p spd.api -p spd.models
python -m pytest -q -p no:cacheprovider "$@"
