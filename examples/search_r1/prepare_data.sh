#!/usr/bin/env bash
# Search-R1 QA data -> verl parquet: the training mix (NQ + HotpotQA train), the 7-set test mix,
# and a smaller validation mix for the periodic validation during training.
#
# Input: FlashRAG-format JSONL files (id, question, golden_answers), as Search-R1 downloads them
# (RUC-NLPIR/FlashRAG_datasets): RAW_DIR/<dataset>/<split>.jsonl. Fetch them yourself; nothing
# here downloads. Options of the converter: `python -m data_prep.search_qa --help`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

RAW_DIR="${RAW_DIR:-$SORL_REPO/data/raw/flashrag}"
DATA_DIR="${DATA_DIR:-$SORL_REPO/data/search_r1}"
# Questions per data set in the validation mix used every TEST_FREQ steps (ours: the full test
# mix has ~52k questions, too many to run every 50 steps; the final numbers use all of it).
VAL_SAMPLE="${VAL_SAMPLE:-500}"
SEED="${SEED:-0}"

# Search-R1's evaluation splits: test where the data set has one, else dev.
TEST_INPUTS=(
  --input "nq=$RAW_DIR/nq/test.jsonl"
  --input "triviaqa=$RAW_DIR/triviaqa/test.jsonl"
  --input "popqa=$RAW_DIR/popqa/test.jsonl"
  --input "hotpotqa=$RAW_DIR/hotpotqa/dev.jsonl"
  --input "2wikimultihopqa=$RAW_DIR/2wikimultihopqa/dev.jsonl"
  --input "musique=$RAW_DIR/musique/dev.jsonl"
  --input "bamboogle=$RAW_DIR/bamboogle/test.jsonl"
)

sorl_run "$PYTHON" -m data_prep.search_qa \
  --input "nq=$RAW_DIR/nq/train.jsonl" --input "hotpotqa=$RAW_DIR/hotpotqa/train.jsonl" \
  --split train --output "$DATA_DIR/train.parquet"
sorl_run "$PYTHON" -m data_prep.search_qa "${TEST_INPUTS[@]}" --split test --output "$DATA_DIR/test.parquet"
sorl_run "$PYTHON" -m data_prep.search_qa "${TEST_INPUTS[@]}" --split test \
  --sample "$VAL_SAMPLE" --seed "$SEED" --output "$DATA_DIR/val.parquet"
