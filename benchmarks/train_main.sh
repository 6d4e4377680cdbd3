#!/bin/bash
# The main comparison's checkpoints at one matched budget (default 240k assistant tokens, 5x the
# sweeps'): SPD n = 5 (pre-step, default anchors, L_s = 1), PPSD n = 5 (anchors [0, e1], post-step,
# L_s = 1) and the EAGLE-3-style draft (TTT 4). Same teacher cache, order, lr schedule and V_s as the
# sweeps (benchmarks/train_sweep.sh). Resumable: rerun the same command.
#   bash benchmarks/train_main.sh QUEUE [TOKENS]     QUEUE = eagle | spd | ppsd | all (all three in parallel)
set -u
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${2:-240000}
COMMON="--lr 1.5e-3 --tokens $TOKENS --vocab 16384 --batch-tokens 1024 --eval-seqs 24 --eval-every 100000 --ckpt-every 120 --threads 1 --resume --no-progress"
run() {  # name, done-marker, args...
  local name=$1 marker=$2; shift 2
  [ -f "runs/main/$name/$marker/config.json" ] && { echo "[main] $name done"; return; }
  echo "[main] $name start $(date +%T)"
  spd --log-level INFO train "$@" $COMMON --out "runs/main/$name" >> "runs/main/$name.log" 2>&1 || echo "[main] $name FAILED"
}
mkdir -p runs/main
case "${1:-all}" in
  eagle) run eagle3 draft --method eagle3 --ttt 4 ;;
  spd) run spd-n5-pre-ls1 pdm --n 5 --ls 1 --schedule pre ;;
  ppsd) run ppsd-n5 pdm --n 5 --ls 1 --schedule post --anchors 0,6 ;;
  *) "$0" eagle "$TOKENS" & "$0" spd "$TOKENS" & "$0" ppsd "$TOKENS"; wait ;;
esac
