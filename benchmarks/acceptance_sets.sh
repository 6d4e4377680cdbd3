#!/bin/bash
# Greedy acceptance of drafts on the three evaluation sets (exact replays: SPD S0 = n*alpha, EAGLE-3
# oracle tau at k = 7), one `acceptance.py` process per set, side by side; paths from the repo root:
#   bash benchmarks/acceptance_sets.sh OUT PROMPTS MAX_TOKENS [--draft LABEL=DIR | --eagle LABEL=DIR ...]
# -> OUT/acceptance_<set>.{json,md,log} and OUT/acceptance.json (the sets merged per draft); prints the tables.
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
OUT=${1:?usage: acceptance_sets.sh OUT PROMPTS MAX_TOKENS [FLAG ...]} PROMPTS=${2:?} MAX=${3:?}
shift 3
mkdir -p "$OUT"
pids=()
for SET in mtbench gsm8k humaneval; do
  OMP_NUM_THREADS=1 python benchmarks/acceptance.py --sets $SET --prompts "$PROMPTS" --max-tokens "$MAX" "$@" \
    --out "$OUT/acceptance_$SET.json" > "$OUT/acceptance_$SET.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done  # set -e: a failed set fails the script
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
merged = None
for set_ in ("mtbench", "gsm8k", "humaneval"):
    part = json.loads((out / f"acceptance_{set_}.json").read_text())
    if merged is None:
        merged = part
        continue
    for kind in ("drafts", "eagle"):
        for label, entry in part[kind].items():
            merged[kind][label]["sets"].update(entry["sets"])
(out / "acceptance.json").write_text(json.dumps(merged, indent=2))
PY
cat "$OUT"/acceptance_*.md
