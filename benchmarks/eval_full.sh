#!/bin/bash
# The committed evaluation report (benchmarks/results/eval/report.md), end to end, on this CPU:
#   bash benchmarks/eval_full.sh
# Needs the checkpoints of benchmarks/train_main.sh, benchmarks/train_sweep.sh and the shipped
# lineage's twins, benchmarks/train_twin.sh (runs/; the 2M EAGLE-3 and PPSD twins are committed);
# missing ones are skipped and listed in the report. The lineage's own 2M draft comes from the
# commit that shipped it. Component costs are measured first, alone; then the
# per-set acceptance runs go two processes at a time (EAGLE-3 and AR wall-clock are measured
# inside those, so both see the same load).
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
OUT=benchmarks/results/eval
ARGS="--prompts 8 --max-tokens 128 --temperatures 0,1 --top-k 50 --top-p 1.0 --threads 1 --out $OUT --no-progress --overhead $OUT/runtime_overhead.json"
mkdir -p $OUT
bash benchmarks/lineage_draft.sh 2000000 73b70a2
python benchmarks/runtime_overhead.py --ns 2,3,5,6,10 --skip-profile --out $OUT/runtime_overhead.json
spd eval --phase costs $ARGS
spd eval --phase accept --sets mtbench,mtbench2 $ARGS &
spd eval --phase accept --sets gsm8k,humaneval $ARGS
wait
spd eval --phase check $ARGS
spd eval --phase report --sets mtbench,mtbench2,gsm8k,humaneval $ARGS --reproduce "bash benchmarks/eval_full.sh" \
  --notes benchmarks/results/eval_notes.md
