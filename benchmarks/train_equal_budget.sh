#!/bin/bash
# SPD and the comparison drafts at one equal budget, all trained from ONE teacher pass (spd train
# --with) on the committed self-generated ids, features online, the same order, lr schedule and V_s:
#   runs/equal-TOKENS/spd-n5-ls1  SPD n = 5, L_s = 1 (the shipped PDM's recipe)
#   runs/equal-TOKENS/spd-n5-ls2  SPD n = 5, L_s = 2 (the L_s question)
#   runs/equal-TOKENS/eagle3      the EAGLE-3-style draft, TTT 4
#   runs/equal-TOKENS/ppsd-n5     PPSD n = 5 (anchors [0, e1], post-step, L_s = 1)
# Resumable on the same machine: rerun the same command. benchmarks/train_main.sh is the 240k-token
# version (the disk cache, three processes) behind the committed evaluation report.
#   bash benchmarks/train_equal_budget.sh TOKENS [THREADS]
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${1:?usage: train_equal_budget.sh TOKENS [THREADS]}
IDS=data/selfgen/SmolLM2-135M-Instruct
OUT=runs/equal-$TOKENS
mkdir -p $OUT
exec spd --log-level INFO train --method pdm --n 5 --ls 1 --out $OUT/spd-n5-ls1 \
  --with "method=pdm n=5 ls=2 schedule=pre out=$OUT/spd-n5-ls2" \
  --with "method=eagle3 ttt=4 out=$OUT/eagle3" \
  --with "method=pdm n=5 ls=1 schedule=post anchors=0,6 out=$OUT/ppsd-n5" \
  --lr 1.5e-3 --vocab 16384 --batch-tokens 1024 --tokens "$TOKENS" --data $IDS/train --heldout $IDS/heldout \
  --eval-seqs 48 --eval-every 900 --ckpt-every 300 --threads "${2:-1}" --resume --no-progress \
  >> $OUT/train.log 2>&1
