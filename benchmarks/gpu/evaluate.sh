#!/bin/bash
# After `kit.py unpack`: the GPU run's PDM (and EAGLE-3, if EAGLE=1 co-trained it on the same tokens)
# beside the shipped PDM, on this CPU: the PDMs' held-out agreement at every fill level, then greedy
# acceptance on the evaluation sets (40 prompts x <= 256 tokens, exact replays: SPD S0 = n*alpha,
# EAGLE-3 oracle tau at k = 7). ~40 min on 2 cores. If the PDM wins, ship it with benchmarks/train_ship.py.
#   bash benchmarks/gpu/evaluate.sh [THREADS]   -> benchmarks/results/gpu/
set -eu
. "$(dirname "$0")/../../.venv/bin/activate"
cd "$(dirname "$0")/../.."
RUN=runs/gpu RES=benchmarks/results/gpu
mkdir -p $RES
cp $RUN/pdm-run/history.jsonl $RES/history_pdm.jsonl
cp $RUN/train.log $RES/train.log
python benchmarks/train_eval.py --draft $RUN/pdm-run/pdm --threads "${1:-2}" | tail -1 > $RES/fills_gpu.json
python benchmarks/train_eval.py --draft services/spd/assets/drafts/SmolLM2-135M-Instruct --threads "${1:-2}" |
  tail -1 > $RES/fills_shipped.json
T=$(python -c "import json; print(f\"{json.load(open('$RUN/pdm-run/pdm/config.json'))['notes']['tokens_seen'] / 1e6:.1f}M\")")
EAGLE=()
if [ -f $RUN/eagle3-run/draft/eagle.safetensors ]; then
  cp $RUN/eagle3-run/history.jsonl $RES/history_eagle3.jsonl
  EAGLE=(--eagle "EAGLE-3 GPU ($T)=$RUN/eagle3-run/draft")
fi
bash benchmarks/acceptance_sets.sh $RES 40 256 --draft "SPD shipped=shipped" --draft "SPD GPU ($T)=$RUN/pdm-run/pdm" "${EAGLE[@]}"
