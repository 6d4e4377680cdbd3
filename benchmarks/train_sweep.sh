#!/bin/bash
# Budget-matched PDM sweeps for the evaluation report (issue 5): every run sees the same data (the
# self-generated ShareGPT teacher cache, in the same order) and the same budget of assistant tokens,
# lr 1.5e-3 linearly decayed, V_s = 16384. Resumable: rerun the same command; finished runs are skipped.
#   bash benchmarks/train_sweep.sh QUEUE [TOKENS]      QUEUE = a | b | all
# Runs land in runs/sweep/<name>/pdm (the eval harness reads them from there).
set -u
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${2:-48000}
declare -A RUNS=(
  [spd-n5-pre-ls1]="--n 5 --ls 1 --schedule pre"
  [spd-n5-post-ls1]="--n 5 --ls 1 --schedule post"
  [spd-n5-pre-ls2]="--n 5 --ls 2 --schedule pre"
  [spd-n2-pre-ls1]="--n 2 --ls 1 --schedule pre"
  [spd-n3-pre-ls1]="--n 3 --ls 1 --schedule pre"
  [spd-n6-pre-ls1]="--n 6 --ls 1 --schedule pre"
  # n = 10: the cache holds no layer 3 or 9 (its e1, e3), so n = 10 uses n = 5's anchors
  [spd-n10-pre-ls1]="--n 10 --ls 1 --schedule pre --anchors 0,6,18,29,30"
  # PPSD (design §9): first-stage features only, anchors [0, e1], L_s = 1, post-step
  [ppsd-n2]="--n 2 --ls 1 --schedule post --anchors 0,15"
  [ppsd-n3]="--n 3 --ls 1 --schedule post --anchors 0,10"
  [ppsd-n5]="--n 5 --ls 1 --schedule post --anchors 0,6"
  [ppsd-n6]="--n 6 --ls 1 --schedule post --anchors 0,5"
)
QA="spd-n5-pre-ls1 ppsd-n5 spd-n5-post-ls1 spd-n3-pre-ls1 ppsd-n3 spd-n10-pre-ls1"
QB="spd-n2-pre-ls1 spd-n6-pre-ls1 ppsd-n6 spd-n5-pre-ls2 ppsd-n2"
case "${1:-all}" in a) Q=$QA ;; b) Q=$QB ;; *) Q="$QA $QB" ;; esac
for name in $Q; do
  out=runs/sweep/$name
  [ -f "$out/pdm/config.json" ] && { echo "[sweep] $name done"; continue; }
  echo "[sweep] $name start $(date +%T)"
  spd --log-level INFO train ${RUNS[$name]} --lr 1.5e-3 --tokens "$TOKENS" --vocab 16384 --batch-tokens 1024 \
    --out "$out" --eval-seqs 24 --eval-every 100000 --ckpt-every 120 --threads 1 --resume --no-progress \
    >> "$out.log" 2>&1 || echo "[sweep] $name FAILED (see $out.log)"
done
