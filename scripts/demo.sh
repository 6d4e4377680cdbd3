#!/usr/bin/env bash
# The main job on a fresh machine: install, start a local SPD pipeline (n = 5 stages + drafter +
# orchestrator, each its own process, CPU), stream one generation through it, stop the cluster.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
. .venv/bin/activate
PROMPT=${1:-"Explain in three sentences why the sky is blue."}
PORT=${SPD_PORT:-50051}
LOGS=$(mktemp -d)
spd up --n 5 --port "$PORT" --state-file "$LOGS/state.json" --log-dir "$LOGS" > "$LOGS/up.out" 2>&1 &
UP=$!
trap 'kill -TERM $UP 2>/dev/null; wait $UP 2>/dev/null || true' EXIT
for _ in $(seq 600); do
    grep -q '^ready' "$LOGS/up.out" && break
    kill -0 $UP 2>/dev/null || { cat "$LOGS/up.out"; exit 1; }
    sleep 0.5
done
grep '^ready' "$LOGS/up.out" || { echo "cluster did not become ready; logs in $LOGS"; exit 1; }
spd generate --address "127.0.0.1:$PORT" --prompt "$PROMPT" --max-tokens 128
echo "[demo] per-process logs and the state file are in $LOGS"
