#!/bin/bash
# The shipped PDM's learning curve over its whole lineage (benchmarks/results/learning_curve.json
# and .png, which its model card quotes): the 2M base run, then each warm start shipped after it,
# offset by the tokens its base had seen in all (for averaged exports, the average's history from
# train_warm.sh). A newly shipped warm start adds its line here:  bash benchmarks/lineage_curve.sh
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
R=benchmarks/results
SEGMENTS=(  # history.jsonl under $R @ tokens in all before it
  long_run_spd-n5-ls1_history.jsonl@0
  warm-prevj30-300k/history.jsonl@2000827
  warm-prevj30-p14/history.jsonl@2301020
  warm-prevj30-p16/history.jsonl@2634544
  warm-p21to29full/history.jsonl@3335076
  warm-p30/history.jsonl@4213993
  warm-p33/history.jsonl@4475901
  warm-p38/history.jsonl@4926604
  warm-p46/history.jsonl@5551072
  warm-p52/history.jsonl@6053961
  warm-p60/history.jsonl@6708117
  warm-p68all/history.jsonl@7378479
  warm-p76/history.jsonl@8046291
  warm-p85all/history.jsonl@8779451
  warm-p100/history_avg-p100lr1.jsonl@9993161
  warm-p103/history_avg-p103.jsonl@10286350
  warm-p112/history_avg-p112.jsonl@11072410
)
N="shipped PDM (2M base run, then $((${#SEGMENTS[@]} - 1)) warm starts)"
ARGS=()
for S in "${SEGMENTS[@]}"; do
  ARGS+=(--run "$N=$R/${S%@0}")
done
python benchmarks/learning_curve.py "${ARGS[@]}" \
  --run "former PDM (600k tokens, 24 seqs of its own held-out cache)=$R/pdm_600k_curve.jsonl" --out $R/learning_curve.json
