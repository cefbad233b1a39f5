"""Building a BM25 index folder (:func:`build_bm25`, ours; :func:`build_bm25_in_memory`, bm25s's).

:func:`build_bm25` writes either layout of :mod:`.bm25_format` in two passes, in bounded memory.
Pass 1 tokenizes the documents in chunks (``chunk_docs``, 100k by default) and writes each chunk's
``(term, document, tf)`` postings, sorted by term, to disk; only the vocabulary, the document
frequencies (both O(vocabulary)), the document lengths (4 bytes a document) and the distinct
(tf, dl) pairs stay in memory. Pass 2 gathers the postings of blocks of terms (``block_postings``
at a time) from the chunk files in CSC order and appends their scores (layout 1) or codes, rows and
segments (layout 2) to the index files. Peak memory is O(chunk + vocabulary + block + 4 bytes x
documents), not O(corpus). Both passes read and write with plain file I/O, never a writable map, so
the build's resident memory is what it allocates. The scores equal ``bm25s.BM25.index``'s bit for
bit (the same float64 formula, rounded to float32 once; :func:`build_bm25_in_memory` keeps bm25s's
build, the reference the tests compare against).
"""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
from collections.abc import Iterable, Iterator
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from sorl_verl.progress import progress
from sorl_verl.retrieval import bm25_format as fmt

DEFAULT_CHUNK_DOCS = 100_000
DEFAULT_BLOCK_POSTINGS = 8_000_000


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
    with open(folder / fmt.DATA_FILE, "wb") as data_file, open(folder / fmt.INDICES_FILE, "wb") as indices_file:
        _npy_header(data_file, np.float32, (nnz,))
        _npy_header(indices_file, np.int32, (nnz,))
        for t0, t1, rows, tf in blocks:
            terms = np.repeat(np.arange(t0, t1), np.diff(indptr[t0 : t1 + 1]))
            fmt.scores_of(idf[terms], factors_of(tf, rows)).tofile(data_file)
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
    raw = {name: folder / f".{name}.raw" for name in (fmt.SEGHIGH_FILE, fmt.SEGSTART_FILE)}
    with (
        open(folder / fmt.CODES_FILE, "wb") as codes_file,
        open(folder / fmt.ROWS16_FILE, "wb") as rows_file,
        open(raw[fmt.SEGHIGH_FILE], "wb") as high_file,
        open(raw[fmt.SEGSTART_FILE], "wb") as start_file,
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
    np.save(folder / fmt.MAXCODE_FILE, max_codes)
    np.save(folder / fmt.SEGPTR_FILE, np.concatenate([[0], np.cumsum(seg_counts)]))
    _npy_from_raw(folder / fmt.SEGHIGH_FILE, raw[fmt.SEGHIGH_FILE], np.int32, segments)
    _npy_from_raw(folder / fmt.SEGSTART_FILE, raw[fmt.SEGSTART_FILE], np.int64, segments)
    return segments


def _write_term_table(vocab: dict[str, int], folder: Path, chunk_terms: int = 1 << 20) -> None:
    """Layout 2's vocabulary: ``termbytes`` and ``termptr`` (the terms' bytes in id order: ``vocab``'s
    order) and ``termslots`` (:func:`term_slots`, about 1.5 slots a term), ``chunk_terms`` at a time."""
    count = len(vocab)
    offsets = np.zeros(count + 1, dtype=np.int64)
    hashes = np.empty(count, dtype=np.uint64)
    raw = folder / f".{fmt.TERM_BYTES_FILE}.raw"
    terms = iter(vocab)
    with open(raw, "wb") as out:
        for start in range(0, count, chunk_terms):
            keys = [fmt.term_key(term) for term in itertools.islice(terms, chunk_terms)]
            hashes[start : start + len(keys)] = np.fromiter(map(fmt.term_hash, keys), dtype=np.uint64, count=len(keys))
            offsets[start + 1 : start + 1 + len(keys)] = offsets[start] + np.cumsum([len(key) for key in keys])
            out.write(b"".join(keys))
    _npy_from_raw(folder / fmt.TERM_BYTES_FILE, raw, np.uint8, int(offsets[-1]))
    np.save(folder / fmt.TERM_PTR_FILE, offsets)
    np.save(folder / fmt.TERM_SLOTS_FILE, fmt.term_slots(hashes, 1 << (count + count // 2).bit_length()))


def build_bm25(
    contents: Iterable[str],
    out_dir: Path,
    k1: float = fmt.DEFAULT_K1,
    b: float = fmt.DEFAULT_B,
    stemmer: str | None = "english",
    stopwords: str | None = "en",
    show_progress: bool = True,
    chunk_docs: int = DEFAULT_CHUNK_DOCS,
    block_postings: int = DEFAULT_BLOCK_POSTINGS,
    layout: int = fmt.DEFAULT_LAYOUT,
    segment_bits: int = fmt.SEGMENT_BITS,
    uint16_codes: int = fmt.UINT16_CODES,
) -> dict:
    """Write the BM25 files for ``contents`` (index order, any iterable: read once, a chunk at a
    time) into ``out_dir/bm25``, in ``layout`` 2 (ours) or 1 (bm25s's); return meta fields. Bounded
    memory (module docstring); the scratch folder ``out_dir/bm25/.postings`` is removed when done.
    Layout 2 only: ``segment_bits`` (1..16) sets the segments' size, ``2**segment_bits`` documents
    (below 16 only to test many segments on small corpora); codes are uint16 up to ``uint16_codes``
    distinct (tf, dl) pairs (65,536: what uint16 holds; lower only for tests), uint32 beyond."""
    if chunk_docs < 1 or block_postings < 1:
        raise ValueError(f"chunk_docs and block_postings must be positive, got {chunk_docs}, {block_postings}")
    if layout not in fmt.LAYOUTS or not 1 <= segment_bits <= 16 or not 1 <= uint16_codes <= fmt.UINT16_CODES:
        raise ValueError(
            f"layout must be one of {fmt.LAYOUTS}, segment_bits in 1..16 and uint16_codes in 1..{fmt.UINT16_CODES}, "
            f"got {layout}, {segment_bits}, {uint16_codes}"
        )
    folder = out_dir / fmt.BM25_DIR
    scratch = folder / ".postings"
    scratch.mkdir(parents=True)
    term_ids = _TermIds(fmt.stopword_set(stopwords), stemmer)
    split = re.compile(fmt.TOKEN_PATTERN).findall
    chunk_files: list[Path] = []
    lengths: list[np.ndarray] = []
    df = np.zeros(1, dtype=np.int64)
    pairs = np.zeros(0, dtype=np.int64)  # layout 2: sorted distinct tf << 32 | dl of the postings
    num_docs = 0
    texts: list[str] = []
    stream = iter(contents)
    with progress(desc="BM25 pass 1/2: tokenize", unit=" docs", disable=not show_progress) as bar:
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
    np.save(folder / fmt.INDPTR_FILE, indptr)
    with progress(
        total=nnz, desc="BM25 pass 2/2: score", unit=" postings", unit_scale=True, disable=not show_progress
    ) as bar:
        blocks = _csc_blocks(chunk_files, indptr, _term_blocks(indptr, block_postings), bar)
        if layout == 1:
            # bm25s's formula and operation order in float64 (its tfc is float64), rounded once.
            def factors_of(tf, rows):
                return fmt.bm25_factors(tf.astype(np.float64), doc_lengths[rows], k1, b, avg_doc_len)

            _write_scores(blocks, folder, indptr, idf32.astype(np.float64), factors_of)
        else:
            code_dtype = np.uint16 if len(pairs) <= uint16_codes else np.uint32
            # The same formula on the distinct (tf, dl) pairs: layout 1's factors, value for value.
            dl = (pairs & 0xFFFFFFFF).astype(np.int32)
            factors = fmt.bm25_factors((pairs >> 32).astype(np.float64), dl, k1, b, avg_doc_len)

            def code_of(tf, rows):
                return np.searchsorted(pairs, (tf.astype(np.int64) << 32) | doc_lengths[rows])

            segments = _write_coded(blocks, folder, indptr, code_of, code_dtype, segment_bits, factors)
    shutil.rmtree(scratch)
    (folder / fmt.VOCAB_FILE).write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
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
        np.save(folder / fmt.IDF_FILE, idf32)
        np.save(folder / fmt.FACTORS_FILE, factors)
        _write_term_table(vocab, folder)
        params.update(layout=2, segment_bits=segment_bits, term_hash=fmt.TERM_HASH)
        layout_meta.update(
            segment_bits=segment_bits, factors=len(pairs), codes=np.dtype(code_dtype).name, segments=segments
        )
    (folder / fmt.PARAMS_FILE).write_text(json.dumps(params, indent=4), encoding="utf-8")
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
        "tokenizer": fmt.tokenizer_meta(stopwords, stemmer),
    }


def build_bm25_in_memory(
    contents: list[str],
    out_dir: Path,
    k1: float = fmt.DEFAULT_K1,
    b: float = fmt.DEFAULT_B,
    stemmer: str | None = "english",
    stopwords: str | None = "en",
    show_progress: bool = True,
) -> dict:
    """The former builder: bm25s's Tokenizer and ``BM25.index`` over the whole corpus in memory
    (4.3 GB peak at 1M synthetic passages, docs/retrieval.md). Kept as the reference
    :func:`build_bm25` is tested against."""
    tokenizer = bm25s.tokenization.Tokenizer(
        lower=True,
        splitter=fmt.TOKEN_PATTERN,
        stopwords=stopwords or [],
        stemmer=Stemmer.Stemmer(stemmer) if stemmer else None,
    )
    tokens = tokenizer.tokenize(contents, return_as="tuple", show_progress=show_progress)
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index(tokens, show_progress=show_progress)
    model.save(str(out_dir / fmt.BM25_DIR), show_progress=False)
    return {
        "bm25": {"k1": k1, "b": b, "variant": "lucene", "vocab_size": len(model.vocab_dict), "builder": "in_memory"},
        "tokenizer": fmt.tokenizer_meta(stopwords, stemmer),
    }
