#!/usr/bin/env bash
# The retrieval server the search_r1 agent loop queries (Search-R1's /retrieve API), on this node.
# Builds the index first if INDEX_DIR does not exist yet.
#
# Search-R1's corpus is the 2018 Wikipedia dump in 100-word passages (wiki-18.jsonl, 21M rows,
# {"id", "contents"}), with an e5-base-v2 dense index on GPU. Our default is BM25 on CPU
# (METHOD=bm25): no GPU taken from training, about an hour to index 21M passages (ours; measure
# yours). For Search-R1's dense setup: METHOD=dense ENCODER=intfloat/e5-base-v2 (a local folder
# or a model name your HF cache holds). Options: `sorl-index --help`, `sorl-retriever --help`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"

CORPUS="${CORPUS:-$SORL_REPO/data/raw/wiki-18.jsonl}"
METHOD="${METHOD:-bm25}"
ENCODER="${ENCODER:-intfloat/e5-base-v2}"
INDEX_DIR="${INDEX_DIR:-$SORL_REPO/data/index/wiki18-$METHOD}"
HOST="${HOST:-127.0.0.1}"
PORT="${PORT:-8000}"

if [[ ! -d "$INDEX_DIR" ]]; then
  sorl_require_file "$CORPUS" "corpus" "Search-R1's wiki-18.jsonl, or any {id, contents} JSONL"
  if [[ "$METHOD" == dense ]]; then
    sorl_run sorl-index "$CORPUS" "$INDEX_DIR" --method dense --encoder "$ENCODER" --faiss flat
  else
    sorl_run sorl-index "$CORPUS" "$INDEX_DIR" --method bm25
  fi
fi
# Must match the agent loop's URL (RETRIEVER_URL, default http://127.0.0.1:8000/retrieve).
sorl_run sorl-retriever --index "$INDEX_DIR" --host "$HOST" --port "$PORT" --topk "$TOPK"
