#!/bin/bash
# The EAGLE-3-style draft (TTT 4) at one of the shipped PDM lineage's budgets, on the same
# self-generated ids in the same order, features from the online teacher, with the lineage's lr,
# schedule, V_s and batch: SPD's S0 against EAGLE-3's tau at the same training budget. At 2000000
# tokens it is the twin of the lineage's base run (`runs/long/spd-n5-ls1`, the card's 2M PDM): same
# flags but the method. On a 2-core CPU that takes hours (2M: 8,186 s on a Zen 4 with bf16 units,
# ~244 tokens/s; ~140 tokens/s in fp32 on a Zen 3: the online teacher's prefill and the TTT
# unroll), so it checkpoints every 5 min and evaluates every 30 min; rerun the
# same command (each session) to go on where it stopped:
#   bash benchmarks/train_eagle3_budget.sh TOKENS [THREADS]   -> runs/eagle3-TOKENS/ (train.log, history.jsonl, draft/)
# A larger budget goes on from a smaller one's committed draft, as the lineage went on from its base
# run: INIT (the draft), SKIP (the first part past its data), LR (the re-warmed peak); TOKENS is
# the budget in all, so the run trains TOKENS minus what INIT has seen. The shipped budget:
#   INIT=benchmarks/results/eagle3-2000000/draft SKIP=11 LR=5e-4 bash benchmarks/train_eagle3_budget.sh 12802091
# On a fresh machine (no runs/eagle3-TOKENS/ckpt.pt) it goes on from the committed slim checkpoint,
# benchmarks/results/eagle3-TOKENS/ckpt-slim.pt, if there is one (bf16 weights, AdamW's moments anew).
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${1:?usage: [INIT=DRAFT SKIP=PART LR=PEAK] train_eagle3_budget.sh TOKENS [THREADS]}
IDS=data/selfgen/SmolLM2-135M-Instruct OUT=runs/eagle3-$TOKENS
WARM=() RUN=$TOKENS
if [ -n "${INIT:-}" ]; then
  SEEN=$(python -c "from pathlib import Path; from spd.eagle.model import EagleDraft; from spd.eagle.train import tokens_in_all
print(tokens_in_all(EagleDraft.load(Path('$INIT')).config))")
  WARM=(--init-from "$INIT" --skip-shards "${SKIP:?SKIP: the first part past the data of INIT}") RUN=$((TOKENS - SEEN))
fi
mkdir -p $OUT
SLIM=benchmarks/results/eagle3-$TOKENS/ckpt-slim.pt
if [ ! -e $OUT/ckpt.pt ] && [ ! -e $OUT/ckpt-slim.pt ] && [ -e $SLIM ]; then cp $SLIM $OUT/; fi
exec spd --log-level INFO train --method eagle3 --ttt 4 --lr "${LR:-1.5e-3}" --vocab 16384 --batch-tokens 1024 \
  "${WARM[@]}" --tokens "$RUN" --data $IDS/train --heldout $IDS/heldout --eval-seqs 48 --eval-every 1800 \
  --ckpt-every 300 --threads "${2:-2}" --resume --no-progress --out $OUT >> $OUT/train.log 2>&1
