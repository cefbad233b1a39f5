"""Reading a BM25 index folder of either layout (:mod:`.bm25_format`) into posting lists.

:func:`read_index` gives a :class:`CscIndex` (layout 1, or a small layout-2 index decoded into
memory) or a :class:`SegmentedIndex` (layout 2 as stored). Both hand out each query term's
posting list with one interface (:class:`ScoredPostings`, :class:`CodedPostings`: ``len``,
``rows``, ``decode``, ``add_to`` a score buffer, ``cuts`` at block edges), which the exhaustive
search paths of :class:`~sorl_verl.retrieval.bm25_search.BM25Retriever` use; a
:class:`SegmentedIndex` also searches by MaxScore (:meth:`SegmentedIndex.top_k_maxscore`).

The index arrays are memory-mapped (``mmap=True``), read-only, as plain ndarray views; a layout-2
vocabulary lookup touches a few pages of its table.
"""

from __future__ import annotations

import bisect
import functools
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sorl_verl.retrieval import bm25_format as fmt
from sorl_verl.retrieval.store import IndexFormatError

VIEW_SEGMENT_POSTINGS = 1 << 12  # layout 2: segments this large on average are added one view at a time
TERM_CACHE = 1 << 14  # layout 2: term -> id lookups remembered per retriever (an LRU: a few MB)


class ScoredPostings:
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


class CodedPostings:
    """Layout 2: one term's postings, decoded on demand.

    ``index`` the :class:`SegmentedIndex`, ``[start, end)`` the term's postings and ``[seg_lo, seg_hi)``
    its segments, ``idf`` its idf (the float64 value of the float32), ``base`` its first segment's
    ``high << segment_bits``. ``lows`` ``(n,)`` uint16 and ``codes`` ``(n,)`` are views of the index
    arrays; the segment table is read only for a term of several segments, or for :meth:`cuts`.
    """

    __slots__ = ("lows", "codes", "idf", "base", "_index", "_seg", "_start", "_segments", "_lists", "_table")

    def __init__(self, index: SegmentedIndex, start: int, end: int, seg_lo: int, seg_hi: int, idf, base: int):
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
            return fmt.decode_rows(bases, b - a, lows)
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
                return fmt.scores_of(self.idf, factors.take(codes, mode="clip"))
            self._table = fmt.scores_of(self.idf, factors)
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


class CscIndex:
    """Per posting a float32 score (``data``) and a document row (``indices``), CSC by term
    (``indptr`` ``(vocab + 1,)`` int64): layout 1's files (:meth:`load`), or a small layout-2 index
    decoded into memory (:meth:`SegmentedIndex.decoded`). ``term_id(term)``: its id or None."""

    def __init__(self, data: np.ndarray, indices: np.ndarray, indptr: np.ndarray, term_id: Callable[[str], int | None]):
        self._data, self._indices, self._indptr, self.term_id = data, indices, indptr, term_id

    @classmethod
    def load(cls, folder: Path, mmap: bool) -> CscIndex:
        """Layout 1 (bm25s's files), with its ``dict`` vocabulary."""
        data = fmt.load_array(folder / fmt.DATA_FILE, mmap, ("float32",))
        indices = fmt.load_array(folder / fmt.INDICES_FILE, mmap, ("int32", "uint32", "int64"))
        indptr = np.asarray(fmt.load_array(folder / fmt.INDPTR_FILE, False, ("int32", "int64")), dtype=np.int64)
        vocab_path = folder / fmt.VOCAB_FILE
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

    def postings(self, token_ids: list[int]) -> list[ScoredPostings]:
        """The non-empty posting lists of ``token_ids``, in query order (one gather of the offsets)."""
        ids = np.asarray(token_ids, dtype=np.int64)
        spans = zip(self._indptr[ids].tolist(), self._indptr[ids + 1].tolist(), strict=True)
        return [ScoredPostings(self._indices[s:e], self._data[s:e]) for s, e in spans if e > s]

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data, indices, indptr)``: the index's own arrays."""
        return self._data, self._indices, self._indptr


class SegmentedIndex:
    """Layout 2 (ours, :mod:`.bm25_format`): per posting a uint16 factor code and a uint16 row within its
    segment; a memory-mapped vocabulary table. ``mmap=False`` reads every array into memory."""

    def __init__(self, folder: Path, params: dict, mmap: bool):
        bits = params.get("segment_bits")
        if not isinstance(bits, int) or not 1 <= bits <= 16 or params.get("term_hash") != fmt.TERM_HASH:
            raise IndexFormatError(
                f"{folder / fmt.PARAMS_FILE}: segment_bits {bits!r} (expected 1..16) and term_hash "
                f"{params.get('term_hash')!r} (expected {fmt.TERM_HASH!r}); rebuild the index"
            )
        load = functools.partial(fmt.load_array, mmap=mmap)
        self.bits = bits
        self._indptr = load(folder / fmt.INDPTR_FILE, dtypes=("int64",))
        self._idf = load(folder / fmt.IDF_FILE, dtypes=("float32",))
        self.factors = fmt.load_array(folder / fmt.FACTORS_FILE, False, ("float64",))
        self.codes = load(folder / fmt.CODES_FILE, dtypes=("uint16", "uint32"))
        self.lows = load(folder / fmt.ROWS16_FILE, dtypes=("uint16",))
        self._segptr = load(folder / fmt.SEGPTR_FILE, dtypes=("int64",))
        self._seghigh = load(folder / fmt.SEGHIGH_FILE, dtypes=("int32",))
        self._segstart = load(folder / fmt.SEGSTART_FILE, dtypes=("int64",))
        slots = load(folder / fmt.TERM_SLOTS_FILE, dtypes=("int32",))
        offsets = load(folder / fmt.TERM_PTR_FILE, dtypes=("int64",))
        blob = load(folder / fmt.TERM_BYTES_FILE, dtypes=("uint8",))
        vocab = len(self._idf)
        nnz = int(self._indptr[-1]) if len(self._indptr) else -1
        segments = int(self._segptr[-1]) if len(self._segptr) else -1
        for name, array_, expected, what in (
            (fmt.INDPTR_FILE, self._indptr, vocab + 1, f"the {fmt.IDF_FILE} terms + 1"),
            (fmt.CODES_FILE, self.codes, nnz, f"postings, where {fmt.INDPTR_FILE} ends"),
            (fmt.ROWS16_FILE, self.lows, nnz, f"postings, where {fmt.INDPTR_FILE} ends"),
            (fmt.SEGPTR_FILE, self._segptr, vocab + 1, f"the {fmt.IDF_FILE} terms + 1"),
            (fmt.SEGHIGH_FILE, self._seghigh, segments, f"segments, where {fmt.SEGPTR_FILE} ends"),
            (fmt.SEGSTART_FILE, self._segstart, segments, f"segments, where {fmt.SEGPTR_FILE} ends"),
            (fmt.TERM_PTR_FILE, offsets, vocab + 1, f"the {fmt.IDF_FILE} terms + 1"),
            (
                fmt.TERM_BYTES_FILE,
                blob,
                int(offsets[-1]) if len(offsets) else -1,
                f"bytes, where {fmt.TERM_PTR_FILE} ends",
            ),
        ):
            fmt.check_length(folder, name, array_, expected, what)
        if len(slots) & (len(slots) - 1) or len(slots) <= vocab:
            raise IndexFormatError(
                f"{folder / fmt.TERM_SLOTS_FILE}: {len(slots)} slots for {vocab} terms; rebuild the index"
            )
        if self.codes.dtype == np.uint16 and len(self.factors) > fmt.UINT16_CODES or not len(self.factors):
            raise IndexFormatError(
                f"{folder / fmt.FACTORS_FILE}: {len(self.factors)} factors for {self.codes.dtype} codes; rebuild the index"
            )
        self._terms = fmt.TermTable(slots, offsets, blob, fmt.term_hash)
        self.term_id = functools.lru_cache(maxsize=TERM_CACHE)(self._terms.get)
        # Each term's largest factor, for MaxScore's bounds; an index built before maxcode existed
        # bounds every term by the corpus's largest factor (looser, as exact).
        self._max_codes = None
        if (folder / fmt.MAXCODE_FILE).is_file():
            self._max_codes = load(folder / fmt.MAXCODE_FILE, dtypes=(self.codes.dtype.name,))
            fmt.check_length(folder, fmt.MAXCODE_FILE, self._max_codes, vocab, f"the {fmt.IDF_FILE} terms")
        self._largest_factor = float(self.factors.max())
        self._maxscore = None  # the compiled kernel, imported (numba: ~0.7 s) and compiled by warm_up

    def warm_up(self) -> None:
        """Import and compile MaxScore's kernel for these arrays' types (seconds the first time, then
        numba's on-disk cache) by one query of the first non-empty term, so no search waits for it."""
        from sorl_verl.retrieval.maxscore import top_k_maxscore

        self._maxscore = top_k_maxscore
        first = int(np.argmax(np.diff(self._indptr[: 1 << 16]) > 0))
        self.top_k_maxscore([first], 1)

    def postings(self, token_ids: list[int]) -> list[CodedPostings]:
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
        return [CodedPostings(self, *span) for span in spans if span[1] > span[0]]

    def top_k_maxscore(self, token_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ``k`` best documents of the query terms ``token_ids`` by MaxScore
        (:func:`sorl_verl.retrieval.maxscore.top_k_maxscore`): ``(rows, scores, stats)``."""
        ids = np.asarray(token_ids, dtype=np.int64)
        ids = ids[self._indptr[ids + 1] > self._indptr[ids]]
        if not len(ids):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32), np.zeros(2, dtype=np.int64)
        idf = self._idf[ids].astype(np.float64)
        largest = self.factors[self._max_codes[ids]] if self._max_codes is not None else self._largest_factor
        bounds = fmt.scores_of(idf, largest).astype(np.float64)  # each term's largest float32 score
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
        bases)``, see :meth:`CodedPostings.segments`."""
        bounds = np.empty(seg_hi - seg_lo + 1, dtype=np.int64)
        np.subtract(self._segstart[seg_lo:seg_hi], start, out=bounds[:-1])
        bounds[-1] = count
        return bounds, self._seghigh[seg_lo:seg_hi].astype(np.int64) << self.bits

    def __len__(self) -> int:
        return self.lows.shape[0]

    def decoded(self) -> CscIndex:
        """This index with its scores and rows decoded into memory (8 bytes a posting; the vocabulary
        table stays mapped): for small indexes, where decoding each query's postings costs more
        than holding them decoded (:data:`~sorl_verl.retrieval.bm25_search.DECODE_POSTINGS`)."""
        return CscIndex(*self.csc(), self.term_id)

    def csc(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(data, indices, indptr)``: the layout-1 arrays this index decodes to, ``(nnz,)`` float32,
        ``(nnz,)`` int32, ``(vocab + 1,)`` int64 (for comparisons: O(nnz) memory)."""
        nnz = len(self.lows)
        counts = np.diff(np.append(self._segstart, nnz))
        rows = fmt.decode_rows(self._seghigh.astype(np.int64) << self.bits, counts, self.lows).astype(np.int32)
        idf = np.repeat(self._idf.astype(np.float64), np.diff(self._indptr))
        return fmt.scores_of(idf, self.factors[self.codes]), rows, np.asarray(self._indptr)


def read_index(folder: Path, mmap: bool) -> tuple[dict, CscIndex | SegmentedIndex]:
    """``(params, index)`` of a BM25 folder, of either layout (``params["layout"]``, absent: 1)."""
    params_path = folder / fmt.PARAMS_FILE
    try:
        params = json.loads(params_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise IndexFormatError(f"{params_path}: cannot read the BM25 parameters ({e}); rebuild the index") from None
    if params.get("method") != "lucene" or (folder / "nonoccurrence_array.index.npy").exists():
        raise IndexFormatError(f"{params_path}: expected a bm25s 'lucene' index, got {params.get('method')!r}")
    layout = params.setdefault("layout", 1)
    if layout == 1:
        return params, CscIndex.load(folder, mmap)
    if layout == 2:
        return params, SegmentedIndex(folder, params, mmap)
    raise IndexFormatError(
        f"{params_path}: layout {layout!r}, this version reads layouts {fmt.LAYOUTS}; rebuild the index"
    )


Postings = ScoredPostings | CodedPostings
