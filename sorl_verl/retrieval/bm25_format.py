"""The on-disk BM25 index: its two layouts, the analysis and scoring they encode, and the
vocabulary table of layout 2 (what the builder writes and the reader reads; :mod:`.bm25` is the facade).

Analysis and scoring: Search-R1 uses Pyserini's Lucene BM25 for its sparse baseline; we keep
Lucene's scoring variant (``bm25s`` method ``"lucene"``, k1=0.9, b=0.4 as Pyserini's defaults) but
not its analyzer: text is lower-cased, split on ``\\b\\w\\w+\\b``, English stopwords removed and
Snowball-stemmed (PyStemmer). That choice is ours.

Index files (inside the index folder, next to ``meta.json`` and ``docs.jsonl``), in one of two
layouts named by ``"layout"`` in ``bm25/params.index.json`` (absent: 1). Both give the same scores,
bit for bit. Layout 1 is ``bm25s.BM25.save``'s, so indexes of either builder load the same way::

    bm25/data.csc.index.npy      (nnz,) float32   per-(term, document) BM25 scores, CSC by term
    bm25/indices.csc.index.npy   (nnz,) int32     document row of each score
    bm25/indptr.csc.index.npy    (vocab + 1,)     int64 (int32 in older indexes): term t owns [indptr[t], indptr[t+1])
    bm25/vocab.index.json        {term: id}, "" first (the empty document's term), then first appearance
    bm25/params.index.json       k1, b, method "lucene", num_docs, ...

Layout 2 (ours, what :func:`~sorl_verl.retrieval.bm25_build.build_bm25` writes by default) stores
about 4 bytes a posting instead of 8 and a vocabulary that is memory-mapped instead of a ``dict``::

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
                                                       absent in indexes of earlier versions: then the
                                                       corpus's largest factor bounds every term)
    bm25/vocab.index.json        as in layout 1 (for other tools; the retriever does not read it)
    bm25/params.index.json       as in layout 1, plus "layout": 2, "segment_bits", "term_hash"

A posting's score is ``float32(float64(idf[t]) * factors[code])``: the build's float64 product,
rounded once, so equal to layout 1's stored float32 score (the factor depends on the document's
length and the term's count in it, not on the term). A term's postings are sorted by row and cut
into segments of equal ``row >> segment_bits`` (16: 65,536 documents a segment), so a row is stored
in 16 bits. A term is found by probing ``termslots`` from ``blake2b(term, 8 bytes) mod 2**m``
(linear probing) and comparing the stored bytes, so a lookup is exact.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import bm25s
import numpy as np

from sorl_verl.retrieval.store import IndexFormatError

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4
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


def stopword_set(name: str | None) -> frozenset[str]:
    """The stopwords of bm25s's list ``name`` (``"en"``, ...); none for ``None`` or ``""``."""
    if not name:
        return frozenset()
    return frozenset(bm25s.tokenization._infer_stopwords(name))


def tokenizer_meta(stopwords: str | None, stemmer: str | None) -> dict:
    """The ``tokenizer`` field of an index's ``meta.json``: the analysis it was built with (lower-cased
    words of :data:`TOKEN_PATTERN`, the stopword list ``stopwords``, the PyStemmer language
    ``stemmer``), which the retriever applies to queries."""
    return {"pattern": TOKEN_PATTERN, "lower": True, "stopwords": stopwords, "stemmer": stemmer}


def load_array(path: Path, mmap: bool, dtypes: tuple[str, ...]) -> np.ndarray:
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


def check_length(folder: Path, name: str, array_: np.ndarray, expected: int, what: str) -> None:
    if array_.shape[0] != expected:
        raise IndexFormatError(
            f"{folder / name}: {array_.shape[0]} entries, expected {expected} ({what}); rebuild the index"
        )


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
