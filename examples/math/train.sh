#!/usr/bin/env bash
# Math reasoning (paper: DAPO-Math-17k training, AIME24 evaluation), one turn per response
# (rows use verl's single_turn_agent: no tool). With one turn the turn-level ratio of
# turn_ppo / st_ppo / so_ppo is the sequence-level (GSPO-style) ratio.
#
#   bash examples/math/prepare_data.sh
#   ALGO=so_grpo MODEL=Qwen/Qwen2.5-7B bash examples/math/train.sh [hydra overrides...]
#
# Lengths and group size are ours (DAPO used 16 samples per prompt and 20k-token responses on
# larger models); the optimiser settings are the shared Search-R1 ones of examples/common.sh.
set -euo pipefail
MAX_PROMPT_LENGTH="${MAX_PROMPT_LENGTH:-1024}"
MAX_RESPONSE_LENGTH="${MAX_RESPONSE_LENGTH:-8192}"
GROUP_SIZE="${GROUP_SIZE:-8}"
# AIME24 has 30 problems: validate every 20 steps, greedy (examples/common.sh).
TEST_FREQ="${TEST_FREQ:-20}"
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

DATA_DIR="${DATA_DIR:-$SORL_REPO/data/math}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
VAL_FILES="${VAL_FILES:-$DATA_DIR/aime2024.parquet}"
RUN_NAME="${RUN_NAME:-math-$(basename "$MODEL")-$ALGO}"
RUN_DIR="${RUN_DIR:-$RUN_ROOT/math/$RUN_NAME}"

sorl_require_file "$TRAIN_FILES" "training data" "run examples/math/prepare_data.sh"
sorl_require_file "$VAL_FILES" "validation data" "run examples/math/prepare_data.sh"

sorl_launch \
  "data.train_files=$TRAIN_FILES" \
  "data.val_files=$VAL_FILES" \
  "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn_agent" \
  `# Long single responses: pack micro-batches by tokens rather than by count.` \
  "actor_rollout_ref.actor.use_dynamic_bsz=True" \
  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(((MAX_PROMPT_LENGTH + MAX_RESPONSE_LENGTH) * 2))" \
  -- "$@"
