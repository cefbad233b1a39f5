#!/usr/bin/env bash
# Medical multiple-choice evaluation sets (MIRAGE: MedQA-US, MedMCQA dev, PubMedQA*, MMLU-Med)
# -> verl parquet, one file per set: DATA_DIR/<name>.parquet. Options:
# `python -m data_prep.medical --help` (e.g. --limit / --sample for quick runs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

MIRAGE_DIR="${MIRAGE_DIR:-$SORL_REPO/data/raw/mirage}"
DATA_DIR="${DATA_DIR:-$SORL_REPO/data/medical}"

sorl_run "$PYTHON" -m data_prep.medical --mirage-dir "$MIRAGE_DIR" --output-dir "$DATA_DIR" \
  --datasets medqa,medmcqa,pubmedqa,mmlu_med
