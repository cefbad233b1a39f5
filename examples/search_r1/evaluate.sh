#!/usr/bin/env bash
# Final numbers: validate one checkpoint on the full 7-set test mix (verl's val_only mode).
#
#   CKPT=runs/search_r1/<run>/checkpoints/global_step_1000 ALGO=st_ppo MODEL=Qwen/Qwen2.5-3B \
#     bash examples/search_r1/evaluate.sh
#
# Give the same ALGO and MODEL as the training run: the table tool names the row from them.
# Writes its own run folder (<run>-eval-<step>) for `python -m sorl_verl.tables`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

[[ -n "${CKPT:-}" ]] || sorl_die "set CKPT to a checkpoint folder (.../checkpoints/global_step_N)"
export VAL_FILES="${VAL_FILES:-${DATA_DIR:-$SORL_REPO/data/search_r1}/test.parquet}"
export RUN_NAME="${RUN_NAME:-search_r1-$(basename "$MODEL")-$ALGO-eval-$(basename "$CKPT")}"
export MODEL ALGO

exec bash "$(dirname "${BASH_SOURCE[0]}")/train.sh" \
  trainer.val_only=True trainer.val_before_train=True \
  trainer.resume_mode=resume_path "trainer.resume_from_path=$CKPT" "$@"
