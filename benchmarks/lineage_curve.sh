#!/bin/bash
# The shipped PDM's learning curve over its whole lineage (benchmarks/results/learning_curve.json
# and .png, which its model card quotes): the 2M base run, then each warm start shipped after it
# (for averaged exports, the average's history from train_warm.sh), each offset by the tokens seen
# before it (the sum of the earlier segments' last "seen"), which must end at the shipped PDM's
# tokens in all. A newly shipped warm start adds its line here:  bash benchmarks/lineage_curve.sh
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
R=benchmarks/results
SEGMENTS=(  # run histories under $R, in training order
  long_run_spd-n5-ls1_history.jsonl
  warm-prevj30-300k/history.jsonl
  warm-prevj30-p14/history.jsonl
  warm-prevj30-p16/history.jsonl
  warm-p21to29full/history.jsonl
  warm-p30/history.jsonl
  warm-p33/history.jsonl
  warm-p38/history.jsonl
  warm-p46/history.jsonl
  warm-p52/history.jsonl
  warm-p60/history.jsonl
  warm-p68all/history.jsonl
  warm-p76/history.jsonl
  warm-p85all/history.jsonl
  warm-p100/history_avg-p100lr1.jsonl
  warm-p103/history_avg-p103.jsonl
  warm-p112/history_avg-p112.jsonl
  warm-p118/history_avg-p118.jsonl
  warm-p125/history_avg-p125.jsonl
)
N="shipped PDM (2M base run, then $((${#SEGMENTS[@]} - 1)) warm starts)"
last_seen() { tail -1 "$1" | python -c 'import json, sys; print(json.load(sys.stdin)["seen"])'; }
ARGS=() SEEN=0
for H in "${SEGMENTS[@]}"; do
  ARGS+=(--run "$N=$R/$H@$SEEN")
  SEEN=$((SEEN + $(last_seen "$R/$H")))
done
SHIPPED=$(python -c 'import json; from spd.train.trainer import tokens_in_all
print(tokens_in_all(json.load(open("services/spd/assets/drafts/SmolLM2-135M-Instruct/config.json"))["notes"]))')
[ "$SEEN" = "$SHIPPED" ] || { echo "segments sum to $SEEN tokens, the shipped PDM saw $SHIPPED: a segment is missing" >&2; exit 1; }
python benchmarks/learning_curve.py "${ARGS[@]}" \
  --run "former PDM (600k tokens, 24 seqs of its own held-out cache)=$R/pdm_600k_curve.jsonl" --out $R/learning_curve.json
