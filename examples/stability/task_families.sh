#!/usr/bin/env bash
# The stability benchmark across the paper's task families (docs/stability.md, docs/results.md):
#
#   bash examples/stability/task_families.sh [SWEEP_DIR]     (default runs/stability)
#
# - multihop and medical at 64 updates per step (reuse_8x8): the paper's methods PPO, Turn-PPO,
#   S-PPO, ST-PPO, GRPO, SO-GRPO, and the baselines GSPO and CISPO;
# - PPO without pressure (reuse_1x2) on both as the control;
# - search at reuse_8x8: S-PPO with the correction's other readings (absolute, sequence scope; the
#   default reading is s_ppo itself, whose search runs are in the committed archive).
# Seed by seed, so a partial sweep covers every cell once before the next seed. Every call skips
# finished runs (in OUT or in the committed archive, which each finished run joins at once) and
# resumes an unfinished one: run this again (in another sitting, on a fresh checkout) to go on.
# Then the report, merged with the committed archive of earlier sittings' runs.
#
# TASKS (default "multihop medical search") runs a part of the grid, e.g. one part per machine, each
# into its own sweep folder (docs/stability.md, "A part of the grid"):
#   TASKS=multihop bash examples/stability/task_families.sh runs/stability
#   TASKS="medical search" bash examples/stability/task_families.sh runs/stability-b
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
OUT="${1:-runs/stability}"
PYTHON="${PYTHON:-$([[ -x .venv/bin/python ]] && echo .venv/bin/python || echo python3)}"
ARCHIVE="${ARCHIVE:-docs/figures/stability/stability_runs.csv}"
status=0
ALL_TASKS="multihop medical search"
TASKS="${TASKS:-$ALL_TASKS}"
selected() { [[ " $TASKS " == *" $1 "* ]]; }
for task in $TASKS; do
  [[ " $ALL_TASKS " == *" $task "* ]] || { echo "task_families.sh: unknown task '$task' in TASKS (choose from: $ALL_TASKS)" >&2; exit 2; }
done
families=()
for task in multihop medical; do selected "$task" && families+=("$task"); done
for seed in ${SEEDS:-1 2 3}; do
  if ((${#families[@]})); then
    "$PYTHON" -m sorl_verl.stability run --out "$OUT" --keep-going --no-report --archive "$ARCHIVE" --seeds "$seed" --task "${families[@]}" \
      --pressures reuse_8x8 --methods ppo turn_ppo s_ppo st_ppo grpo so_grpo gspo cispo || status=1
    "$PYTHON" -m sorl_verl.stability run --out "$OUT" --keep-going --no-report --archive "$ARCHIVE" --seeds "$seed" --task "${families[@]}" \
      --pressures reuse_1x2 --methods ppo || status=1
  fi
  if selected search; then
    "$PYTHON" -m sorl_verl.stability run --out "$OUT" --keep-going --no-report --archive "$ARCHIVE" --seeds "$seed" --task search \
      --pressures reuse_8x8 --methods s_ppo+absolute s_ppo+sequence || status=1
  fi
done
"$PYTHON" -m sorl_verl.stability report --out "$OUT" --archive "$ARCHIVE" || status=1
exit "$status"
