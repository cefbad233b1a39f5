"""Index builder: ``sorl-index`` / ``python -m sorl_verl.retrieval.build``.

::

    sorl-index CORPUS.jsonl[.gz] INDEX_DIR                       # BM25 (default)
    sorl-index CORPUS.jsonl INDEX_DIR --method dense --encoder bundled-minilm --faiss hnsw
    sorl-index --embedded INDEX_DIR                              # the shipped Wikipedia corpus
    sorl-index CORPUS.jsonl INDEX_DIR --method pyserini          # Lucene BM25 (optional: pyserini + Java)

Builds are atomic: everything is written into a temporary sibling folder that is renamed to
``INDEX_DIR`` only when complete, so a failed or interrupted build leaves nothing behind. An
existing ``INDEX_DIR`` is never replaced unless ``--overwrite`` is given.

BM25 builds stream the corpus (ours): each document is written to ``docs.jsonl`` and handed to
:func:`sorl_verl.retrieval.bm25.build_bm25` as it is read, so no list of documents is held;
duplicate ids are found from a 64-bit hash per row (8 bytes a row, see :func:`stream_corpus`).
Dense builds read the corpus into memory (the encoder dominates their cost). Pyserini builds stream
the corpus the same way into ``docs.jsonl`` and a Lucene input collection, then run Pyserini's
indexer (:mod:`sorl_verl.retrieval.lucene`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from sorl_verl.fileio import atomic_dir
from sorl_verl.progress import progress
from sorl_verl.retrieval import _cli
from sorl_verl.retrieval.corpus import (
    CorpusFormatError,
    Document,
    _row_to_document,
    embedded_corpus_path,
    iter_corpus,
    open_text,
)
from sorl_verl.retrieval.store import METHODS, DocsWriter, write_docs, write_meta


def _reread_for_errors(path: Path) -> None:
    """Read ``path`` with :func:`iter_corpus`, which raises :class:`CorpusFormatError` naming the
    file, line and field of the first bad row or duplicate id; returns if there is none."""
    for _ in iter_corpus(path):
        pass


def stream_corpus(path: str | Path, show_progress: bool = False) -> Iterator[Document]:
    """The documents of :func:`iter_corpus`, in the same order and with the same errors, in memory
    that does not grow with the corpus but for 8 bytes a row: instead of a table of the ids seen,
    a 64-bit hash of each id is kept, and the hashes are checked for repeats after the last row.
    Any bad row, or a repeated hash, re-reads the file with :func:`iter_corpus` to raise its exact
    error (a hash collision between distinct ids, about 1e-5 at 21M rows, then passes)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"corpus file not found: {path}")
    hashes = array("q")
    where = str(path)
    with open_text(path) as f:
        for line in progress(f, desc=f"read {path.name}", unit=" docs", disable=not show_progress):
            if not line.strip():
                continue
            try:
                doc = _row_to_document(json.loads(line), where, len(hashes))
            except ValueError:  # invalid JSON or row: iter_corpus names the line and the field
                _reread_for_errors(path)
                raise RuntimeError(f"{path}: a row failed to parse once but not on re-reading") from None
            hashes.append(hash(doc.id))
            yield doc
    if not hashes or np.unique(np.frombuffer(hashes, dtype=np.int64)).size < len(hashes):
        _reread_for_errors(path)


def build_index(
    corpus_path: str | Path,
    index_dir: str | Path,
    method: str = "bm25",
    overwrite: bool = False,
    show_progress: bool = True,
    **opts,
) -> Path:
    """Build a ``method`` index of the corpus JSONL into ``index_dir``; returns ``index_dir``.

    ``opts`` go to :func:`sorl_verl.retrieval.bm25.build_bm25` (``k1``, ``b``, ``stemmer``,
    ``stopwords``, ``chunk_docs``, ``block_postings``, ``layout``), :func:`sorl_verl.retrieval.dense.build_dense`
    (``encoder``, ``faiss_type``, ``hnsw_m``, ``ef_construction``, ``ef_search``, ``batch_size``,
    ``max_length``) or :func:`sorl_verl.retrieval.lucene.build_lucene` (``k1``, ``b``, ``threads``).
    A pyserini build raises :class:`~sorl_verl.retrieval.lucene.PyseriniUnavailable` (an
    ``ImportError`` naming what to install) before reading the corpus when pyserini or Java is missing.
    Raises ``FileExistsError`` if ``index_dir`` exists and ``overwrite`` is false, and
    :class:`~sorl_verl.retrieval.corpus.CorpusFormatError` for a malformed corpus line.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    corpus_path = Path(corpus_path)
    index_dir = Path(index_dir)
    if index_dir.exists() and not overwrite:
        raise FileExistsError(f"{index_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    if method == "pyserini":
        from sorl_verl.retrieval.lucene import require_pyserini

        require_pyserini()  # before any work: the error says what to install
    started = time.time()
    with atomic_dir(index_dir, overwrite=overwrite) as tmp_dir:
        if method in ("bm25", "pyserini"):
            if method == "bm25":
                from sorl_verl.retrieval.bm25_build import build_bm25 as build_method
            else:
                from sorl_verl.retrieval.lucene import build_lucene as build_method

            with DocsWriter(tmp_dir) as docs_writer:

                def recorded_contents():
                    for doc in stream_corpus(corpus_path, show_progress=show_progress and method == "pyserini"):
                        docs_writer.write(doc.id, doc.contents)
                        yield doc.contents

                method_meta = build_method(recorded_contents(), tmp_dir, show_progress=show_progress, **opts)
            num_docs = docs_writer.count
        else:
            from sorl_verl.retrieval.dense import build_dense

            docs = list(iter_corpus(corpus_path, show_progress=show_progress))
            ids = [d.id for d in docs]
            contents = [d.contents for d in docs]
            del docs
            method_meta = build_dense(contents, tmp_dir, show_progress=show_progress, **opts)
            write_docs(tmp_dir, ids, contents)
            num_docs = len(ids)
        write_meta(
            tmp_dir,
            {
                "method": method,
                "num_docs": num_docs,
                "corpus": str(corpus_path.resolve()),
                "build_seconds": round(time.time() - started, 2),
                **method_meta,
            },
        )
    return index_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="sorl-index",
        description="Build a BM25, dense or Pyserini (Lucene BM25) retrieval index from a Search-R1 corpus JSONL.",
    )
    parser.add_argument("corpus", nargs="?", help="corpus .jsonl or .jsonl.gz: rows {id, contents} or {title, text}")
    parser.add_argument("index_dir", help="output folder (must not exist unless --overwrite)")
    parser.add_argument("--embedded", action="store_true", help="index the shipped Wikipedia corpus instead of CORPUS")
    parser.add_argument("--method", choices=METHODS, default="bm25")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing INDEX_DIR")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    bm25 = parser.add_argument_group("bm25 (--k1/--b also for pyserini)")
    bm25.add_argument("--k1", type=_cli.float_in(0), default=0.9)
    bm25.add_argument("--b", type=_cli.float_in(0, 1), default=0.4)
    bm25.add_argument("--stemmer", default="english", help="PyStemmer language, or 'none'")
    bm25.add_argument("--stopwords", default="en", help="bm25s stopword list name, or 'none'")
    bm25.add_argument(
        "--chunk-docs",
        type=_cli.POSITIVE_INT,
        default=100_000,
        help="documents tokenized per chunk (pass 1; memory grows with it)",
    )
    bm25.add_argument(
        "--block-postings",
        type=_cli.POSITIVE_INT,
        default=8_000_000,
        help="postings scored per block (pass 2; about 40 bytes each in memory)",
    )
    bm25.add_argument(
        "--bm25-layout",
        type=int,
        choices=(1, 2),
        default=2,
        help="index files: 2 (ours: about 4 bytes a posting, memory-mapped vocabulary) or 1 (bm25s's own, 8 bytes a posting)",
    )
    lucene = parser.add_argument_group(
        "pyserini (pip install 'sorl-verl[pyserini]' && pip install --no-deps pyserini==0.25.0; Java 11+)"
    )
    lucene.add_argument(
        "--lucene-threads",
        type=_cli.POSITIVE_INT,
        default=1,
        help="Anserini indexing threads (the input is split into as many files; Search-R1 uses 1)",
    )
    dense = parser.add_argument_group("dense")
    dense.add_argument(
        "--encoder",
        default="bundled-minilm",
        help="HF model name or folder (e5 models get query:/passage: prefixes), 'bundled-minilm', or 'hashing:DIM'",
    )
    dense.add_argument("--faiss", dest="faiss_type", choices=("flat", "hnsw"), default="flat")
    dense.add_argument("--hnsw-m", type=_cli.POSITIVE_INT, default=32)
    dense.add_argument("--ef-construction", type=_cli.POSITIVE_INT, default=200)
    dense.add_argument("--ef-search", type=_cli.POSITIVE_INT, default=128)
    dense.add_argument("--batch-size", type=_cli.POSITIVE_INT, default=64)
    dense.add_argument("--max-length", type=_cli.POSITIVE_INT, default=256)
    args = parser.parse_args(argv)

    if args.embedded == (args.corpus is not None):
        parser.error("give either CORPUS or --embedded")
    if args.embedded:
        corpus = embedded_corpus_path()
    else:
        corpus = Path(args.corpus)
    if args.method == "bm25":
        opts = {
            "k1": args.k1,
            "b": args.b,
            "stemmer": None if args.stemmer == "none" else args.stemmer,
            "stopwords": None if args.stopwords == "none" else args.stopwords,
            "chunk_docs": args.chunk_docs,
            "block_postings": args.block_postings,
            "layout": args.bm25_layout,
        }
    elif args.method == "pyserini":
        opts = {"k1": args.k1, "b": args.b, "threads": args.lucene_threads}
    else:
        opts = {
            "encoder": args.encoder,
            "faiss_type": args.faiss_type,
            "hnsw_m": args.hnsw_m,
            "ef_construction": args.ef_construction,
            "ef_search": args.ef_search,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
        }
    try:
        out = build_index(
            corpus, args.index_dir, method=args.method, overwrite=args.overwrite, show_progress=not args.quiet, **opts
        )
    except (FileExistsError, FileNotFoundError, CorpusFormatError, ImportError, RuntimeError) as e:
        print(f"sorl-index: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"built {args.method} index of {corpus} in {out}")


if __name__ == "__main__":
    main()
