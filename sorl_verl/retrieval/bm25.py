"""BM25 retriever on ``bm25s``'s index format (the embedded default: Python, numpy and a numba-compiled
search loop; no JVM). This module is the public face of four others, by responsibility:

- :mod:`sorl_verl.retrieval.bm25_format`: the on-disk index (layout 1, ``bm25s.BM25.save``'s; layout 2,
  ours: factor codes, 16-bit rows in segments, a memory-mapped vocabulary), the analysis and the
  Lucene scoring it encodes;
- :mod:`sorl_verl.retrieval.bm25_build`: :func:`build_bm25`, the two-pass bounded-memory builder of
  either layout, and :func:`build_bm25_in_memory`, bm25s's build kept as the reference it is tested
  against;
- :mod:`sorl_verl.retrieval.bm25_index`: reading an index folder into posting lists;
- :mod:`sorl_verl.retrieval.bm25_search`: :class:`BM25Retriever` (MaxScore on layout 2, exhaustive
  scoring with cache-blocked top-k otherwise, a thread pool over a batch of queries).

Everything public of those modules that callers use is importable from here, as before the split.
"""

from __future__ import annotations

from sorl_verl.retrieval.bm25_build import DEFAULT_BLOCK_POSTINGS, DEFAULT_CHUNK_DOCS, build_bm25, build_bm25_in_memory
from sorl_verl.retrieval.bm25_format import (
    BM25_DIR,
    CODES_FILE,
    DATA_FILE,
    DEFAULT_B,
    DEFAULT_K1,
    DEFAULT_LAYOUT,
    FACTORS_FILE,
    IDF_FILE,
    INDICES_FILE,
    INDPTR_FILE,
    LAYOUTS,
    MAXCODE_FILE,
    PARAMS_FILE,
    ROWS16_FILE,
    SEGHIGH_FILE,
    SEGMENT_BITS,
    SEGPTR_FILE,
    SEGSTART_FILE,
    TERM_BYTES_FILE,
    TERM_HASH,
    TERM_PTR_FILE,
    TERM_SLOTS_FILE,
    TOKEN_PATTERN,
    UINT16_CODES,
    VOCAB_FILE,
    TermTable,
    bm25_factors,
    decode_rows,
    scores_of,
    stopword_set,
    term_hash,
    term_key,
    term_slots,
    tokenizer_meta,
)
from sorl_verl.retrieval.bm25_search import (
    ARGMAX_TOPK,
    DECODE_POSTINGS,
    BM25Retriever,
    default_search_threads,
    load_bm25,
    top_k_rows,
)

__all__ = [
    "ARGMAX_TOPK",
    "BM25_DIR",
    "CODES_FILE",
    "DATA_FILE",
    "DECODE_POSTINGS",
    "DEFAULT_B",
    "DEFAULT_BLOCK_POSTINGS",
    "DEFAULT_CHUNK_DOCS",
    "DEFAULT_K1",
    "DEFAULT_LAYOUT",
    "FACTORS_FILE",
    "IDF_FILE",
    "INDICES_FILE",
    "INDPTR_FILE",
    "LAYOUTS",
    "MAXCODE_FILE",
    "PARAMS_FILE",
    "ROWS16_FILE",
    "SEGHIGH_FILE",
    "SEGMENT_BITS",
    "SEGPTR_FILE",
    "SEGSTART_FILE",
    "TERM_BYTES_FILE",
    "TERM_HASH",
    "TERM_PTR_FILE",
    "TERM_SLOTS_FILE",
    "TOKEN_PATTERN",
    "UINT16_CODES",
    "VOCAB_FILE",
    "BM25Retriever",
    "TermTable",
    "bm25_factors",
    "build_bm25",
    "build_bm25_in_memory",
    "decode_rows",
    "default_search_threads",
    "load_bm25",
    "scores_of",
    "stopword_set",
    "term_hash",
    "term_key",
    "term_slots",
    "tokenizer_meta",
    "top_k_rows",
]
