#!/bin/bash
# The shipped PDM lineage's draft at one of its budgets, taken from the commit that shipped it (e.g.
# 73b70a2 for 2M, the lineage's base run), into runs/spd-TOKENS/pdm: where its twins' replays
# (benchmarks/acceptance_eagle3_budget.sh) and `spd eval` (spd.eval.methods.twin_methods) find it.
#   bash benchmarks/lineage_draft.sh TOKENS COMMIT
set -eu
cd "$(dirname "$0")/.."
TOKENS=${1:?usage: lineage_draft.sh TOKENS COMMIT} COMMIT=${2:?usage: lineage_draft.sh TOKENS COMMIT}
SRC=services/spd/assets/drafts/SmolLM2-135M-Instruct PDM=runs/spd-$TOKENS/pdm
mkdir -p $PDM
for f in config.json pdm.safetensors; do git show "$COMMIT:$SRC/$f" > "$PDM/$f"; done
