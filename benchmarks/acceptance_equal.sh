#!/bin/bash
# Greedy acceptance of the equal-budget drafts of benchmarks/train_equal_budget.sh on the evaluation
# sets (exact replays: SPD S0 = n*alpha, EAGLE-3 oracle tau at k = 7), beside the shipped PDM
# (benchmarks/acceptance_sets.sh):
#   bash benchmarks/acceptance_equal.sh TOKENS [PROMPTS] [MAX_TOKENS]
# -> benchmarks/results/equal-TOKENS/acceptance_<set>.{json,md}
set -eu
. "$(dirname "$0")/../.venv/bin/activate"
cd "$(dirname "$0")/.."
TOKENS=${1:?usage: acceptance_equal.sh TOKENS [PROMPTS] [MAX_TOKENS]}
RUN=runs/equal-$TOKENS
B=$(python -c "t = $TOKENS; print(f'{t / 1e6:.1f}M' if t >= 1e6 else f'{t // 1000}k')")
exec bash benchmarks/acceptance_sets.sh benchmarks/results/equal-$TOKENS "${2:-40}" "${3:-128}" \
  --draft "SPD L_s=1 ($B)=$RUN/spd-n5-ls1/pdm" --draft "SPD L_s=2 ($B)=$RUN/spd-n5-ls2/pdm" \
  --draft "SPD shipped=shipped" --eagle "EAGLE-3 ($B)=$RUN/eagle3/draft"
