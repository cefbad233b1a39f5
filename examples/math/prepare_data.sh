#!/usr/bin/env bash
# Math: DAPO-Math-17k (train) and AIME 2024 (eval) -> verl parquet, from the published files
# you downloaded (parquet or JSONL). Options: `python -m data_prep.math --help`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

RAW_DIR="${RAW_DIR:-$SORL_REPO/data/raw/math}"
DATA_DIR="${DATA_DIR:-$SORL_REPO/data/math}"
DAPO_FILE="${DAPO_FILE:-$RAW_DIR/dapo-math-17k.parquet}"
AIME_FILE="${AIME_FILE:-$RAW_DIR/aime-2024.parquet}"

# DAPO-Math-17k's published parquet repeats each problem many times: keep one copy.
sorl_run "$PYTHON" -m data_prep.math --input "dapo_math=$DAPO_FILE" --dedupe --split train \
  --output "$DATA_DIR/train.parquet"
sorl_run "$PYTHON" -m data_prep.math --input "aime2024=$AIME_FILE" --split test --output "$DATA_DIR/aime2024.parquet"
