#!/usr/bin/env bash
# Install everything (idempotent) and run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
ruff check services client tests benchmarks
# Types ([tool.mypy] in pyproject.toml): the SDK, the algorithm (core), the runtime, the HTTP gateway,
# validation, model loading, the wire format, text and the local builder are checked; train, eval, eagle,
# k8s and commands are not clean yet.
mypy -p spd_client -p spd.core -p spd.runtime -p spd.http_api -p spd.api -p spd.models -m spd.wire -m spd.text -m spd.local -m spd.settings
python -m pytest -q -p no:cacheprovider "$@"
