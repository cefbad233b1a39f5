#!/usr/bin/env bash
# The segment study (docs/stability.md#the-segment-study, docs/segments.md):
#
#   bash examples/stability/segments.sh [SWEEP_DIR]     (default runs/stability-segments)
#
# multihop (3-4 model turns per good trajectory; TASK=multihop_long: 5-6), PPO and ST-PPO on the turn-level critic
# (ppo_turn_gae, st_ppo_turn_gae: segment mode needs turn_gae, so the whole episodes use it too),
# no off-policy pressure (reuse_1x2), five arms: whole episodes, T = 1 and 2 turns per segment with
# sync and staggered resets. Every arm trains about the same number of model turns: a T arm runs
# max(1, L/T) times the steps and validation interval (L = the task's figure: 3.5, 5.5). Seeds 1 2 3
# (SEEDS overrides), seed by seed, so a partial sweep covers every arm once before the next seed.
# Every call skips finished runs (in OUT or in the committed archive, which each finished run joins
# at once) and resumes an unfinished one: run this again (in another sitting, on a fresh checkout)
# to go on. Then the report (segments.md, segments.png), merged with the archive.
# A sweep folder of its own: `run --archive` merges every finished run of the folder into the archive.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${1:-runs/stability-segments}"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
ARCHIVE="${ARCHIVE:-docs/figures/segments/stability_runs.csv}"
status=0
for seed in ${SEEDS:-1 2 3}; do
  "$PYTHON" -m sorl_verl.stability run --out "$OUT" --keep-going --no-report --archive "$ARCHIVE" --seeds "$seed" --task "${TASK:-multihop}" \
    --pressures reuse_1x2 --methods ppo_turn_gae st_ppo_turn_gae --segment-turns 1 2 --resets sync staggered || status=1
done
"$PYTHON" -m sorl_verl.stability report --out "$OUT" --archive "$ARCHIVE" || status=1
exit "$status"
