#!/bin/bash
# SPD's S0 against EAGLE-3's oracle tau (k = 7) at the same training budget, side by side in one run
# (exact greedy replays, benchmarks/acceptance_sets.sh): the EAGLE-3 draft of
# benchmarks/train_twin.sh eagle3 TOKENS, the shipped PDM lineage's draft of that budget (taken from
# the commit that shipped it, e.g. 73b70a2 for 2M, its base run: benchmarks/lineage_draft.sh), the PPSD
# twin of benchmarks/train_twin.sh ppsd TOKENS if trained here (replayed post-step) and the shipped PDM:
#   bash benchmarks/acceptance_eagle3_budget.sh TOKENS COMMIT [PROMPTS] [MAX_TOKENS]
# -> benchmarks/results/eagle3-TOKENS/acceptance_<set>.{json,md}
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${1:?usage: acceptance_eagle3_budget.sh TOKENS COMMIT [PROMPTS] [MAX_TOKENS]} COMMIT=${2:?}
bash benchmarks/lineage_draft.sh "$TOKENS" "$COMMIT"
PDM=runs/spd-$TOKENS/pdm
B=$(python -c "t = $TOKENS; print(f'{t / 1e6:.1f}M' if t >= 1e6 else f'{t // 1000}k')")
PPSD=()
if [ -e runs/ppsd-$TOKENS/pdm/config.json ]; then PPSD=(--draft "PPSD ($B)=runs/ppsd-$TOKENS/pdm"); fi
exec bash benchmarks/acceptance_sets.sh benchmarks/results/eagle3-$TOKENS "${3:-40}" "${4:-256}" \
  --draft "SPD lineage ($B, $COMMIT)=$PDM" --draft "SPD shipped=shipped" "${PPSD[@]}" \
  --eagle "EAGLE-3 ($B)=runs/eagle3-$TOKENS/draft"
