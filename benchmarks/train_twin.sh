#!/bin/bash
# A baseline's twin of the shipped PDM lineage at one of its budgets: the same self-generated ids in
# the same order, features from the online teacher, the lineage's lr, schedule, V_s and batch; only
# the method differs. METHOD is eagle3 (the EAGLE-3-style draft, TTT 4) or ppsd (PPSD n = 5: anchors
# [0, e1], post-step, L_s = 1). At 2000000 tokens it is the twin of the lineage's base run
# (`runs/long/spd-n5-ls1`, the card's 2M PDM). On a 2-core CPU that takes hours (EAGLE-3 at 2M:
# 8,186 s on a Zen 4 with bf16 units, ~244 tokens/s; ~140 tokens/s in fp32 on a Zen 3: the online
# teacher's prefill and the TTT unroll), so it checkpoints every 5 min and evaluates every 30 min;
# rerun the same command (each session) to go on where it stopped:
#   bash benchmarks/train_twin.sh METHOD TOKENS [THREADS]   -> runs/METHOD-TOKENS/ (train.log, history.jsonl, draft/ or pdm/)
# A larger budget goes on from a smaller one's committed draft, as the lineage went on from its base
# run: INIT (the draft), SKIP (the first part past its data), LR (the re-warmed peak); TOKENS is
# the budget in all, so the run trains TOKENS minus what INIT has seen. EAGLE-3 at the shipped budget:
#   INIT=benchmarks/results/eagle3-2000000/draft SKIP=11 LR=5e-4 bash benchmarks/train_twin.sh eagle3 12802091
# On a fresh machine (no runs/METHOD-TOKENS/ckpt.pt) it goes on from the committed slim checkpoint,
# benchmarks/results/METHOD-TOKENS/ckpt-slim.pt, if there is one (bf16 weights, AdamW's moments anew).
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
USAGE="usage: [INIT=DRAFT SKIP=PART LR=PEAK] train_twin.sh eagle3|ppsd TOKENS [THREADS]"
METHOD=${1:?$USAGE} TOKENS=${2:?$USAGE}
case $METHOD in
  eagle3) FLAGS=(--method eagle3 --ttt 4) SEEN="from spd.eagle.model import EagleDraft as D; from spd.eagle.train import tokens_in_all as t; c = D.load(p).config" ;;
  ppsd) FLAGS=(--method pdm --n 5 --ls 1 --schedule post --anchors 0,6) SEEN="from spd.core.pdm import PDM as D; from spd.train.trainer import tokens_in_all as t; c = D.load(p).config.notes" ;;
  *) echo "$USAGE" >&2; exit 2 ;;
esac
IDS=data/selfgen/SmolLM2-135M-Instruct OUT=runs/$METHOD-$TOKENS RUN=$TOKENS
if [ -n "${INIT:-}" ]; then
  SEEN=$(python -c "from pathlib import Path; p = Path('$INIT'); $SEEN; print(t(c))")
  FLAGS+=(--init-from "$INIT" --skip-shards "${SKIP:?SKIP: the first part past the data of INIT}") RUN=$((TOKENS - SEEN))
fi
mkdir -p $OUT
SLIM=benchmarks/results/$METHOD-$TOKENS/ckpt-slim.pt
if [ ! -e $OUT/ckpt.pt ] && [ ! -e $OUT/ckpt-slim.pt ] && [ -e $SLIM ]; then cp $SLIM $OUT/; fi
exec spd --log-level INFO train "${FLAGS[@]}" --lr "${LR:-1.5e-3}" --vocab 16384 --batch-tokens 1024 \
  --tokens "$RUN" --data $IDS/train --heldout $IDS/heldout --eval-seqs 48 --eval-every 1800 \
  --ckpt-every 300 --threads "${3:-2}" --resume --no-progress --out $OUT >> $OUT/train.log 2>&1
