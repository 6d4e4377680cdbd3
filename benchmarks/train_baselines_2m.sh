#!/bin/bash
# The comparison drafts at the shipped PDM's budget (2M response tokens of the committed
# self-generated ids, features online, the same order, lr schedule and V_s as runs/long/spd-n5-ls1),
# all trained from ONE teacher pass (spd train --with):
#   runs/long/eagle3     the EAGLE-3-style draft, TTT 4
#   runs/long/ppsd-n5    PPSD n = 5 (anchors [0, e1], post-step, L_s = 1)
#   runs/long/spd-n5-ls2 SPD n = 5 at L_s = 2 (the L_s question at >= 2M tokens)
# SPD n = 5 at L_s = 1 is runs/long/spd-n5-ls1 itself. Resumable: rerun the same command (it resumes
# every student where the checkpoints stopped). benchmarks/train_main.sh is the 240k-token version
# (the disk cache, three processes) behind the committed evaluation report.
#   bash benchmarks/train_baselines_2m.sh [THREADS]
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
IDS=data/selfgen/SmolLM2-135M-Instruct
mkdir -p runs/long
exec spd --log-level INFO train --method eagle3 --ttt 4 --out runs/long/eagle3 \
  --with 'method=pdm n=5 ls=1 schedule=post anchors=0,6 out=runs/long/ppsd-n5' \
  --with 'method=pdm n=5 ls=2 schedule=pre out=runs/long/spd-n5-ls2' \
  --lr 1.5e-3 --vocab 16384 --batch-tokens 1024 --tokens 2000000 --data $IDS/train --heldout $IDS/heldout \
  --eval-seqs 48 --eval-every 900 --ckpt-every 300 --threads "${1:-1}" --resume --no-progress \
  >> runs/long/baselines-2m.log 2>&1
