#!/bin/bash
# Copy the main-budget baseline checkpoints (benchmarks/train_main.sh) into the package, where
# `spd eval` finds them without training: services/spd/assets/baselines/<model>/{eagle3,ppsd-n5}/.
set -eu
cd "$(dirname "$0")/.."
DEST=services/spd/assets/baselines/SmolLM2-135M-Instruct
mkdir -p "$DEST/eagle3" "$DEST/ppsd-n5"
cp runs/main/eagle3/draft/config.json runs/main/eagle3/draft/eagle.safetensors "$DEST/eagle3/"
cp runs/main/ppsd-n5/pdm/config.json runs/main/ppsd-n5/pdm/pdm.safetensors "$DEST/ppsd-n5/"
du -sh "$DEST"/*
