#!/bin/bash
# Budget-matched PDM sweeps for the evaluation report's width, depth and schedule tables: every
# variant a student of ONE run (spd train --with), so the target's prefill of the committed
# self-generated ids runs once for all; same sequences, order and budget of response tokens, lr
# 1.5e-3 linearly decayed, V_s = 16384. Resumable: rerun the same command.
#   bash benchmarks/train_sweep.sh [TOKENS] [THREADS]   -> runs/sweep/<name>/pdm (where the eval harness reads them)
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${1:-48000} IDS=data/selfgen/SmolLM2-135M-Instruct
declare -A RUNS=(  # the students but the first (spd-n5-pre-ls1: n 5, L_s 1, pre-step, default anchors)
  [spd-n5-post-ls1]="schedule=post"
  [spd-n5-pre-ls2]="ls=2"
  [spd-n2-pre-ls1]="n=2"
  [spd-n3-pre-ls1]="n=3"
  [spd-n6-pre-ls1]="n=6"
  [spd-n10-pre-ls1]="n=10"
  # PPSD (first-stage features only, anchors [0, e1], L_s = 1, post-step)
  [ppsd-n2]="n=2 schedule=post anchors=0,15"
  [ppsd-n3]="n=3 schedule=post anchors=0,10"
  [ppsd-n5]="n=5 schedule=post anchors=0,6"
  [ppsd-n6]="n=6 schedule=post anchors=0,5"
)
WITH=()
for name in "${!RUNS[@]}"; do WITH+=(--with "${RUNS[$name]} out=runs/sweep/$name"); done
mkdir -p runs/sweep
spd --log-level INFO train --method pdm --n 5 --ls 1 --schedule pre --out runs/sweep/spd-n5-pre-ls1 "${WITH[@]}" \
  --lr 1.5e-3 --tokens "$TOKENS" --vocab 16384 --batch-tokens 1024 --data $IDS/train --heldout $IDS/heldout \
  --eval-seqs 24 --eval-every 100000 --ckpt-every 300 --threads "${2:-2}" --resume --no-progress >> runs/sweep/train.log 2>&1
