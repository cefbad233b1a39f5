#!/usr/bin/env bash
# Search-R1-style training (paper: general + multi-hop QA) of Qwen2.5-3B/7B, base or instruct,
# on the NQ + HotpotQA training mix, validated on the 7 QA test sets, with the search_r1 agent
# loop and a retrieval server.
#
#   bash examples/search_r1/prepare_data.sh          # once: parquet files
#   bash examples/search_r1/retriever.sh &            # once per node: the retrieval server
#   ALGO=st_ppo MODEL=Qwen/Qwen2.5-3B bash examples/search_r1/train.sh [hydra overrides...]
#
# ALGO: ppo grpo turn_ppo s_ppo st_ppo so_ppo st_ppo_turn_gae so_grpo (examples/common.sh).
# All settings are environment variables documented in examples/common.sh.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

DATA_DIR="${DATA_DIR:-$SORL_REPO/data/search_r1}"
TRAIN_FILES="${TRAIN_FILES:-$DATA_DIR/train.parquet}"
# Periodic validation on the sampled mix; examples/search_r1/evaluate.sh runs the full test mix.
VAL_FILES="${VAL_FILES:-$DATA_DIR/val.parquet}"
RUN_NAME="${RUN_NAME:-search_r1-$(basename "$MODEL")-$ALGO}"
RUN_DIR="${RUN_DIR:-$RUN_ROOT/search_r1/$RUN_NAME}"

sorl_require_file "$TRAIN_FILES" "training data" "run examples/search_r1/prepare_data.sh"
sorl_require_file "$VAL_FILES" "validation data" "run examples/search_r1/prepare_data.sh"
sorl_check_retriever
sorl_write_agent_config "$RUN_DIR/search_r1_agent.yaml"

sorl_launch \
  "data.train_files=$TRAIN_FILES" \
  "data.val_files=$VAL_FILES" \
  "actor_rollout_ref.rollout.agent.default_agent_loop=search_r1" \
  "actor_rollout_ref.rollout.agent.agent_loop_config_path=$RUN_DIR/search_r1_agent.yaml" \
  -- "$@"
