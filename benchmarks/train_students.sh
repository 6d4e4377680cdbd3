#!/bin/bash
# Several PDM students at one budget from ONE teacher pass (spd train --with), on the committed
# self-generated ids with the data, order, lr schedule and V_s of benchmarks/train_equal_budget.sh (so
# its EAGLE-3 row at the same TOKENS is the comparison); then each one's held-out agreement at every
# fill level (train_eval.py, with the judged α it implies) and its exact greedy acceptance on the
# evaluation sets (acceptance.py, 40 prompts x <= 128 tokens, as benchmarks/acceptance_equal.sh).
#   bash benchmarks/train_students.sh NAME TOKENS THREADS 'LABEL=KEY=VALUE ...' ...
# -> runs/NAME-TOKENS/LABEL, benchmarks/results/NAME-TOKENS/. Resumable: rerun the same command.
#   e.g. bash benchmarks/train_students.sh fill 400000 2 'design=' 'judged30=fill=judged:0.3'
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
NAME=${1:?usage: train_students.sh NAME TOKENS THREADS LABEL=OVERRIDES ...}
TOKENS=$2 THREADS=$3
shift 3
IDS=data/selfgen/SmolLM2-135M-Instruct
OUT=runs/$NAME-$TOKENS RES=benchmarks/results/$NAME-$TOKENS
mkdir -p $OUT $RES
LABELS=() MAIN=() WITH=()
for SPEC in "$@"; do
  LABEL=${SPEC%%=*}
  if [ ${#LABELS[@]} -eq 0 ]; then  # the main student: its KEY=VALUE as flags (true: a switch)
    for KV in ${SPEC#*=}; do
      K=--${KV%%=*} V=${KV#*=}
      if [ "$V" = true ]; then MAIN+=("${K//_/-}"); else MAIN+=("${K//_/-}" "$V"); fi
    done
    MAIN+=(--out "$OUT/$LABEL")
  else
    WITH+=(--with "method=pdm n=5 ls=1 ${SPEC#*=} out=$OUT/$LABEL")
  fi
  LABELS+=("$LABEL")
done
spd --log-level INFO train --method pdm --n 5 --ls 1 "${MAIN[@]}" "${WITH[@]}" \
  --lr 1.5e-3 --vocab 16384 --batch-tokens 1024 --tokens "$TOKENS" --data $IDS/train --heldout $IDS/heldout \
  --eval-seqs 48 --eval-every 900 --ckpt-every 300 --threads "$THREADS" --resume --no-progress \
  >> $OUT/train.log 2>&1
DRAFTS=()
for L in "${LABELS[@]}"; do
  cp $OUT/$L/history.jsonl $RES/history_$L.jsonl
  python benchmarks/train_eval.py --draft $OUT/$L/pdm --threads "$THREADS" | tail -1 > $RES/fills_$L.json
  DRAFTS+=(--draft "$L=../$OUT/$L/pdm")
done
cd benchmarks
for SET in mtbench gsm8k humaneval; do
  OMP_NUM_THREADS=1 python acceptance.py --sets $SET --prompts 40 --max-tokens 128 "${DRAFTS[@]}" \
    --out ../$RES/acceptance_$SET.json > ../$RES/acceptance_$SET.log 2>&1 &
done
wait
cat ../$RES/acceptance_*.md
