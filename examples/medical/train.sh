#!/usr/bin/env bash
# Medical QA (paper: MedQA, MedMCQA, PubMedQA*, MMLU-Med) with the search_r1 agent loop over a
# medical corpus, validated on the four MIRAGE sets; reward: the mcqa router entry (a letter,
# no fallback letter).
#
#   bash examples/medical/prepare_data.sh
#   CORPUS=data/raw/medcorp.jsonl INDEX_DIR=data/index/medcorp-bm25 bash examples/search_r1/retriever.sh &
#   ALGO=st_ppo MODEL=Qwen/Qwen2.5-7B-Instruct bash examples/medical/train.sh [hydra overrides...]
#
# Training data: the paper's medical training set is not part of our materials. Ours: by default
# train on the Search-R1 QA mix (examples/search_r1/prepare_data.sh) and measure transfer to the
# medical sets; set TRAIN_FILES to a medical parquet in the same row format (data_prep's) to
# train in-domain. The retriever (MedRAG's MedCorp or any {id, contents} JSONL) is yours to supply.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

DATA_DIR="${DATA_DIR:-$SORL_REPO/data/medical}"
TRAIN_FILES="${TRAIN_FILES:-$SORL_REPO/data/search_r1/train.parquet}"
MED_SETS="${MED_SETS:-medqa medmcqa pubmedqa mmlu_med}"
RUN_NAME="${RUN_NAME:-medical-$(basename "$MODEL")-$ALGO}"
RUN_DIR="${RUN_DIR:-$RUN_ROOT/medical/$RUN_NAME}"

val_files=()
for name in $MED_SETS; do
  sorl_require_file "$DATA_DIR/$name.parquet" "validation data" "run examples/medical/prepare_data.sh"
  val_files+=("'$DATA_DIR/$name.parquet'")
done
sorl_require_file "$TRAIN_FILES" "training data"
sorl_check_retriever
sorl_write_agent_config "$RUN_DIR/search_r1_agent.yaml"

sorl_launch \
  "data.train_files=$TRAIN_FILES" \
  "data.val_files=[$(IFS=,; echo "${val_files[*]}")]" \
  "actor_rollout_ref.rollout.agent.default_agent_loop=search_r1" \
  "actor_rollout_ref.rollout.agent.agent_loop_config_path=$RUN_DIR/search_r1_agent.yaml" \
  -- "$@"
