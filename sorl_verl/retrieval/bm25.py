"""BM25 retriever on ``bm25s``'s index format (the embedded default: Python, numpy and a numba-compiled search loop; no JVM).

Search-R1 uses Pyserini's Lucene BM25 for its sparse baseline; we keep Lucene's scoring
variant (``bm25s`` method ``"lucene"``, k1=0.9, b=0.4 as Pyserini's defaults) but not its
analyzer: text is lower-cased, split on ``\\b\\w\\w+\\b``, English stopwords removed and
Snowball-stemmed (PyStemmer). That choice is ours.

Index files (inside the index folder, next to ``meta.json`` and ``docs.jsonl``), in one of two
layouts named by ``"layout"`` in ``bm25/params.index.json`` (absent: 1). Both give the same scores,
bit for bit. Layout 1 is ``bm25s.BM25.save``'s, so indexes of either builder load the same way::

    bm25/data.csc.index.npy      (nnz,) float32   per-(term, document) BM25 scores, CSC by term
    bm25/indices.csc.index.npy   (nnz,) int32     document row of each score
    bm25/indptr.csc.index.npy    (vocab + 1,)     int64 (int32 in older indexes): term t owns [indptr[t], indptr[t+1])
    bm25/vocab.index.json        {term: id}, "" first (the empty document's term), then first appearance
    bm25/params.index.json       k1, b, method "lucene", num_docs, ...

Layout 2 (ours, what :func:`build_bm25` writes by default) stores about 4 bytes a posting instead of
8 and a vocabulary that is memory-mapped instead of a ``dict``::

    bm25/indptr.csc.index.npy    (vocab + 1,) int64    as in layout 1
    bm25/idf.index.npy           (vocab,) float32      Lucene idf of each term
    bm25/factors.index.npy       (codes,) float64      tf / (k1 * ((1 - b) + b * dl / avgdl) + tf) of each
                                                       distinct (tf, dl) pair of the corpus, sorted by (tf, dl)
    bm25/codes.csc.index.npy     (nnz,) uint16         each posting's factor (uint32 past 65,536 factors)
    bm25/rows16.csc.index.npy    (nnz,) uint16         row mod 2**segment_bits of each posting
    bm25/segptr.csc.index.npy    (vocab + 1,) int64    term t's segments are [segptr[t], segptr[t+1])
    bm25/seghigh.csc.index.npy   (segments,) int32     row >> segment_bits, the same for a segment's postings
    bm25/segstart.csc.index.npy  (segments,) int64     where each segment's postings start (in [0, nnz))
    bm25/termslots.index.npy     (2**m,) int32         open-addressing table: term id, or -1 (empty slot)
    bm25/termptr.index.npy       (vocab + 1,) int64    term t's UTF-8 bytes are termbytes[termptr[t]:termptr[t+1]]
    bm25/termbytes.index.npy     (total,) uint8        the terms' UTF-8 bytes in id order
    bm25/maxcode.index.npy       (vocab,) as codes      the code of each term's largest factor (MaxScore's bounds;
                                                       absent in indexes built before 2026-12-03: then the
                                                       corpus's largest factor bounds every term)
    bm25/vocab.index.json        as in layout 1 (for other tools; the retriever does not read it)
    bm25/params.index.json       as in layout 1, plus "layout": 2, "segment_bits", "term_hash"

A posting's score is ``float32(float64(idf[t]) * factors[code])``: the build's float64 product,
rounded once, so equal to layout 1's stored float32 score (the factor depends on the document's
length and the term's count in it, not on the term). A term's postings are sorted by row and cut
into segments of equal ``row >> segment_bits`` (16: 65,536 documents a segment), so a row is stored
in 16 bits. A term is found by probing ``termslots`` from ``blake2b(term, 8 bytes) mod 2**m``
(linear probing) and comparing the stored bytes, so a lookup is exact.

Build (:func:`build_bm25`, ours): two passes in bounded memory. Pass 1 tokenizes the documents in
chunks (``chunk_docs``, 100k by default) and writes each chunk's ``(term, document, tf)`` postings,
sorted by term, to disk; only the vocabulary, the document frequencies (both O(vocabulary)), the
document lengths (4 bytes a document) and the distinct (tf, dl) pairs stay in memory. Pass 2 gathers
the postings of blocks of terms (``block_postings`` at a time) from the chunk files in CSC order and
appends their scores (layout 1) or codes, rows and segments (layout 2) to the index files. Peak
memory is O(chunk + vocabulary + block + 4 bytes x documents), not O(corpus). Both passes read and
write with plain file I/O, never a writable map, so the build's resident memory is what it
allocates. The scores equal ``bm25s.BM25.index``'s bit for bit (the same float64 formula, rounded to
float32 once; :func:`build_bm25_in_memory` keeps bm25s's build for comparison).

Search of a layout-2 index (ours, the default since 2026-12-03): exact top-k by MaxScore, document at
a time, in a compiled loop (:mod:`sorl_verl.retrieval.maxscore`): posting lists are read in row order,
the terms whose largest scores together cannot reach the k-th best so far are only probed, and no
score buffer is touched. ``BM25Retriever(prune=False)``, layout 1, and layout-2 indexes small enough to
be decoded at load take the exhaustive paths below; every path gives the same answers (tested).

Exhaustive search (ours): the index arrays are memory-mapped (``mmap=True``, the default), so a server's
resident memory is one float32 score buffer per search thread (4 bytes x documents), small tables,
and the index pages its queries touch (shared page cache); layout 1 also keeps its vocabulary
``dict`` and term offsets. Scoring sums the query terms' posting scores into that buffer
(``np.add.at``: one pass, half the CPU of ``buffer[rows] += scores`` here; layout 2 decodes each
list, or each block of it, first: rows by ``np.repeat`` of the segments' high parts, scores by a
gather of the factors times the idf), and top-k selection takes the cheapest exact path for the
query (:meth:`BM25Retriever.top_k`: the whole buffer on a corpus of one block, the touched rows only
when the postings are few, cache-sized blocks otherwise). A batch of queries is split over
``search_threads`` threads (default: the CPUs this process may use); numpy releases the GIL in its
array loops, not in the per-query Python around them. Queries are tokenized here, by a pure function of the saved vocabulary,
instead of through a ``bm25s.tokenization.Tokenizer``: the Tokenizer memoises every word it sees, so
in a long-running server it would grow without bound and mutate shared state across threads.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import itertools
import json
import math
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
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
DEFAULT_LAYOUT = 2
LAYOUTS = (1, 2)
SEGMENT_BITS = 16  # layout 2: documents per segment 2**16, so a row within its segment fits a uint16
UINT16_CODES = 1 << 16  # layout 2: factors a uint16 code can name; more and the codes are uint32
TERM_HASH = "blake2b-64"
BM25_DIR = "bm25"
DATA_FILE = "data.csc.index.npy"
INDICES_FILE = "indices.csc.index.npy"
INDPTR_FILE = "indptr.csc.index.npy"
VOCAB_FILE = "vocab.index.json"
PARAMS_FILE = "params.index.json"
IDF_FILE = "idf.index.npy"
FACTORS_FILE = "factors.index.npy"
CODES_FILE = "codes.csc.index.npy"
ROWS16_FILE = "rows16.csc.index.npy"
SEGPTR_FILE = "segptr.csc.index.npy"
SEGHIGH_FILE = "seghigh.csc.index.npy"
SEGSTART_FILE = "segstart.csc.index.npy"
TERM_SLOTS_FILE = "termslots.index.npy"
TERM_PTR_FILE = "termptr.index.npy"
TERM_BYTES_FILE = "termbytes.index.npy"
MAXCODE_FILE = "maxcode.index.npy"


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
SCATTER_ALONE_POSTINGS = 1 << 12  # a list this long is added on its own (joining would copy it)
VIEW_SEGMENT_POSTINGS = 1 << 12  # layout 2: segments this large on average are added one view at a time
TERM_CACHE = 1 << 14  # layout 2: term -> id lookups remembered per retriever (an LRU: a few MB)
# Layout 2: an index of at most this many postings (32 MB decoded; the embedded 10k corpus has 0.4M) is
# decoded into memory at load: its arrays are small, and scoring without decoding is about twice as fast.
DECODE_POSTINGS = 1 << 22


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
    except (ValueError, OSError, EOFError) as e:
        raise IndexFormatError(f"{path}: not a readable .npy array ({e}); rebuild the index") from None
    if array_.ndim != 1 or array_.dtype.name not in dtypes:
        raise IndexFormatError(f"{path}: expected a 1-D {'/'.join(dtypes)} array, got {array_.dtype} {array_.shape}")
    return array_.view(np.ndarray) if mmap else array_  # a plain view: no np.memmap overhead on each slice


def _check_length(folder: Path, name: str, array_: np.ndarray, expected: int, what: str) -> None:
    if array_.shape[0] != expected:
        raise IndexFormatError(
            f"{folder / name}: {array_.shape[0]} entries, expected {expected} ({what}); rebuild the index"
        )


# ---------------------------------------------------------------- layout 2: scores, rows, vocabulary


def bm25_factors(tf: np.ndarray, dl: np.ndarray, k1: float, b: float, avg_doc_len: np.float64) -> np.ndarray:
    """``(n,)`` float64 ``tf / (k1 * ((1 - b) + b * dl / avgdl) + tf)``: Lucene's BM25 without the idf,
    in bm25s's operation order. ``tf`` float64 and ``dl`` int32 (the document's length), both ``(n,)``."""
    norm = k1 * ((1 - b) + b * dl / avg_doc_len)
    return tf / (norm + tf)


def scores_of(idf: np.float64 | np.ndarray, factors: np.ndarray) -> np.ndarray:
    """``(n,)`` float32 BM25 scores: the float64 product ``idf * factors`` rounded once, as the build
    rounds it (``idf`` a scalar or ``(n,)``, float64 values of the float32 idf)."""
    return (idf * factors).astype(np.float32)


def decode_rows(bases: np.ndarray, counts: np.ndarray, lows: np.ndarray) -> np.ndarray:
    """``(n,)`` int64 document rows of consecutive postings: segment ``i`` holds ``counts[i]`` of them,
    all with row ``bases[i] + lows[j]``. ``bases`` ``(s,)`` int64 (``high << segment_bits``),
    ``counts`` ``(s,)`` summing to ``n``, ``lows`` ``(n,)`` uint16."""
    return np.repeat(bases, counts) | lows


def term_key(term: str) -> bytes:
    """A term's bytes in the vocabulary table (UTF-8; lone surrogates kept, as JSON may carry them)."""
    return term.encode("utf-8", "surrogatepass")


def term_hash(key: bytes) -> int:
    """Deterministic 64-bit hash of a term's bytes: blake2b with an 8-byte digest, little-endian
    (``TERM_HASH``; Python's ``hash`` of a str changes between processes)."""
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little")


def term_slots(hashes: np.ndarray, size: int) -> np.ndarray:
    """``(size,)`` int32 linear-probing table of the term ids ``0..len(hashes)-1``: term ``t`` sits at
    the first free slot from ``hashes[t] mod size`` on (wrapping), ``-1`` marks a free slot.

    ``hashes`` ``(vocab,)`` uint64; ``size`` a power of two above ``vocab``. Built in rounds, all
    pending terms at once: a term takes its probe slot when the slot is free and it is the lowest
    pending id asking for it, else moves on to the next slot. So each term's slots from its home
    to its own are all taken, which is what a lookup, stopping at the first free slot, relies on;
    and the table depends only on the hashes.
    """
    if size & (size - 1) or size <= len(hashes):
        raise ValueError(f"size must be a power of two above {len(hashes)}, got {size}")
    mask = np.uint64(size - 1)
    slots = np.full(size, -1, dtype=np.int32)
    pending = np.arange(len(hashes), dtype=np.int64)
    probe = (hashes & mask).astype(np.int64)
    while pending.size:
        free = np.flatnonzero(slots[probe] < 0)
        _, first = np.unique(probe[free], return_index=True)  # the first, i.e. lowest, id of each free slot
        won = free[first]
        slots[probe[won]] = pending[won]
        keep = np.ones(pending.size, dtype=bool)
        keep[won] = False
        pending, probe = pending[keep], (probe[keep] + 1) & (size - 1)
    return slots


class TermTable:
    """Read-only ``term -> id`` lookup over the three vocabulary arrays of layout 2 (memory-mapped:
    a lookup touches a few pages). ``slots`` ``(2**m,)`` int32 (:func:`term_slots`), ``offsets``
    ``(vocab + 1,)`` int64 and ``blob`` uint8 (term ``t``'s bytes are ``blob[offsets[t]:offsets[t+1]]``);
    ``hash_fn`` the hash the table was built with. A probe's candidate is confirmed by comparing its
    stored bytes, so there are no false hits."""

    def __init__(self, slots: np.ndarray, offsets: np.ndarray, blob: np.ndarray, hash_fn: Callable[[bytes], int]):
        self._slots, self._offsets, self._blob, self._hash = slots, offsets, blob, hash_fn
        self._mask = len(slots) - 1

    def get(self, term: str) -> int | None:
        """``term``'s id, or None when it is not in the vocabulary."""
        key = term_key(term)
        slot = self._hash(key) & self._mask
        for _ in range(len(self._slots)):  # a full table has no free slot to stop at
            term_id = int(self._slots[slot])
            if term_id < 0:
                return None
            start, end = self._offsets[term_id : term_id + 2].tolist()
            if end - start == len(key) and self._blob[start:end].tobytes() == key:
                return term_id
            slot = (slot + 1) & self._mask
        return None


class _ScoredPostings:
    """Layout 1: one term's postings as views of the index arrays, ``rows`` ``(n,)`` int32 ascending
    and their float32 ``scores``. The posting-list interface of both layouts: ``len``, :meth:`decode`,
    :meth:`add_to` (scatter-add into a score buffer) and :meth:`cuts` (positions at block edges)."""

    __slots__ = ("_rows", "_scores")

    def __init__(self, rows: np.ndarray, scores: np.ndarray):
        self._rows, self._scores = rows, scores

    def __len__(self) -> int:
        return self._rows.shape[0]

    def rows(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Document rows of postings ``[lo, hi)`` (a view)."""
        return self._rows[lo:hi]

    def decode(self, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, scores)`` of postings ``[lo, hi)``: views, no copy."""
        return self._rows[lo:hi], self._scores[lo:hi]

    def add_to(self, buffer: np.ndarray, lo: int = 0, hi: int | None = None) -> None:
        """Add the scores of postings ``[lo, hi)`` to ``buffer`` at their rows (one ``np.add.at``)."""
        np.add.at(buffer, self._rows[lo:hi], self._scores[lo:hi])

    def cuts(self, edges: np.ndarray) -> np.ndarray:
        """``(len(edges),)`` int64: the position of the first posting with row >= each edge (ascending)."""
        return np.searchsorted(self._rows, edges.astype(self._rows.dtype))


class _CodedPostings:
    """Layout 2: one term's postings, decoded on demand.

    ``index`` the :class:`_SegmentedIndex`, ``[start, end)`` the term's postings and ``[seg_lo, seg_hi)``
    its segments, ``idf`` its idf (the float64 value of the float32), ``base`` its first segment's
    ``high << segment_bits``. ``lows`` ``(n,)`` uint16 and ``codes`` ``(n,)`` are views of the index
    arrays; the segment table is read only for a term of several segments, or for :meth:`cuts`.
    """

    __slots__ = ("lows", "codes", "idf", "base", "_index", "_seg", "_start", "_segments", "_lists", "_table")

    def __init__(self, index: _SegmentedIndex, start: int, end: int, seg_lo: int, seg_hi: int, idf, base: int):
        self.lows, self.codes = index.lows[start:end], index.codes[start:end]
        self.idf, self.base = idf, base
        self._index, self._seg, self._start = index, (seg_lo, seg_hi), start
        self._segments: tuple[np.ndarray, np.ndarray] | None = None
        self._lists: tuple[list[int], list[int]] | None = None  # the segments as Python lists
        self._table: np.ndarray | None = None  # this term's (codes,) float32 scores, once worth it

    def __len__(self) -> int:
        return self.lows.shape[0]

    def segments(self) -> tuple[np.ndarray, np.ndarray]:
        """``(bounds, bases)``: ``(s + 1,)`` int64 offsets in ``[0, n]`` where the term's ``s`` segments
        start (and ``n``), and ``(s,)`` int64 their ``high << segment_bits``."""
        if self._segments is None:
            self._segments = self._index.segments(*self._seg, self._start, len(self))
        return self._segments

    def _pieces(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """``[(base, a, b)]``: each segment's share of postings ``[lo, hi)`` (``0 < hi - lo``), as offsets
        ``[a, b)`` from ``lo``; from the segment table as Python lists (made once per term)."""
        if self._lists is None:
            bounds, bases = self.segments()
            self._lists = bounds.tolist(), bases.tolist()
        bounds, bases = self._lists
        first, last = bisect.bisect_right(bounds, lo) - 1, bisect.bisect_left(bounds, hi)
        cuts = bounds[first : last + 1]
        cuts[0], cuts[-1] = lo, hi
        return [(bases[first + i], cuts[i] - lo, cuts[i + 1] - lo) for i in range(last - first)]

    def rows(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """``(hi - lo,)`` document rows of postings ``[lo, hi)``: int64, or the uint16 view itself when
        the term's one segment is the first."""
        hi = len(self) if hi is None else hi
        lows = self.lows[lo:hi]
        if self._seg[1] - self._seg[0] == 1:
            return lows | np.int64(self.base) if self.base else lows
        pieces = self._pieces(lo, hi)
        if hi - lo < 64 * len(pieces):  # small segments: one np.repeat of their bases
            bases, a, b = (np.array(column, dtype=np.int64) for column in zip(*pieces, strict=True))
            return decode_rows(bases, b - a, lows)
        rows = lows.astype(np.int64)  # large ones: widen, then add each segment's base in place
        for base, a, b in pieces:
            if base:
                rows[a:b] += base
        return rows

    def scores(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """``(hi - lo,)`` float32 scores of postings ``[lo, hi)``, equal to layout 1's: a gather from the
        term's table of ``scores_of(idf, factors)``, made once the postings asked for are at least half
        as many as the factors (else their own factors are multiplied)."""
        return self._scores_of(self.codes[lo:hi])

    def _scores_of(self, codes: np.ndarray) -> np.ndarray:
        factors = self._index.factors
        if self._table is None:
            if 2 * len(codes) < len(factors):
                return scores_of(self.idf, factors.take(codes, mode="clip"))
            self._table = scores_of(self.idf, factors)
        return self._table.take(codes, mode="clip")  # clip: no bounds check (codes < len(factors) by build)

    def decode(self, lo: int = 0, hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, scores)`` of postings ``[lo, hi)`` (:meth:`rows`, :meth:`scores`)."""
        return self.rows(lo, hi), self.scores(lo, hi)

    def add_to(self, buffer: np.ndarray, lo: int = 0, hi: int | None = None) -> None:
        """Add the scores of postings ``[lo, hi)`` to ``buffer`` at their rows. Each segment is added
        through a view of ``buffer`` at its base, indexed by the uint16 rows themselves (no decoded
        rows); when the segments are small (under ``VIEW_SEGMENT_POSTINGS`` postings on average) the
        rows are decoded and added by one call instead."""
        hi = len(self) if hi is None else hi
        scores = self.scores(lo, hi)
        if self._seg[1] - self._seg[0] == 1:
            np.add.at(buffer[self.base :], self.lows[lo:hi], scores)
            return
        pieces = self._pieces(lo, hi)
        if hi - lo < VIEW_SEGMENT_POSTINGS * len(pieces):
            np.add.at(buffer, self.rows(lo, hi), scores)
            return
        lows = self.lows[lo:hi]
        for base, a, b in pieces:
            np.add.at(buffer[base:], lows[a:b], scores[a:b])

    def cuts(self, edges: np.ndarray) -> np.ndarray:
        """``(len(edges),)`` int64: the position of the first posting with row >= each edge (ascending),
        from the segment table; only an edge inside one of the term's segments searches its rows."""
        bounds, bases = self.segments()
        bits = self._index.bits
        home = (edges >> bits) << bits  # the base of each edge's segment
        seg = np.searchsorted(bases, home)  # the term's first segment at or past it
        cuts = bounds[seg]
        inside = np.flatnonzero((home != edges) & (seg < len(bases)))
        for i in inside[bases[seg[inside]] == home[inside]].tolist():
            start, end = bounds[seg[i]], bounds[seg[i] + 1]
            cuts[i] = start + np.searchsorted(self.lows[start:end], edges[i] - home[i])
        return cuts


class _CscIndex:
    """Per posting a float32 score (``data``) and a document row (``indices``), CSC by term
    (``indptr`` ``(vocab + 1,)`` int64): layout 1's files (:meth:`load`), or a small layout-2 index
    decoded into memory (:meth:`_SegmentedIndex.decoded`). ``term_id(term)``: its id or None."""

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, term_id: Callable[[str], int | None]):
        self._data, self._indices, self._indptr, self.term_id = data, indices, indptr, term_id

    @classmethod
    def load(cls, folder: Path, mmap: bool) -> _CscIndex:
        """Layout 1 (bm25s's files), with its ``dict`` vocabulary."""
        data = _load_array(folder / DATA_FILE, mmap, ("float32",))
        indices = _load_array(folder / INDICES_FILE, mmap, ("int32", "uint32", "int64"))
        indptr = np.asarray(_load_array(folder / INDPTR_FILE, False, ("int32", "int64")), dtype=np.int64)
        vocab_path = folder / VOCAB_FILE
        try:
            vocab: dict[str, int] = json.loads(vocab_path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise IndexFormatError(f"{vocab_path}: cannot read the vocabulary ({e}); rebuild the index") from None
        nnz = int(indptr[-1]) if len(indptr) else 0
        if data.shape[0] != nnz or indices.shape[0] != nnz or len(indptr) - 1 > len(vocab):
            raise IndexFormatError(
                f"{folder}: inconsistent arrays (data {data.shape[0]}, indices {indices.shape[0]}, "
                f"indptr ends at {nnz}, {len(indptr) - 1} terms for a vocabulary of {len(vocab)}); "
                "rebuild the index"
            )
        index = cls(data, indices, indptr, vocab.get)
        index._vocab = vocab
        return index

    def __len__(self) -> int:
        return self._data.shape[0]

    def postings(self, token_ids: list[int]) -> list[_ScoredPostings]:
        """The non-empty posting lists of ``token_ids``, in query order (one gather of the offsets)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        spans = zip(self._indptr[ids].tolist(), self._indptr[ids + 1].tolist(), strict=True)
        return [_ScoredPostings(self._indices[s:e], self._data[s:e]) for s, e in spans if e > s]

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data, indices, indptr)``: the index's own arrays."""
        return self._data, self._indices, self._indptr


class _SegmentedIndex:
    """Layout 2 (ours, module docstring): per posting a uint16 factor code and a uint16 row within its
    segment; a memory-mapped vocabulary table. ``mmap=False`` reads every array into memory."""

    def __init__(self, folder: Path, params: dict, mmap: bool):
        bits = params.get("segment_bits")
        if not isinstance(bits, int) or not 1 <= bits <= 16 or params.get("term_hash") != TERM_HASH:
            raise IndexFormatError(
                f"{folder / PARAMS_FILE}: segment_bits {bits!r} (expected 1..16) and term_hash "
                f"{params.get('term_hash')!r} (expected {TERM_HASH!r}); rebuild the index"
            )
        load = functools.partial(_load_array, mmap=mmap)
        self.bits = bits
        self._indptr = load(folder / INDPTR_FILE, dtypes=("int64",))
        self._idf = load(folder / IDF_FILE, dtypes=("float32",))
        self.factors = _load_array(folder / FACTORS_FILE, False, ("float64",))
        self.codes = load(folder / CODES_FILE, dtypes=("uint16", "uint32"))
        self.lows = load(folder / ROWS16_FILE, dtypes=("uint16",))
        self._segptr = load(folder / SEGPTR_FILE, dtypes=("int64",))
        self._seghigh = load(folder / SEGHIGH_FILE, dtypes=("int32",))
        self._segstart = load(folder / SEGSTART_FILE, dtypes=("int64",))
        slots = load(folder / TERM_SLOTS_FILE, dtypes=("int32",))
        offsets = load(folder / TERM_PTR_FILE, dtypes=("int64",))
        blob = load(folder / TERM_BYTES_FILE, dtypes=("uint8",))
        vocab = len(self._idf)
        nnz = int(self._indptr[-1]) if len(self._indptr) else -1
        segments = int(self._segptr[-1]) if len(self._segptr) else -1
        for name, array_, expected, what in (
            (INDPTR_FILE, self._indptr, vocab + 1, f"the {IDF_FILE} terms + 1"),
            (CODES_FILE, self.codes, nnz, f"postings, where {INDPTR_FILE} ends"),
            (ROWS16_FILE, self.lows, nnz, f"postings, where {INDPTR_FILE} ends"),
            (SEGPTR_FILE, self._segptr, vocab + 1, f"the {IDF_FILE} terms + 1"),
            (SEGHIGH_FILE, self._seghigh, segments, f"segments, where {SEGPTR_FILE} ends"),
            (SEGSTART_FILE, self._segstart, segments, f"segments, where {SEGPTR_FILE} ends"),
            (TERM_PTR_FILE, offsets, vocab + 1, f"the {IDF_FILE} terms + 1"),
            (TERM_BYTES_FILE, blob, int(offsets[-1]) if len(offsets) else -1, f"bytes, where {TERM_PTR_FILE} ends"),
        ):
            _check_length(folder, name, array_, expected, what)
        if len(slots) & (len(slots) - 1) or len(slots) <= vocab:
            raise IndexFormatError(
                f"{folder / TERM_SLOTS_FILE}: {len(slots)} slots for {vocab} terms; rebuild the index"
            )
        if self.codes.dtype == np.uint16 and len(self.factors) > UINT16_CODES or not len(self.factors):
            raise IndexFormatError(
                f"{folder / FACTORS_FILE}: {len(self.factors)} factors for {self.codes.dtype} codes; rebuild the index"
            )
        self._terms = TermTable(slots, offsets, blob, term_hash)
        self.term_id = functools.lru_cache(maxsize=TERM_CACHE)(self._terms.get)
        # Each term's largest factor, for MaxScore's bounds; an index built before maxcode existed
        # bounds every term by the corpus's largest factor (looser, as exact).
        self._max_codes = None
        if (folder / MAXCODE_FILE).is_file():
            self._max_codes = load(folder / MAXCODE_FILE, dtypes=(self.codes.dtype.name,))
            _check_length(folder, MAXCODE_FILE, self._max_codes, vocab, f"the {IDF_FILE} terms")
        self._largest_factor = float(self.factors.max())
        self._maxscore = None  # the compiled kernel, imported (numba: ~0.7 s) and compiled by warm_up

    def warm_up(self) -> None:
        """Import and compile MaxScore's kernel for these arrays' types (seconds the first time, then
        numba's on-disk cache) by one query of the first non-empty term, so no search waits for it."""
        from sorl_verl.retrieval.maxscore import top_k_maxscore

        self._maxscore = top_k_maxscore
        first = int(np.argmax(np.diff(self._indptr[: 1 << 16]) > 0))
        self.top_k_maxscore([first], 1)

    def postings(self, token_ids: list[int]) -> list[_CodedPostings]:
        """The non-empty posting lists of ``token_ids``, in query order (one gather of each per-term array)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        seg_lo = self._segptr[ids]
        spans = zip(
            self._indptr[ids].tolist(),
            self._indptr[ids + 1].tolist(),
            seg_lo.tolist(),
            self._segptr[ids + 1].tolist(),
            self._idf[ids].astype(np.float64),
            (self._seghigh[np.minimum(seg_lo, len(self._seghigh) - 1)].astype(np.int64) << self.bits).tolist(),
            strict=True,
        )
        return [_CodedPostings(self, *span) for span in spans if span[1] > span[0]]

    def top_k_maxscore(self, token_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``k`` best documents of the query terms ``token_ids`` by MaxScore
        (:func:`sorl_verl.retrieval.maxscore.top_k_maxscore`): ``(rows, scores, stats)``."""
        ids = np.asarray(token_ids, dtype=np.int64)
        ids = ids[self._indptr[ids + 1] > self._indptr[ids]]
        if not len(ids):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32), np.zeros(2, dtype=np.int64)
        idf = self._idf[ids].astype(np.float64)
        largest = self.factors[self._max_codes[ids]] if self._max_codes is not None else self._largest_factor
        bounds = scores_of(idf, largest).astype(np.float64)  # each term's largest float32 score
        if self._maxscore is None:
            self.warm_up()
        return self._maxscore(
            k,
            self.lows,
            self.codes,
            self.factors,
            self._seghigh,
            self._segstart,
            self.bits,
            self._indptr[ids],
            self._indptr[ids + 1],
            self._segptr[ids],
            self._segptr[ids + 1],
            idf,
            bounds,
        )

    def segments(self, seg_lo: int, seg_hi: int, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """A term's segments ``[seg_lo, seg_hi)`` (its postings ``[start, start + count)``): ``(bounds,
        bases)``, see :meth:`_CodedPostings.segments`."""
        bounds = np.empty(seg_hi - seg_lo + 1, dtype=np.int64)
        np.subtract(self._segstart[seg_lo:seg_hi], start, out=bounds[:-1])
        bounds[-1] = count
        return bounds, self._seghigh[seg_lo:seg_hi].astype(np.int64) << self.bits

    def __len__(self) -> int:
        return self.lows.shape[0]

    def decoded(self) -> _CscIndex:
        """This index with its scores and rows decoded into memory (8 bytes a posting; the vocabulary
        table stays mapped): for small indexes, where decoding each query's postings costs more
        than holding them decoded (:data:`DECODE_POSTINGS`)."""
        return _CscIndex(*self.csc(), self.term_id)

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data, indices, indptr)``: the layout-1 arrays this index decodes to, ``(nnz,)`` float32,
        ``(nnz,)`` int32, ``(vocab + 1,)`` int64 (for comparisons: O(nnz) memory)."""
        nnz = len(self.lows)
        counts = np.diff(np.append(self._segstart, nnz))
        rows = decode_rows(self._seghigh.astype(np.int64) << self.bits, counts, self.lows).astype(np.int32)
        idf = np.repeat(self._idf.astype(np.float64), np.diff(self._indptr))
        return scores_of(idf, self.factors[self.codes]), rows, np.asarray(self._indptr)


def _read_index(folder: Path, mmap: bool) -> tuple[dict, _CscIndex | _SegmentedIndex]:
    """``(params, index)`` of a BM25 folder, of either layout (``params["layout"]``, absent: 1)."""
    params_path = folder / PARAMS_FILE
    try:
        params = json.loads(params_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise IndexFormatError(f"{params_path}: cannot read the BM25 parameters ({e}); rebuild the index") from None
    if params.get("method") != "lucene" or (folder / "nonoccurrence_array.index.npy").exists():
        raise IndexFormatError(f"{params_path}: expected a bm25s 'lucene' index, got {params.get('method')!r}")
    layout = params.setdefault("layout", 1)
    if layout == 1:
        return params, _CscIndex.load(folder, mmap)
    if layout == 2:
        return params, _SegmentedIndex(folder, params, mmap)
    raise IndexFormatError(f"{params_path}: layout {layout!r}, this version reads layouts {LAYOUTS}; rebuild the index")


Postings = _ScoredPostings | _CodedPostings


class BM25Retriever:
    """In-process BM25 search over an index folder of either layout (see :func:`build_bm25`).

    ``search`` returns only documents sharing at least one term with the query, so a query
    of stopwords or unknown words gets ``[]`` (as Pyserini's BM25 in Search-R1 does), and a
    query may get fewer than ``topk`` hits. ``mmap``: map the index arrays instead of reading
    them into memory. ``search_threads``: threads one ``search`` call splits its queries over
    (None: :func:`default_search_threads`); each thread keeps a float32 buffer of ``num_docs``.
    Documents are read through the memory-mapped ``docs.jsonl`` and its offset table
    (:func:`sorl_verl.retrieval.store.open_docs`). ``decode_postings``: a layout-2 index of at most
    this many postings is decoded into memory at load (:meth:`_SegmentedIndex.decoded`; 0: never).
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
        params, self._index = _read_index(folder, mmap)
        self.layout = params["layout"]
        if self.layout == 2 and len(self._index) <= decode_postings:
            self._index = self._index.decoded()
        self.prune = prune and isinstance(self._index, _SegmentedIndex)
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
        1.5 us a call here, so 8 short lists in one call cost half as much). ``np.add.at`` applies its
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
        passes of O(num_postings) and no sort (``np.unique`` cost ~200 us on 2,600 rows here).
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
    """``np.unique(rows)`` as int64: a sort and a comparison, several times cheaper here than
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


def _npy_from_raw(path: Path, raw: Path, dtype, count: int) -> None:
    """Write ``path``, a ``.npy`` of ``count`` ``dtype`` values, from the headerless file ``raw`` (then
    removed): for arrays whose length is known only once they are written."""
    if raw.stat().st_size != count * np.dtype(dtype).itemsize:
        raise RuntimeError(f"{raw}: {raw.stat().st_size} bytes, expected {count} {np.dtype(dtype)} values")
    with open(path, "wb") as out, open(raw, "rb") as values:
        _npy_header(out, dtype, (count,))
        shutil.copyfileobj(values, out, 1 << 22)
    raw.unlink()


def _factor_keys(tf: np.ndarray, dl: np.ndarray) -> np.ndarray:
    """Sorted distinct ``tf << 32 | dl`` (int64) of postings with counts ``tf`` ``(n,)`` in documents of
    lengths ``dl`` ``(n,)`` int32. Most postings have tf 1: their lengths are found by a bincount, only
    the others are sorted."""
    once = tf == 1
    ones = np.flatnonzero(np.bincount(dl[once])) | (1 << 32)
    many = np.unique((tf[~once].astype(np.int64) << 32) | dl[~once])
    return np.union1d(ones, many)


def _csc_blocks(
    chunk_files: list[Path], indptr: np.ndarray, bounds: list[int], bar
) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
    """The postings of each block of terms ``[t0, t1)`` of ``bounds`` in CSC order (by term, then row):
    ``(t0, t1, rows, tf)``, ``rows`` ``(size,)`` int32 and ``tf`` ``(size,)`` uint32, gathered from the
    chunk files (one sequential read per chunk and block; ``bar`` advanced by the postings)."""
    layout = [_npy_data_offset(Path(f"{base}.{name}.npy")) for base in chunk_files for name in ("terms", "docs", "tf")]
    # Where each block starts in each chunk's term-sorted postings.
    starts = np.empty((len(chunk_files), len(bounds)), dtype=np.int64)
    for c, base in enumerate(chunk_files):
        starts[c] = np.searchsorted(np.load(f"{base}.terms.npy"), bounds)
    for block, (t0, t1) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        first, size = indptr[t0], int(indptr[t1] - indptr[t0])
        block_rows = np.empty(size, dtype=np.int32)
        block_tf = np.empty(size, dtype=np.uint32)
        cursor = indptr[t0:t1] - first  # (t1 - t0,) next free slot of each term in the block
        for c, base in enumerate(chunk_files):
            lo, hi = int(starts[c, block]), int(starts[c, block + 1])
            if lo == hi:
                continue
            terms, rows, tf = (
                np.fromfile(f"{base}.{name}.npy", dtype=dtype, count=hi - lo, offset=offset + lo * dtype.itemsize)
                for name, (offset, dtype, _) in zip(("terms", "docs", "tf"), layout[3 * c : 3 * c + 3], strict=True)
            )
            local = terms.astype(np.int64) - t0
            counts = np.bincount(local, minlength=t1 - t0)
            # Chunk c's postings of a term follow those of chunks before it: rows stay ascending.
            slot = cursor[local] + (np.arange(hi - lo) - (np.cumsum(counts) - counts)[local])
            block_rows[slot] = rows
            block_tf[slot] = tf
            cursor += counts
        yield t0, t1, block_rows, block_tf
        bar.update(size)


def _write_scores(blocks, folder: Path, indptr: np.ndarray, idf: np.ndarray, factors_of) -> None:
    """Layout 1: ``data.csc.index.npy`` (each posting's float32 score) and ``indices.csc.index.npy``
    (its int32 row). ``idf`` ``(vocab,)`` float64; ``factors_of(tf, rows)`` the postings' BM25 factors."""
    nnz = int(indptr[-1])
    with open(folder / DATA_FILE, "wb") as data_file, open(folder / INDICES_FILE, "wb") as indices_file:
        _npy_header(data_file, np.float32, (nnz,))
        _npy_header(indices_file, np.int32, (nnz,))
        for t0, t1, rows, tf in blocks:
            terms = np.repeat(np.arange(t0, t1), np.diff(indptr[t0 : t1 + 1]))
            scores_of(idf[terms], factors_of(tf, rows)).tofile(data_file)
            rows.tofile(indices_file)


def _largest_codes(codes: np.ndarray, factors: np.ndarray, bounds: np.ndarray) -> np.ndarray:
    """``(terms,)``: for each term of a block, the code of its largest factor (0 for a term without
    postings). ``codes`` ``(n,)`` the block's postings' codes, ``factors`` ``(codes,)`` float64,
    ``bounds`` ``(terms + 1,)`` int64 where each term's postings start in the block (and ``n``)."""
    out = np.zeros(len(bounds) - 1, dtype=codes.dtype)
    held = np.flatnonzero(np.diff(bounds) > 0)
    if len(codes):
        values = factors[codes]
        largest = np.maximum.reduceat(values, bounds[held])  # (held,) each term's largest factor
        at = np.flatnonzero(values == np.repeat(largest, np.diff(bounds)[held]))  # postings that reach it
        out[held] = codes[at[np.searchsorted(at, bounds[held])]]  # the first such posting of each term
    return out


def _write_coded(blocks, folder: Path, indptr: np.ndarray, code_of, code_dtype, bits: int, factors: np.ndarray) -> int:
    """Layout 2: each posting's factor code (``code_of(tf, rows)``, as ``code_dtype``) and row mod
    ``2**bits``, the segments (``segptr``, ``seghigh``, ``segstart``) and each term's largest code
    (``maxcode``: the code of its largest factor in ``factors``). A segment starts at a term's first
    posting and wherever ``row >> bits`` changes within a term. Returns the segment count."""
    nnz = int(indptr[-1])
    max_codes = np.zeros(len(indptr) - 1, dtype=code_dtype)
    seg_counts = np.zeros(len(indptr) - 1, dtype=np.int64)  # (vocab,) segments of each term
    raw = {name: folder / f".{name}.raw" for name in (SEGHIGH_FILE, SEGSTART_FILE)}
    with (
        open(folder / CODES_FILE, "wb") as codes_file,
        open(folder / ROWS16_FILE, "wb") as rows_file,
        open(raw[SEGHIGH_FILE], "wb") as high_file,
        open(raw[SEGSTART_FILE], "wb") as start_file,
    ):
        _npy_header(codes_file, code_dtype, (nnz,))
        _npy_header(rows_file, np.uint16, (nnz,))
        for t0, t1, rows, tf in blocks:
            codes = code_of(tf, rows).astype(code_dtype)
            codes.tofile(codes_file)
            max_codes[t0:t1] = _largest_codes(codes, factors, indptr[t0 : t1 + 1] - indptr[t0])
            (rows & ((1 << bits) - 1)).astype(np.uint16).tofile(rows_file)
            high = rows >> bits
            term_bounds = indptr[t0 : t1 + 1] - indptr[t0]  # (t1 - t0 + 1,) in the block
            first = np.ones(len(rows), dtype=bool)
            first[1:] = high[1:] != high[:-1]
            first[term_bounds[:-1][np.diff(term_bounds) > 0]] = True
            seg = np.flatnonzero(first)
            seg_counts[t0:t1] = np.diff(np.searchsorted(seg, term_bounds))
            high[seg].astype(np.int32).tofile(high_file)
            (seg + indptr[t0]).tofile(start_file)
    segments = int(seg_counts.sum())
    np.save(folder / MAXCODE_FILE, max_codes)
    np.save(folder / SEGPTR_FILE, np.concatenate([[0], np.cumsum(seg_counts)]))
    _npy_from_raw(folder / SEGHIGH_FILE, raw[SEGHIGH_FILE], np.int32, segments)
    _npy_from_raw(folder / SEGSTART_FILE, raw[SEGSTART_FILE], np.int64, segments)
    return segments


def _write_term_table(vocab: dict[str, int], folder: Path, chunk_terms: int = 1 << 20) -> None:
    """Layout 2's vocabulary: ``termbytes`` and ``termptr`` (the terms' bytes in id order: ``vocab``'s
    order) and ``termslots`` (:func:`term_slots`, about 1.5 slots a term), ``chunk_terms`` at a time."""
    count = len(vocab)
    offsets = np.zeros(count + 1, dtype=np.int64)
    hashes = np.empty(count, dtype=np.uint64)
    raw = folder / f".{TERM_BYTES_FILE}.raw"
    terms = iter(vocab)
    with open(raw, "wb") as out:
        for start in range(0, count, chunk_terms):
            keys = [term_key(term) for term in itertools.islice(terms, chunk_terms)]
            hashes[start : start + len(keys)] = np.fromiter(map(term_hash, keys), dtype=np.uint64, count=len(keys))
            offsets[start + 1 : start + 1 + len(keys)] = offsets[start] + np.cumsum([len(key) for key in keys])
            out.write(b"".join(keys))
    _npy_from_raw(folder / TERM_BYTES_FILE, raw, np.uint8, int(offsets[-1]))
    np.save(folder / TERM_PTR_FILE, offsets)
    np.save(folder / TERM_SLOTS_FILE, term_slots(hashes, 1 << (count + count // 2).bit_length()))


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
    layout: int = DEFAULT_LAYOUT,
    segment_bits: int = SEGMENT_BITS,
    uint16_codes: int = UINT16_CODES,
) -> dict:
    """Write the BM25 files for ``contents`` (index order, any iterable: read once, a chunk at a
    time) into ``out_dir/bm25``, in ``layout`` 2 (ours) or 1 (bm25s's); return meta fields. Bounded
    memory (module docstring); the scratch folder ``out_dir/bm25/.postings`` is removed when done.
    Layout 2 only: ``segment_bits`` (1..16) sets the segments' size, ``2**segment_bits`` documents
    (below 16 only to test many segments on small corpora); codes are uint16 up to ``uint16_codes``
    distinct (tf, dl) pairs (65,536: what uint16 holds; lower only for tests), uint32 beyond."""
    if chunk_docs < 1 or block_postings < 1:
        raise ValueError(f"chunk_docs and block_postings must be positive, got {chunk_docs}, {block_postings}")
    if layout not in LAYOUTS or not 1 <= segment_bits <= 16 or not 1 <= uint16_codes <= UINT16_CODES:
        raise ValueError(
            f"layout must be one of {LAYOUTS}, segment_bits in 1..16 and uint16_codes in 1..{UINT16_CODES}, "
            f"got {layout}, {segment_bits}, {uint16_codes}"
        )
    folder = out_dir / BM25_DIR
    scratch = folder / ".postings"
    scratch.mkdir(parents=True)
    term_ids = _TermIds(_stopwords(stopwords), stemmer)
    split = re.compile(TOKEN_PATTERN).findall
    chunk_files: list[Path] = []
    lengths: list[np.ndarray] = []
    df = np.zeros(1, dtype=np.int64)
    pairs = np.zeros(0, dtype=np.int64)  # layout 2: sorted distinct tf << 32 | dl of the postings
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
            if layout == 2:
                pairs = np.union1d(pairs, _factor_keys(tf, chunk_lengths[rows - num_docs]))
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
    idf32 = _lucene_idf(df, num_docs)  # (vocab,) float32
    indptr = np.zeros(len(vocab) + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    nnz = int(indptr[-1])
    np.save(folder / INDPTR_FILE, indptr)
    with tqdm(
        total=nnz, desc="BM25 pass 2/2: score", unit=" postings", unit_scale=True, disable=not show_progress
    ) as bar:
        blocks = _csc_blocks(chunk_files, indptr, _term_blocks(indptr, block_postings), bar)
        if layout == 1:
            # bm25s's formula and operation order in float64 (its tfc is float64), rounded once.
            def factors_of(tf, rows):
                return bm25_factors(tf.astype(np.float64), doc_lengths[rows], k1, b, avg_doc_len)

            _write_scores(blocks, folder, indptr, idf32.astype(np.float64), factors_of)
        else:
            code_dtype = np.uint16 if len(pairs) <= uint16_codes else np.uint32
            # The same formula on the distinct (tf, dl) pairs: layout 1's factors, value for value.
            dl = (pairs & 0xFFFFFFFF).astype(np.int32)
            factors = bm25_factors((pairs >> 32).astype(np.float64), dl, k1, b, avg_doc_len)

            def code_of(tf, rows):
                return np.searchsorted(pairs, (tf.astype(np.int64) << 32) | doc_lengths[rows])

            segments = _write_coded(blocks, folder, indptr, code_of, code_dtype, segment_bits, factors)
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
    layout_meta = {"layout": layout}
    if layout == 2:
        np.save(folder / IDF_FILE, idf32)
        np.save(folder / FACTORS_FILE, factors)
        _write_term_table(vocab, folder)
        params.update(layout=2, segment_bits=segment_bits, term_hash=TERM_HASH)
        layout_meta.update(
            segment_bits=segment_bits, factors=len(pairs), codes=np.dtype(code_dtype).name, segments=segments
        )
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
            **layout_meta,
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
    """:class:`BM25Retriever`; ``options``: ``mmap``, ``search_threads``, ``decode_postings``, ``prune``."""
    return BM25Retriever(index_dir, meta, **options)
