#!/bin/bash
# The fill-level mix question at one budget, all students from ONE teacher pass (spd train --with),
# the same data, order, lr schedule and V_s as benchmarks/train_equal_budget.sh (so its EAGLE-3 row
# at the same TOKENS is the comparison):
#   runs/fill-TOKENS/design       SPD n = 5, L_s = 1, design mix (a = n half the time, else uniform)
#   runs/fill-TOKENS/judged30     ... fill = judged:0.3 (the fills the engine judges at p = 0.3)
#   runs/fill-TOKENS/judged50     ... fill = judged:0.5
#   runs/fill-TOKENS/judged30-ls2 L_s = 2, fill = judged:0.3
# then each one's held-out agreement at every fill level (train_eval.py: the judged α it implies) and
# its exact greedy acceptance on the evaluation sets (acceptance.py, 40 prompts x <= 128 tokens, as
# benchmarks/acceptance_equal.sh) -> benchmarks/results/fill-TOKENS/.
# Resumable on the same machine: rerun the same command.
#   bash benchmarks/train_fill_mix.sh TOKENS [THREADS]
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${1:?usage: train_fill_mix.sh TOKENS [THREADS]}
IDS=data/selfgen/SmolLM2-135M-Instruct
OUT=runs/fill-$TOKENS
mkdir -p $OUT
spd --log-level INFO train --method pdm --n 5 --ls 1 --out $OUT/design \
  --with "method=pdm n=5 ls=1 fill=judged:0.3 out=$OUT/judged30" \
  --with "method=pdm n=5 ls=1 fill=judged:0.5 out=$OUT/judged50" \
  --with "method=pdm n=5 ls=2 fill=judged:0.3 out=$OUT/judged30-ls2" \
  --lr 1.5e-3 --vocab 16384 --batch-tokens 1024 --tokens "$TOKENS" --data $IDS/train --heldout $IDS/heldout \
  --eval-seqs 48 --eval-every 900 --ckpt-every 300 --threads "${2:-1}" --resume --no-progress \
  >> $OUT/train.log 2>&1
RES=benchmarks/results/fill-$TOKENS
mkdir -p $RES
STUDENTS="design judged30 judged50 judged30-ls2"
for S in $STUDENTS; do
  cp $OUT/$S/history.jsonl $RES/history_$S.jsonl
  python benchmarks/train_eval.py --draft $OUT/$S/pdm --threads "${2:-1}" | tail -1 > $RES/fills_$S.json
done
DRAFTS=()
for S in $STUDENTS; do DRAFTS+=(--draft "$S=../$OUT/$S/pdm"); done
cd benchmarks
for SET in mtbench gsm8k humaneval; do
  OMP_NUM_THREADS=1 python acceptance.py --sets $SET --prompts 40 --max-tokens 128 "${DRAFTS[@]}" \
    --out ../$RES/acceptance_$SET.json > ../$RES/acceptance_$SET.log 2>&1 &
done
wait
cat ../$RES/acceptance_*.md
