"""In-process BM25 search (:class:`BM25Retriever`) over an index folder of either layout.

Search of a layout-2 index (ours, the default): exact top-k by MaxScore, document at a time, in a
compiled loop (:mod:`sorl_verl.retrieval.maxscore`): posting lists are read in row order, the terms
whose largest scores together cannot reach the k-th best so far are only probed, and no score
buffer is touched. ``BM25Retriever(prune=False)``, layout 1, and layout-2 indexes small enough to be
decoded at load take the exhaustive paths below; every path gives the same answers (tested).

Exhaustive search (ours): the index arrays are memory-mapped (``mmap=True``, the default), so a server's
resident memory is one float32 score buffer per search thread (4 bytes x documents), small tables,
and the index pages its queries touch (shared page cache); layout 1 also keeps its vocabulary
``dict`` and term offsets. Scoring sums the query terms' posting scores into that buffer
(``np.add.at``: one pass, half the CPU of ``buffer[rows] += scores`` as measured; layout 2 decodes
each list, or each block of it, first: rows by ``np.repeat`` of the segments' high parts, scores by
a gather of the factors times the idf), and top-k selection takes the cheapest exact path for the
query (:meth:`BM25Retriever.top_k`: the whole buffer on a corpus of one block, the touched rows only
when the postings are few, cache-sized blocks otherwise). A batch of queries is split over
``search_threads`` threads (default: the CPUs this process may use); numpy releases the GIL in its
array loops, not in the per-query Python around them. Queries are tokenized here, by a pure function
of the saved vocabulary, instead of through a ``bm25s.tokenization.Tokenizer``: the Tokenizer
memoises every word it sees, so in a long-running server it would grow without bound and mutate
shared state across threads.
"""

from __future__ import annotations

import json
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from sorl_verl.retrieval.bm25_format import BM25_DIR, PARAMS_FILE, VOCAB_FILE, stopword_set
from sorl_verl.retrieval.bm25_index import Postings, SegmentedIndex, read_index
from sorl_verl.retrieval.store import IndexFormatError, open_docs

ARGMAX_TOPK = 8  # up to this k, top-k is k argmax passes (SIMD, no copy) instead of a partition
SCORE_BLOCK_DOCS = 1 << 18  # documents scored together in blocked search: a 1 MiB float32 window, cache-resident
SPARSE_POSTINGS = 1 << 15  # up to this many postings a query, top-k selects among the touched rows only
SCATTER_GROUP_POSTINGS = 1 << 16  # posting lists joined for one np.add.at: 512 KiB of rows and scores at most
SCATTER_ALONE_POSTINGS = 1 << 12  # a list this long is added on its own (joining would copy it)
# Layout 2: an index of at most this many postings (32 MB decoded; the embedded 10k corpus has 0.4M) is
# decoded into memory at load: its arrays are small, and scoring without decoding is about twice as fast.
DECODE_POSTINGS = 1 << 22


def default_search_threads() -> int:
    """The CPUs this process may run on (its affinity mask), else ``os.cpu_count()``."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


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


class BM25Retriever:
    """In-process BM25 search over an index folder of either layout (see :func:`~sorl_verl.retrieval.bm25_build.build_bm25`).

    ``search`` returns only documents sharing at least one term with the query, so a query
    of stopwords or unknown words gets ``[]`` (as Pyserini's BM25 in Search-R1 does), and a
    query may get fewer than ``topk`` hits. ``mmap``: map the index arrays instead of reading
    them into memory. ``search_threads``: threads one ``search`` call splits its queries over
    (None: :func:`default_search_threads`); each thread keeps a float32 buffer of ``num_docs``.
    Documents are read through the memory-mapped ``docs.jsonl`` and its offset table
    (:func:`sorl_verl.retrieval.store.open_docs`). ``decode_postings``: a layout-2 index of at most
    this many postings is decoded into memory at load (:meth:`SegmentedIndex.decoded`; 0: never).
    ``prune``: on a layout-2 index not decoded, search by MaxScore (:mod:`sorl_verl.retrieval.maxscore`:
    the same answers, most postings never read); False scores every posting (:meth:`top_k`).
    """

    method = "bm25"

    def __init__(
        self,
        index_dir: str | Path,
        meta: dict,
        mmap: bool = True,
        search_threads: int | None = None,
        decode_postings: int = DECODE_POSTINGS,
        prune: bool = True,
    ):
        index_dir = Path(index_dir)
        self.index_dir = index_dir
        self.meta = meta
        self._mmap = mmap
        folder = index_dir / BM25_DIR
        params, self._index = read_index(folder, mmap)
        self.layout = params["layout"]
        if self.layout == 2 and len(self._index) <= decode_postings:
            self._index = self._index.decoded()
        self.prune = prune and isinstance(self._index, SegmentedIndex)
        if self.prune:
            self._index.warm_up()
        num_docs = meta["num_docs"]
        if params.get("num_docs") != num_docs:
            raise IndexFormatError(
                f"{folder / PARAMS_FILE}: num_docs {params.get('num_docs')}, meta.json says {num_docs}"
            )
        self._num_docs = num_docs
        self._term_id = self._index.term_id
        self._empty_term = self._term_id("")  # bm25s's term of a document without terms: never a query term
        self._block_edges = np.append(np.arange(0, num_docs, SCORE_BLOCK_DOCS, dtype=np.int64), num_docs)
        self._docs = open_docs(index_dir, num_docs)
        tok = meta["tokenizer"]
        self._split = re.compile(tok["pattern"]).findall
        self._lower = tok["lower"]
        self._stopwords = stopword_set(tok["stopwords"])
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
        """bm25s's own view of the index, for comparisons; loaded on first use. Layout 1: bm25s loads
        the folder (memory-mapped); layout 2: a ``bm25s.BM25`` over the decoded arrays, in memory."""
        if getattr(self, "_bm25s_model", None) is None:
            folder = str(self.index_dir / BM25_DIR)
            if self.layout == 1:
                self._bm25s_model = bm25s.BM25.load(folder, mmap=True, load_corpus=False)
            else:
                model = bm25s.BM25(k1=self.meta["bm25"]["k1"], b=self.meta["bm25"]["b"], method="lucene")
                data, indices, indptr = self._index.csc()
                model.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": self._num_docs}
                model.vocab_dict = json.loads((self.index_dir / BM25_DIR / VOCAB_FILE).read_text(encoding="utf-8"))
                model.nonoccurrence_array = None
                self._bm25s_model = model
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
        return [term for term in map(self._term_id, self.terms(query)) if term is not None and term != self._empty_term]

    def score_matching(self, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of the documents containing at least one query term.

        Returns ``(rows, scores)``, both ``(num_matching,)``, rows ascending. A repeated query
        term counts once per occurrence (as in bm25s and Lucene). The sum runs over the
        precomputed per-(term, document) scores (CSC, one column per term); unlike
        ``bm25s.BM25.get_scores`` it reuses one zeroed buffer per thread and hands only the
        touched documents to top-k selection, which is what matters on large corpora.
        """
        buffer = self._buffer()
        touched_rows = []
        for postings in self._postings(token_ids):  # a few terms per query, in query order
            postings.add_to(buffer)
            touched_rows.append(postings.rows())
        touched = sum(len(r) for r in touched_rows)
        if touched == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        # Every posting's score is positive, so the touched rows are the nonzero ones: sort them when
        # they are few, rather than scan the whole buffer (84 MB at 21M documents) for each query.
        if touched < self._num_docs // 64:
            rows = _sorted_unique(np.concatenate(touched_rows))
        else:
            rows = np.flatnonzero(buffer != 0)  # 10x faster than on the float32 buffer itself
        scores = buffer[rows]
        if len(rows) > self._num_docs // 16:
            buffer.fill(0.0)  # a memset beats scattering zeros to many rows
        else:
            buffer[rows] = 0.0
        return rows, scores

    def _postings(self, token_ids: list[int]) -> list[Postings]:
        """Each query term's non-empty posting list, in query order (``len`` its postings, ``decode``
        its ``(rows, scores)``, ``cuts`` its positions at block edges)."""
        return self._index.postings(token_ids) if token_ids else []

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
        lists = self._postings(token_ids)
        if not lists:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        if len(self._block_edges) <= 2:
            return self._top_k_window(lists, k)
        if sum(map(len, lists)) <= SPARSE_POSTINGS:
            return self._top_k_sparse(lists, k)
        return self.top_k_blocked(token_ids, k)

    def _scatter(self, buffer: np.ndarray, lists: list[Postings]) -> None:
        """Add the posting lists ``lists`` (in order) into ``buffer``: a list of ``SCATTER_ALONE_POSTINGS``
        or more is added on its own (:meth:`add_to`), shorter consecutive ones are decoded and joined
        into groups of at most ``SCATTER_GROUP_POSTINGS``, each added by one ``np.add.at`` (about
        1.5 us a call, so 8 short lists in one call cost half as much). ``np.add.at`` applies its
        elements in order, so every document's float32 sum runs in query-term order, as with one
        call per term."""
        group: list[tuple[np.ndarray, np.ndarray]] = []
        size = 0
        for postings in lists:
            count = len(postings)
            if group and (size + count > SCATTER_GROUP_POSTINGS or count >= SCATTER_ALONE_POSTINGS):
                _add_decoded(buffer, group)
                group, size = [], 0
            if count >= SCATTER_ALONE_POSTINGS:
                postings.add_to(buffer)
            else:
                group.append(postings.decode())
                size += count
        if group:
            _add_decoded(buffer, group)

    def _top_k_window(self, lists: list[Postings], k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`top_k` on a one-block corpus: the whole buffer is the window."""
        buffer = self._buffer()
        self._scatter(buffer, lists)
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

    def _top_k_sparse(self, lists: list[Postings], k: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`top_k` when the postings are few: select among the touched rows only.

        ``touched`` ``(num_postings,)``: the posting rows, a row once per query term it holds, and
        ``values`` their summed scores. Each pass takes the best remaining score and all its rows
        (their duplicates share one buffer slot, so equal values), lowest rows first; at most ``k``
        passes of O(num_postings) and no sort (``np.unique`` cost ~200 us on 2,600 rows).
        """
        buffer = self._buffer()
        self._scatter(buffer, lists)
        touched = np.concatenate([postings.rows() for postings in lists])
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
        term's posting list (sorted by row) is cut at the block edges once (``searchsorted``; in
        layout 2 the segment table), so the scattered adds of a block stay within 1 MiB of the score
        buffer instead of hitting all of it (84 MB at 21M documents, far beyond the CPU caches);
        layout 2 decodes a list a block at a time, so its decoded rows and scores stay small too.
        Each touched block gives its best rows by ``argmax`` passes, stopping at the first value that
        cannot beat the ``k``-th best found so far (a later block's rows are higher, so they lose
        ties); the block is then zeroed.

        """
        buffer = self._buffer()
        edges = self._block_edges  # (num_blocks + 1,) int64: 0, B, 2B, ..., num_docs
        lists = [(postings, postings.cuts(edges).tolist()) for postings in self._postings(token_ids)]
        best: list[tuple[float, int]] = []  # (score, row) of the k best so far, best first
        threshold = -np.inf  # the k-th best score once k are held: a later row must beat it strictly
        for block in range(len(edges) - 1):
            touched = False
            for postings, cuts in lists:
                lo, hi = cuts[block], cuts[block + 1]
                if hi > lo:
                    postings.add_to(buffer, lo, hi)
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
                best.sort(key=_rank)
                del best[k:]
                threshold = best[-1][0]
        best.sort(key=_rank)
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
            if self.prune:
                rows, scores, _ = self._index.top_k_maxscore(token_ids, topk)
            elif topk <= ARGMAX_TOPK:
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


def _sorted_unique(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows)`` as int64: a sort and a comparison, several times cheaper than
    ``np.unique`` (numpy 2.4 hashes first)."""
    rows = np.sort(rows).astype(np.int64, copy=False)
    return rows[np.concatenate(([True], rows[1:] != rows[:-1]))]


def _add_decoded(buffer: np.ndarray, group: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """One ``np.add.at`` of the decoded posting lists ``group`` ``[(rows, scores)]`` (in order) into ``buffer``."""
    if len(group) == 1:  # no copy for a lone list
        np.add.at(buffer, *group[0])
    else:
        np.add.at(buffer, np.concatenate([rows for rows, _ in group]), np.concatenate([s for _, s in group]))


def _rank(hit: tuple[float, int]) -> tuple[float, int]:
    """Sort key of a ``(score, row)`` hit: best score first, then lower row."""
    return -hit[0], hit[1]


def load_bm25(index_dir: str | Path, meta: dict, **options) -> BM25Retriever:
    """:class:`BM25Retriever`; ``options``: ``mmap``, ``search_threads``, ``decode_postings``, ``prune``."""
    return BM25Retriever(index_dir, meta, **options)
