#!/bin/bash
# GPU recipe for PDM training (prepared; the CPU session that wrote it had no accelerator, so it is
# untested on a GPU). One short script for a device run: build a large self-generated teacher cache
# with big batches, then train the same aligned objective with larger steps, then ship.
#
#   bash benchmarks/train_gpu.sh [TOKENS_TO_GENERATE] [TRAIN_MINUTES]
#
# Everything is resumable: rerunning continues the cache (progress.json) and the run (--resume).
set -euo pipefail
GEN_TOKENS=${1:-3000000}
TRAIN_MIN=${2:-5}
export SPD_CACHE=${SPD_CACHE:-$HOME/.cache/spd}
cd "$(dirname "$0")/.."
python -m spd.train.prepare selfgen --split heldout --max-items 96 --device cuda --batch 96 --threads 8
python -m spd.train.prepare selfgen --split train --device cuda --batch 256 --max-new 384 --threads 8 \
  --tokens "$GEN_TOKENS"
RESUME=""; [ -f runs/pdm-gpu/ckpt.pt ] && RESUME="--resume"
spd --log-level INFO train --device cuda --n 5 --ls 1 --lr 1.5e-3 --vocab 16384 --batch-tokens 8192 \
  --tokens $((GEN_TOKENS * 3 / 4)) --out runs/pdm-gpu --eval-every 60 --ckpt-every 60 --threads 8 \
  --max-seconds $((TRAIN_MIN * 60)) $RESUME
python benchmarks/train_ship.py --run runs/pdm-gpu
