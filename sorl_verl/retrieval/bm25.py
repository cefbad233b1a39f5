"""BM25 retriever on ``bm25s``'s index format (the embedded default: pure Python + numpy, no JVM).

Search-R1 uses Pyserini's Lucene BM25 for its sparse baseline; we keep Lucene's scoring
variant (``bm25s`` method ``"lucene"``, k1=0.9, b=0.4 as Pyserini's defaults) but not its
analyzer: text is lower-cased, split on ``\\b\\w\\w+\\b``, English stopwords removed and
Snowball-stemmed (PyStemmer). That choice is ours.

Index files (inside the index folder, next to ``meta.json`` and ``docs.jsonl``)::

    bm25/data.csc.index.npy      (nnz,) float32   per-(term, document) BM25 scores, CSC by term
    bm25/indices.csc.index.npy   (nnz,) int32     document row of each score
    bm25/indptr.csc.index.npy    (vocab + 1,)     int64 (int32 in older indexes): term t owns [indptr[t], indptr[t+1])
    bm25/vocab.index.json        {term: id}, "" first (the empty document's term), then first appearance
    bm25/params.index.json       k1, b, method "lucene", num_docs, ...

This is ``bm25s.BM25.save``'s layout, so indexes of either builder load the same way.

Build (:func:`build_bm25`, ours): two passes in bounded memory. Pass 1 tokenizes the documents in
chunks (``chunk_docs``, 100k by default) and writes each chunk's ``(term, document, tf)`` postings,
sorted by term, to disk; only the vocabulary, the document frequencies (both O(vocabulary)) and
the document lengths (4 bytes a document) stay in memory. Pass 2 computes Lucene's BM25 for blocks
of terms (``block_postings`` scores at a time) from the chunk files and appends them to the CSC
files. Peak memory is O(chunk + vocabulary + block + 4 bytes x documents), not O(corpus). Both
passes read and write with plain file I/O, never a writable map, so the build's resident memory is
what it allocates. The scores equal ``bm25s.BM25.index``'s bit for bit (the same float64 formula,
rounded to float32 once; :func:`build_bm25_in_memory` keeps bm25s's build for comparison).

Search (ours): the CSC arrays are memory-mapped (``mmap=True``, the default), so a server's
resident memory is the vocabulary, one float32 score buffer per search thread (4 bytes x documents)
and the index pages its queries touch (shared page cache). Scoring sums the precomputed scores of
the query terms' posting lists into that buffer (``np.add.at``: one pass, half the CPU of
``buffer[rows] += scores`` here), and top-k selection takes the cheapest exact path for the query
(:meth:`BM25Retriever.top_k`: the whole buffer on a corpus of one block, the touched rows only when
the postings are few, cache-sized blocks otherwise). A batch of queries is split over
``search_threads`` threads (default: the CPUs this process may use); numpy releases the GIL in its
array loops, not in the per-query Python around them. Queries are tokenized here, by a pure function of the saved vocabulary,
instead of through a ``bm25s.tokenization.Tokenizer``: the Tokenizer memoises every word it sees, so
in a long-running server it would grow without bound and mutate shared state across threads.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import threading
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bm25s
import numpy as np
import Stemmer
from tqdm.auto import tqdm

from sorl_verl.retrieval.store import IndexFormatError, open_docs

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4
DEFAULT_CHUNK_DOCS = 100_000
DEFAULT_BLOCK_POSTINGS = 8_000_000
BM25_DIR = "bm25"
DATA_FILE = "data.csc.index.npy"
INDICES_FILE = "indices.csc.index.npy"
INDPTR_FILE = "indptr.csc.index.npy"
VOCAB_FILE = "vocab.index.json"
PARAMS_FILE = "params.index.json"


def _stopwords(name: str | None) -> frozenset[str]:
    if not name:
        return frozenset()
    return frozenset(bm25s.tokenization._infer_stopwords(name))


def default_search_threads() -> int:
    """The CPUs this process may run on (its affinity mask), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


ARGMAX_TOPK = 8  # up to this k, top-k is k argmax passes (SIMD, no copy) instead of a partition
SCORE_BLOCK_DOCS = 1 << 18  # documents scored together in blocked search: a 1 MiB float32 window, cache-resident
SPARSE_POSTINGS = 1 << 15  # up to this many postings a query, top-k selects among the touched rows only
SCATTER_GROUP_POSTINGS = 1 << 16  # posting lists joined for one np.add.at: 512 KiB of rows and scores at most


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the ``k`` largest scores, best first; ties broken by lower row.

    scores: ``(num_docs,)``, not NaN. Returns ``(min(k, num_docs),)`` int64. For ``k`` up to
    ``ARGMAX_TOPK``: repeated ``argmax`` (whose first maximum is the lowest row among ties), each
    winner set to ``-inf`` until the end and then restored, so ``scores`` is left as it was; a
    partition beyond that.
    """
    k = min(k, scores.shape[0])
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if k <= ARGMAX_TOPK:
        best = np.empty(k, dtype=np.int64)
        values = np.empty(k, dtype=scores.dtype)
        try:
            for i in range(k):
                best[i] = np.argmax(scores)
                values[i] = scores[best[i]]
                scores[best[i]] = -np.inf
        finally:
            scores[best[: i + 1]] = values[: i + 1]
        return best
    kth_largest = -np.partition(-scores, k - 1)[k - 1]
    above = np.flatnonzero(scores > kth_largest)
    tied = np.flatnonzero(scores == kth_largest)[: k - above.shape[0]]  # the lowest rows among the ties
    candidates = np.concatenate([above, tied])
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order]


def _load_array(path: Path, mmap: bool, dtypes: tuple[str, ...]) -> np.ndarray:
    """A 1-D ``.npy`` array, memory-mapped read-only when ``mmap`` (as a plain ndarray view)."""
    if not path.is_file():
        raise IndexFormatError(f"{path} is missing; rebuild the index with sorl-index")
    try:
        array_ = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except (ValueError, OSError) as e:
        raise IndexFormatError(f"{path}: not a readable .npy array ({e})") from None
    if array_.ndim != 1 or array_.dtype.name not in dtypes:
        raise IndexFormatError(f"{path}: expected a 1-D {'/'.join(dtypes)} array, got {array_.dtype} {array_.shape}")
    return array_.view(np.ndarray) if mmap else array_  # a plain view: no np.memmap overhead on each slice


class BM25Retriever:
    """In-process BM25 search over an index folder (see :func:`build_bm25`).

    ``search`` returns only documents sharing at least one term with the query, so a query
    of stopwords or unknown words gets ``[]`` (as Pyserini's BM25 in Search-R1 does), and a
    query may get fewer than ``topk`` hits. ``mmap``: map the score arrays instead of reading
    them into memory. ``search_threads``: threads one ``search`` call splits its queries over
    (None: :func:`default_search_threads`); each thread keeps a float32 buffer of ``num_docs``.
    Documents are read through the memory-mapped ``docs.jsonl`` and its offset table
    (:func:`sorl_verl.retrieval.store.open_docs`).
    """

    method = "bm25"

    def __init__(self, index_dir: str | Path, meta: dict, mmap: bool = True, search_threads: int | None = None):
        index_dir = Path(index_dir)
        self.index_dir = index_dir
        self.meta = meta
        self._mmap = mmap
        folder = index_dir / BM25_DIR
        params_path = folder / PARAMS_FILE
        try:
            params = json.loads(params_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise IndexFormatError(f"{params_path}: cannot read the BM25 parameters ({e}); rebuild the index") from None
        if params.get("method") != "lucene" or (folder / "nonoccurrence_array.index.npy").exists():
            raise IndexFormatError(f"{params_path}: expected a bm25s 'lucene' index, got {params.get('method')!r}")
        self._data = _load_array(folder / DATA_FILE, mmap, ("float32",))
        self._indices = _load_array(folder / INDICES_FILE, mmap, ("int32", "uint32", "int64"))
        self._indptr = np.asarray(_load_array(folder / INDPTR_FILE, False, ("int32", "int64")), dtype=np.int64)
        vocab_path = folder / VOCAB_FILE
        try:
            self._vocab: dict[str, int] = json.loads(vocab_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise IndexFormatError(f"{vocab_path}: cannot read the vocabulary ({e}); rebuild the index") from None
        num_docs = meta["num_docs"]
        if params.get("num_docs") != num_docs:
            raise IndexFormatError(f"{params_path}: num_docs {params.get('num_docs')}, meta.json says {num_docs}")
        nnz = int(self._indptr[-1]) if len(self._indptr) else 0
        if self._data.shape[0] != nnz or self._indices.shape[0] != nnz or len(self._indptr) - 1 > len(self._vocab):
            raise IndexFormatError(
                f"{folder}: inconsistent arrays (data {self._data.shape[0]}, indices {self._indices.shape[0]}, "
                f"indptr ends at {nnz}, {len(self._indptr) - 1} terms for a vocabulary of {len(self._vocab)}); "
                "rebuild the index"
            )
        self._num_docs = num_docs
        self._empty_term = self._vocab.get("")  # bm25s's term of a document without terms: never a query term
        self._block_edges = np.append(np.arange(0, num_docs, SCORE_BLOCK_DOCS, dtype=np.int64), num_docs)
        self._docs = open_docs(index_dir, num_docs)
        tok = meta["tokenizer"]
        self._split = re.compile(tok["pattern"]).findall
        self._lower = tok["lower"]
        self._stopwords = _stopwords(tok["stopwords"])
        self._stemmer_language = tok["stemmer"]
        self._local = threading.local()
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()
        self.search_threads = default_search_threads()
        if search_threads is not None:
            self.set_search_threads(search_threads)

    def __len__(self) -> int:
        return self._num_docs

    @property
    def _bm25(self) -> bm25s.BM25:
        """bm25s's own view of the index (memory-mapped), for comparisons; loaded on first use."""
        if getattr(self, "_bm25s_model", None) is None:
            self._bm25s_model = bm25s.BM25.load(str(self.index_dir / BM25_DIR), mmap=True, load_corpus=False)
        return self._bm25s_model

    def set_search_threads(self, threads: int) -> None:
        """Use ``threads`` (>= 1) threads per ``search`` call from now on."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"search_threads must be a positive integer, got {threads!r}")
        with self._pool_lock:
            if self._pool is not None and threads != self.search_threads:
                self._pool.shutdown(wait=False)
                self._pool = None
            self.search_threads = threads

    def close(self) -> None:
        """Stop the search threads and unmap the corpus (the retriever is unusable afterwards)."""
        with self._pool_lock:
            if self._pool is not None:
                self._pool.shutdown(wait=True)
                self._pool = None
        self._docs.close()

    def terms(self, text: str) -> list[str]:
        """The index's analysis of ``text``: lower-cased words minus stopwords, stemmed."""
        words = self._split(text.lower() if self._lower else text)
        words = [w for w in words if w not in self._stopwords]
        if self._stemmer_language:
            # A Stemmer object is not thread-safe: one per thread (its word cache is bounded, 10k words).
            stemmer = getattr(self._local, "stemmer", None)
            if stemmer is None:
                stemmer = self._local.stemmer = Stemmer.Stemmer(self._stemmer_language)
            words = stemmer.stemWords(words)
        return words

    def query_token_ids(self, query: str) -> list[int]:
        """Vocabulary ids of a query's terms (terms not in the corpus dropped)."""
        get = self._vocab.get
        return [term for term in map(get, self.terms(query)) if term is not None and term != self._empty_term]

    def score_matching(self, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of the documents containing at least one query term.

        Returns ``(rows, scores)``, both ``(num_matching,)``, rows ascending. A repeated query
        term counts once per occurrence (as in bm25s and Lucene). The sum runs over the
        precomputed per-(term, document) scores (CSC, one column per term); unlike
        ``bm25s.BM25.get_scores`` it reuses one zeroed buffer per thread and hands only the
        touched documents to top-k selection, which is what matters on large corpora.
        """
        buffer = self._buffer()
        postings = []
        for term in token_ids:  # a few terms per query; each slice is that term's posting list
            start, end = self._indptr[term], self._indptr[term + 1]
            postings.append(self._indices[start:end])
            np.add.at(buffer, postings[-1], self._data[start:end])
        touched = sum(len(p) for p in postings)
        if touched == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        # Every posting's score is positive, so the touched rows are the nonzero ones: sort them when
        # they are few, rather than scan the whole buffer (84 MB at 21M documents) for each query.
        if touched < self._num_docs // 64:
            rows = np.sort(np.concatenate(postings)).astype(np.int64)
            rows = rows[np.concatenate(([True], rows[1:] != rows[:-1]))]  # np.unique's result, 6x cheaper here
        else:
            rows = np.flatnonzero(buffer != 0)  # 10x faster than on the float32 buffer itself
        scores = buffer[rows]
        if len(rows) > self._num_docs // 16:
            buffer.fill(0.0)  # a memset beats scattering zeros to many rows
        else:
            buffer[rows] = 0.0
        return rows, scores

    def _postings(self, token_ids: list[int]) -> list[tuple[int, int]]:
        """``[(start, end)]`` of each query term's non-empty posting list, in query order (one gather)."""
        if not token_ids:
            return []
        ids = np.asarray(token_ids, dtype=np.int64)
        spans = zip(self._indptr[ids].tolist(), self._indptr[ids + 1].tolist(), strict=True)
        return [(start, end) for start, end in spans if end > start]

    def top_k(self, token_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` (<= ``ARGMAX_TOPK``) best documents: ``(rows, scores)``, best first, ties to the lower
        row; the same documents and float32 scores as :meth:`top_k_blocked` (and as :meth:`score_matching`
        + :func:`top_k_rows`), by the cheapest of three paths (ours):

        - one block (``num_docs <= SCORE_BLOCK_DOCS``, e.g. the embedded 10k corpus): the whole score
          buffer is one cache-resident window: scatter the postings, ``k`` argmax passes, zero it. No
          ``searchsorted``, no per-block loop.
        - few postings (at most ``SPARSE_POSTINGS`` in all, a short query of rare terms on a large corpus):
          scatter, then select among the touched rows only (:meth:`_top_k_sparse`: ``k`` argmax passes
          over the posting rows' summed scores) instead of scanning ``num_docs // SCORE_BLOCK_DOCS``
          windows. The few scattered adds miss the cache but are few; the buffer is zeroed at the touched rows.
        - otherwise :meth:`top_k_blocked` (long posting lists on a large corpus: why blocks exist).

        The float32 sum of a document is the same in every path (one buffer, terms added in query order),
        and each path orders by score, then lower row, so the answers are identical (tested).
        """
        spans = self._postings(token_ids)
        if not spans:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if len(self._block_edges) <= 2:
            return self._top_k_window(spans, k)
        if sum(end - start for start, end in spans) <= SPARSE_POSTINGS:
            return self._top_k_sparse(spans, k)
        return self.top_k_blocked(token_ids, k)

    def _scatter(self, buffer: np.ndarray, spans: list[tuple[int, int]]) -> None:
        """Add the postings of ``spans`` (in order) into ``buffer``: consecutive posting lists are joined
        into groups of at most ``SCATTER_GROUP_POSTINGS`` and each group added by one ``np.add.at``
        (about 1.5 us a call here, so 8 short lists in one call cost half as much). ``np.add.at``
        applies its elements in order, so every document's float32 sum runs in query-term order, as
        with one call per term."""
        group: list[tuple[int, int]] = []
        size = 0
        for start, end in spans:
            if group and size + end - start > SCATTER_GROUP_POSTINGS:
                self._add_postings(buffer, group)
                group, size = [], 0
            group.append((start, end))
            size += end - start
        if group:
            self._add_postings(buffer, group)

    def _add_postings(self, buffer: np.ndarray, group: list[tuple[int, int]]) -> None:
        """One ``np.add.at`` of the posting lists ``group`` (in order) into ``buffer``."""
        indices, data = self._indices, self._data
        if len(group) == 1:  # no copy for a lone list
            ((start, end),) = group
            np.add.at(buffer, indices[start:end], data[start:end])
        else:
            np.add.at(
                buffer,
                np.concatenate([indices[a:b] for a, b in group]),
                np.concatenate([data[a:b] for a, b in group]),
            )

    def _top_k_window(self, spans: list[tuple[int, int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`top_k` on a one-block corpus: the whole buffer is the window."""
        buffer = self._buffer()
        self._scatter(buffer, spans)
        rows = np.empty(k, dtype=np.int64)
        scores = np.empty(k, dtype=np.float32)
        found = 0
        try:
            while found < k:  # argmax returns the first maximum: the lowest row among ties
                top = int(buffer.argmax())
                value = buffer[top]
                if value <= 0.0:
                    break
                rows[found], scores[found] = top, value
                buffer[top] = -np.inf
                found += 1
        finally:
            buffer.fill(0.0)
        return rows[:found], scores[:found]

    def _top_k_sparse(self, spans: list[tuple[int, int]], k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`top_k` when the postings are few: select among the touched rows only.

        ``touched`` ``(num_postings,)``: the posting rows, a row once per query term it holds, and
        ``values`` their summed scores. Each pass takes the best remaining score and all its rows
        (their duplicates share one buffer slot, so equal values), lowest rows first; at most ``k``
        passes of O(num_postings) and no sort (``np.unique`` cost ~200 us on 2,600 rows here).
        """
        buffer = self._buffer()
        self._scatter(buffer, spans)
        touched = np.concatenate([self._indices[start:end] for start, end in spans])
        values = buffer[touched]  # a copy
        buffer[touched] = 0.0
        rows: list[int] = []
        scores: list[np.float32] = []
        while len(rows) < k:
            top = int(values.argmax())
            value = values[top]
            if value <= 0.0:  # -inf: every touched row taken
                break
            tied = np.flatnonzero(values == value)
            for row in sorted(set(touched[tied].tolist()))[: k - len(rows)]:
                rows.append(row)
                scores.append(value)
            values[tied] = -np.inf
        return np.array(rows, dtype=np.int64), np.array(scores, dtype=np.float32)

    def top_k_blocked(self, token_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` (<= ``ARGMAX_TOPK``) best documents: ``(rows, scores)``, best first, ties to the
        lower row; the same documents and float32 scores as :meth:`score_matching` + :func:`top_k_rows`.

        Cache blocking (ours): the documents are taken ``SCORE_BLOCK_DOCS`` at a time, and each query
        term's posting list (sorted by row) is cut at the block edges once (``searchsorted``), so the
        scattered adds of a block stay within 1 MiB of the score buffer instead of hitting all of it
        (84 MB at 21M documents, far beyond the CPU caches). Each touched block gives its best rows by
        ``argmax`` passes, stopping at the first value that cannot beat the ``k``-th best found so far
        (a later block's rows are higher, so they lose ties); the block is then zeroed.
        """
        buffer = self._buffer()
        edges = self._block_edges  # (num_blocks + 1,) int64: 0, B, 2B, ..., num_docs
        lists = []
        for term in token_ids:
            start, end = self._indptr[term], self._indptr[term + 1]
            if end > start:
                rows = self._indices[start:end]
                lists.append((rows, self._data[start:end], np.searchsorted(rows, edges)))
        best: list[tuple[float, int]] = []  # (score, row) of the k best so far, best first
        threshold = -np.inf  # the k-th best score once k are held: a later row must beat it strictly
        for block in range(len(edges) - 1):
            touched = False
            for rows, scores, cuts in lists:
                lo, hi = cuts[block], cuts[block + 1]
                if hi > lo:
                    np.add.at(buffer, rows[lo:hi], scores[lo:hi])
                    touched = True
            if not touched:
                continue
            first = int(edges[block])
            window = buffer[first : edges[block + 1]]
            for _ in range(k):
                top = int(window.argmax())
                value = float(window[top])
                if value <= 0.0 or value <= threshold:
                    break
                best.append((value, first + top))
                window[top] = -np.inf
            window.fill(0.0)
            if len(best) >= k:
                best.sort(key=lambda hit: (-hit[0], hit[1]))
                del best[k:]
                threshold = best[-1][0]
        best.sort(key=lambda hit: (-hit[0], hit[1]))
        return np.array([row for _, row in best], dtype=np.int64), np.array([s for s, _ in best], dtype=np.float32)

    def _buffer(self) -> np.ndarray:
        """This thread's ``(num_docs,)`` float32 score buffer, all zeros between calls."""
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = np.zeros(self._num_docs, dtype=np.float32)
        return buffer

    def _search_serial(self, queries: list[str], topk: int) -> list[list[dict]]:
        results = []
        for query in queries:
            token_ids = self.query_token_ids(query)
            if topk <= ARGMAX_TOPK:
                rows, scores = self.top_k(token_ids, topk)
            else:
                rows, scores = self.score_matching(token_ids)
                best = top_k_rows(scores, topk)  # rows ascending, so ties still go to the lower row
                rows, scores = rows[best], scores[best]
            results.append(
                [{"document": self._docs[row], "score": float(score)} for row, score in zip(rows, scores, strict=True)]
            )
        return results

    def _executor(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self.search_threads, thread_name_prefix="bm25-search")
            return self._pool

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """One list per query, best first: ``{"document": {"id", "contents"}, "score"}``.

        With ``search_threads`` > 1 and several queries, the queries are cut into pieces (four
        per thread, for balance) searched on the thread pool; the results are those of a serial
        search, in query order.
        """
        if topk <= 0:
            raise ValueError(f"topk must be positive, got {topk}")
        queries = list(queries)
        threads = min(self.search_threads, len(queries))
        if threads <= 1:
            return self._search_serial(queries, topk)
        cuts = np.linspace(0, len(queries), min(len(queries), 4 * threads) + 1).astype(int)
        pieces = self._executor().map(
            lambda span: self._search_serial(queries[span[0] : span[1]], topk), zip(cuts[:-1], cuts[1:], strict=True)
        )
        return [hits for piece in pieces for hits in piece]


class _TermIds(dict):
    """word -> term id, ``-1`` for a stopword; a new word is analysed once (stopword test, stem) and
    remembered. ``vocab`` is term -> id in first-appearance order with ``""`` (the term bm25s gives a
    document without terms) as 0: the ids bm25s's Tokenizer assigns."""

    def __init__(self, stopwords: frozenset[str], stemmer: str | None):
        super().__init__()
        self.vocab: dict[str, int] = {"": 0}
        self._stopwords = stopwords
        self._stem = Stemmer.Stemmer(stemmer).stemWord if stemmer else None

    def __missing__(self, word: str) -> int:
        if word in self._stopwords:
            term_id = -1
        else:
            term = self._stem(word) if self._stem else word
            term_id = self.vocab.setdefault(term, len(self.vocab))
        self[word] = term_id
        return term_id


def _npy_header(handle, dtype, shape: tuple[int, ...]) -> None:
    np.lib.format.write_array_header_1_0(
        handle, {"descr": np.lib.format.dtype_to_descr(np.dtype(dtype)), "fortran_order": False, "shape": shape}
    )


def _npy_data_offset(path: Path) -> tuple[int, np.dtype, tuple[int, ...]]:
    """``(byte offset of the data, dtype, shape)`` of a ``.npy`` file."""
    with open(path, "rb") as handle:
        version = np.lib.format.read_magic(handle)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read_header(handle)
        return handle.tell(), dtype, shape


def _tokenize_chunk(texts: list[str], term_ids: _TermIds, split, doc_start: int):
    """Postings of one chunk: ``(terms, docs, tf, lengths)``.

    ``terms`` int32, ``docs`` int32 (global rows) and ``tf`` (uint16, or uint32 when a count
    exceeds 65535) are ``(num_pairs,)``, one per distinct (term, document), sorted by term then
    document; ``lengths`` is ``(len(texts),)`` int32, terms per document after stopwords, with a
    document without terms counted as one ``""`` term (as bm25s does).
    """
    n = len(texts)
    token_ids: list[int] = []  # a list: list.extend(map(...)) is several times faster than array's
    raw_lengths = []
    lookup = term_ids.__getitem__
    for text in texts:
        words = split(text.lower())
        raw_lengths.append(len(words))
        token_ids.extend(map(lookup, words))
    tokens = np.array(token_ids, dtype=np.int32) if token_ids else np.zeros(0, np.int32)
    del token_ids
    docs = np.repeat(np.arange(n, dtype=np.int64), raw_lengths)
    kept = tokens >= 0
    tokens, docs = tokens[kept], docs[kept]
    lengths = np.bincount(docs, minlength=n).astype(np.int32)
    empty = np.flatnonzero(lengths == 0)
    if empty.size:
        tokens = np.concatenate([tokens, np.zeros(empty.size, np.int32)])
        docs = np.concatenate([docs, empty])
        lengths[empty] = 1
    keys, tf = np.unique(tokens.astype(np.int64) * n + docs, return_counts=True)
    terms = (keys // n).astype(np.int32)
    rows = (keys % n + doc_start).astype(np.int32)
    tf = tf.astype(np.uint16 if tf.max() < 1 << 16 else np.uint32)
    return terms, rows, tf, lengths


def _lucene_idf(df: np.ndarray, num_docs: int) -> np.ndarray:
    """``(vocab,)`` float32 Lucene idf ``log(1 + (N - df + 0.5) / (df + 0.5))``, 0 where df is 0.
    Computed with ``math.log`` once per distinct df, as bm25s does per term (so the bits agree)."""
    distinct, inverse = np.unique(df, return_inverse=True)
    values = [math.log(1 + (num_docs - d + 0.5) / (d + 0.5)) if d else 0.0 for d in distinct.tolist()]
    return np.asarray(values, dtype=np.float32)[inverse]


def _term_blocks(indptr: np.ndarray, block_postings: int) -> list[int]:
    """Term boundaries ``[0, t1, ..., vocab]``: each block holds at most ``block_postings`` postings
    (a term with more gets a block of its own)."""
    vocab = len(indptr) - 1
    bounds = [0]
    while bounds[-1] < vocab:
        t0 = bounds[-1]
        t1 = int(np.searchsorted(indptr, indptr[t0] + block_postings, side="right")) - 1
        bounds.append(min(max(t1, t0 + 1), vocab))
    return bounds


def build_bm25(
    contents: Iterable[str],
    out_dir: Path,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    stemmer: str | None = "english",
    stopwords: str | None = "en",
    show_progress: bool = True,
    chunk_docs: int = DEFAULT_CHUNK_DOCS,
    block_postings: int = DEFAULT_BLOCK_POSTINGS,
) -> dict:
    """Write the BM25 files for ``contents`` (index order, any iterable: read once, a chunk at a
    time) into ``out_dir/bm25``; return meta fields. Bounded memory (module docstring); the scratch
    folder ``out_dir/bm25/.postings`` is removed when done."""
    if chunk_docs < 1 or block_postings < 1:
        raise ValueError(f"chunk_docs and block_postings must be positive, got {chunk_docs}, {block_postings}")
    folder = out_dir / BM25_DIR
    scratch = folder / ".postings"
    scratch.mkdir(parents=True)
    term_ids = _TermIds(_stopwords(stopwords), stemmer)
    split = re.compile(TOKEN_PATTERN).findall
    chunk_files: list[Path] = []
    lengths: list[np.ndarray] = []
    df = np.zeros(1, dtype=np.int64)
    num_docs = 0
    texts: list[str] = []
    stream = iter(contents)
    with tqdm(desc="BM25 pass 1/2: tokenize", unit=" docs", disable=not show_progress) as bar:
        while True:
            texts.clear()
            for text in stream:
                texts.append(text)
                if len(texts) == chunk_docs:
                    break
            if not texts:
                break
            if num_docs + len(texts) > np.iinfo(np.int32).max:
                raise ValueError(f"more than {np.iinfo(np.int32).max} documents: rows are stored as int32")
            terms, rows, tf, chunk_lengths = _tokenize_chunk(texts, term_ids, split, num_docs)
            base = scratch / f"{len(chunk_files):06d}"
            for name, values in (("terms", terms), ("docs", rows), ("tf", tf)):
                np.save(f"{base}.{name}.npy", values)
            chunk_files.append(base)
            lengths.append(chunk_lengths)
            if len(df) < len(term_ids.vocab):
                df = np.concatenate([df, np.zeros(len(term_ids.vocab) - len(df), np.int64)])
            df += np.bincount(terms, minlength=len(df))
            num_docs += len(texts)
            bar.update(len(texts))
    if num_docs == 0:
        raise ValueError("no documents to index")
    del texts, terms, rows, tf
    vocab = term_ids.vocab
    del term_ids  # the word cache: only the terms are kept
    doc_lengths = np.concatenate(lengths)  # (num_docs,) int32
    del lengths
    avg_doc_len = np.float64(doc_lengths.sum(dtype=np.int64)) / num_docs  # exact: an integer sum below 2**53
    idf = _lucene_idf(df, num_docs).astype(np.float64)  # (vocab,) float32 values, as float64 for the formula
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    bounds = _term_blocks(indptr, block_postings)
    # Where each block starts in each chunk's term-sorted postings: one sequential read per chunk.
    layout = [_npy_data_offset(Path(f"{base}.{name}.npy")) for base in chunk_files for name in ("terms", "docs", "tf")]
    starts = np.empty((len(chunk_files), len(bounds)), dtype=np.int64)
    for c, base in enumerate(chunk_files):
        starts[c] = np.searchsorted(np.load(f"{base}.terms.npy"), bounds)

    np.save(folder / INDPTR_FILE, indptr)
    with (
        open(folder / DATA_FILE, "wb") as data_file,
        open(folder / INDICES_FILE, "wb") as indices_file,
        tqdm(
            total=nnz, desc="BM25 pass 2/2: score", unit=" postings", unit_scale=True, disable=not show_progress
        ) as bar,
    ):
        _npy_header(data_file, np.float32, (nnz,))
        _npy_header(indices_file, np.int32, (nnz,))
        for block, (t0, t1) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
            first, size = indptr[t0], int(indptr[t1] - indptr[t0])
            block_data = np.empty(size, dtype=np.float32)
            block_rows = np.empty(size, dtype=np.int32)
            cursor = indptr[t0:t1] - first  # (t1 - t0,) next free slot of each term in the block
            for c, base in enumerate(chunk_files):
                lo, hi = int(starts[c, block]), int(starts[c, block + 1])
                if lo == hi:
                    continue
                parts = []
                for name, (offset, dtype, _) in zip(("terms", "docs", "tf"), layout[3 * c : 3 * c + 3], strict=True):
                    parts.append(
                        np.fromfile(
                            f"{base}.{name}.npy", dtype=dtype, count=hi - lo, offset=offset + lo * dtype.itemsize
                        )
                    )
                local, rows, tf = parts[0].astype(np.int64) - t0, parts[1], parts[2].astype(np.float64)
                counts = np.bincount(local, minlength=t1 - t0)
                # Chunk c's postings of a term follow those of chunks before it: rows stay ascending.
                slot = cursor[local] + (np.arange(hi - lo) - (np.cumsum(counts) - counts)[local])
                # bm25s's formula and operation order in float64 (its tfc is float64), rounded once.
                norm = k1 * ((1 - b) + b * doc_lengths[rows] / avg_doc_len)
                block_data[slot] = idf[t0 + local] * (tf / (norm + tf))
                block_rows[slot] = rows
                cursor += counts
            block_data.tofile(data_file)
            block_rows.tofile(indices_file)
            bar.update(size)
    shutil.rmtree(scratch)
    (folder / VOCAB_FILE).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    params = {
        "k1": k1,
        "b": b,
        "delta": 0.5,
        "method": "lucene",
        "idf_method": "lucene",
        "dtype": "float32",
        "int_dtype": "int32",
        "num_docs": num_docs,
        "version": bm25s.__version__,
        "backend": "numpy",
    }
    (folder / PARAMS_FILE).write_text(json.dumps(params, indent=4), encoding="utf-8")
    return {
        "bm25": {
            "k1": k1,
            "b": b,
            "variant": "lucene",
            "vocab_size": len(vocab),
            "postings": nnz,
            "builder": "bounded",
            "chunk_docs": chunk_docs,
        },
        "tokenizer": {"pattern": TOKEN_PATTERN, "lower": True, "stopwords": stopwords, "stemmer": stemmer},
    }


def build_bm25_in_memory(
    contents: list[str],
    out_dir: Path,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    stemmer: str | None = "english",
    stopwords: str | None = "en",
    show_progress: bool = True,
) -> dict:
    """The former builder: bm25s's Tokenizer and ``BM25.index`` over the whole corpus in memory
    (4.3 GB peak at 1M synthetic passages, docs/retrieval.md). Kept as the reference
    :func:`build_bm25` is tested against."""
    tokenizer = bm25s.tokenization.Tokenizer(
        lower=True,
        splitter=TOKEN_PATTERN,
        stopwords=stopwords or [],
        stemmer=Stemmer.Stemmer(stemmer) if stemmer else None,
    )
    tokens = tokenizer.tokenize(contents, return_as="tuple", show_progress=show_progress)
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index(tokens, show_progress=show_progress)
    model.save(str(out_dir / BM25_DIR), show_progress=False)
    return {
        "bm25": {"k1": k1, "b": b, "variant": "lucene", "vocab_size": len(model.vocab_dict), "builder": "in_memory"},
        "tokenizer": {"pattern": TOKEN_PATTERN, "lower": True, "stopwords": stopwords, "stemmer": stemmer},
    }


def load_bm25(index_dir: str | Path, meta: dict, **options) -> BM25Retriever:
    """:class:`BM25Retriever`; ``options``: ``mmap``, ``search_threads``."""
    return BM25Retriever(index_dir, meta, **options)
