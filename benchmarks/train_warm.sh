#!/bin/bash
# A warm start of the shipped PDM on the self-generated parts it has not seen (--skip-shards), with
# overrides (e.g. --prev, which grows the predecessor input from zero projections, and a fill mix);
# the equal-weight average of the shipped PDM and the run's export (spd.train.average, which undoes
# the re-warm-up's knock); the held-out agreement of the three at every fill level (the first 48
# held-out sequences, and all 139) and their exact greedy acceptance on the evaluation sets side by
# side (40 prompts x <= 256 tokens, the shipped PDM's card's setting):
#   bash benchmarks/train_warm.sh NAME SKIP TOKENS LR THREADS [FLAG ...]
# -> runs/warm-NAME/, runs/avg-NAME/ (export + history.jsonl), benchmarks/results/warm-NAME/.
# Resumable: rerun the same command.
#   e.g. bash benchmarks/train_warm.sh prevj30 11 729000 6e-4 2 --prev --fill judged:0.3
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
NAME=${1:?usage: train_warm.sh NAME SKIP TOKENS LR THREADS [FLAG ...]}
SKIP=$2 TOKENS=$3 LR=$4 THREADS=$5
shift 5
IDS=data/selfgen/SmolLM2-135M-Instruct SHIPPED=services/spd/assets/drafts/SmolLM2-135M-Instruct
OUT=runs/warm-$NAME RES=benchmarks/results/warm-$NAME
mkdir -p $OUT $RES
spd --log-level INFO train --method pdm --n 5 --ls 1 --init-from $SHIPPED --skip-shards "$SKIP" "$@" \
  --lr "$LR" --vocab 16384 --batch-tokens 1024 --tokens "$TOKENS" --data $IDS/train --heldout $IDS/heldout \
  --eval-seqs 48 --eval-every 900 --ckpt-every 300 --threads "$THREADS" --resume --no-progress \
  --out $OUT/pdm-run >> $OUT/train.log 2>&1
cp $OUT/pdm-run/history.jsonl $RES/history.jsonl
AVG=runs/avg-$NAME
python -m spd.train.average --out $AVG/pdm $SHIPPED $OUT/pdm-run/pdm
fills() {  # LABEL DRAFT [FLAG ...]: the first 48 held-out sequences, then all 139
  python benchmarks/train_eval.py --draft "$2" --threads "$THREADS" "${@:3}" | tail -1 > "$RES/fills_$1.json"
  python benchmarks/train_eval.py --draft "$2" --threads "$THREADS" --seqs 139 | tail -1 > "$RES/fills_$1_allheldout.json"
}
fills "$NAME" $OUT/pdm-run/pdm
fills "avg-$NAME" $AVG/pdm --extend-history $OUT/pdm-run/history.jsonl $AVG/history.jsonl
fills shipped $SHIPPED
cp $AVG/history.jsonl $RES/history_avg-$NAME.jsonl
bash benchmarks/acceptance_sets.sh $RES 40 256 --draft "shipped=shipped" --draft "$NAME=$OUT/pdm-run/pdm" --draft "avg-$NAME=$AVG/pdm"
