"""Index builder: ``sorl-index`` / ``python -m sorl_verl.retrieval.build``.

::

    sorl-index CORPUS.jsonl[.gz] INDEX_DIR                       # BM25 (default)
    sorl-index CORPUS.jsonl INDEX_DIR --method dense --encoder bundled-minilm --faiss hnsw
    sorl-index --embedded INDEX_DIR                              # the shipped Wikipedia corpus

Builds are atomic: everything is written into a temporary sibling folder that is renamed to
``INDEX_DIR`` only when complete, so a failed or interrupted build leaves nothing behind. An
existing ``INDEX_DIR`` is never replaced unless ``--overwrite`` is given.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from sorl_verl.fileio import atomic_dir
from sorl_verl.retrieval import _cli
from sorl_verl.retrieval.corpus import CorpusFormatError, iter_corpus
from sorl_verl.retrieval.store import write_docs, write_meta

METHODS = ("bm25", "dense")


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
    ``stopwords``) or :func:`sorl_verl.retrieval.dense.build_dense` (``encoder``, ``faiss_type``,
    ``hnsw_m``, ``ef_construction``, ``ef_search``, ``batch_size``, ``max_length``).
    Raises ``FileExistsError`` if ``index_dir`` exists and ``overwrite`` is false, and
    :class:`~sorl_verl.retrieval.corpus.CorpusFormatError` for a malformed corpus line.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    corpus_path = Path(corpus_path)
    index_dir = Path(index_dir)
    if index_dir.exists() and not overwrite:
        raise FileExistsError(f"{index_dir} already exists; pass overwrite=True (--overwrite) to replace it")
    started = time.time()
    with atomic_dir(index_dir, overwrite=overwrite) as tmp_dir:
        docs = list(iter_corpus(corpus_path, show_progress=show_progress))
        ids = [d.id for d in docs]
        contents = [d.contents for d in docs]
        del docs
        if method == "bm25":
            from sorl_verl.retrieval.bm25 import build_bm25

            method_meta = build_bm25(contents, tmp_dir, show_progress=show_progress, **opts)
        else:
            from sorl_verl.retrieval.dense import build_dense

            method_meta = build_dense(contents, tmp_dir, show_progress=show_progress, **opts)
        write_docs(tmp_dir, ids, contents)
        write_meta(tmp_dir, {
            "method": method,
            "num_docs": len(ids),
            "corpus": str(corpus_path.resolve()),
            "build_seconds": round(time.time() - started, 2),
            **method_meta,
        })
    return index_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sorl-index", description="Build a BM25 or dense retrieval index from a Search-R1 corpus JSONL.")
    parser.add_argument("corpus", nargs="?", help="corpus .jsonl or .jsonl.gz: rows {id, contents} or {title, text}")
    parser.add_argument("index_dir", help="output folder (must not exist unless --overwrite)")
    parser.add_argument("--embedded", action="store_true", help="index the shipped Wikipedia corpus instead of CORPUS")
    parser.add_argument("--method", choices=METHODS, default="bm25")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing INDEX_DIR")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    bm25 = parser.add_argument_group("bm25")
    bm25.add_argument("--k1", type=_cli.float_in(0), default=0.9)
    bm25.add_argument("--b", type=_cli.float_in(0, 1), default=0.4)
    bm25.add_argument("--stemmer", default="english", help="PyStemmer language, or 'none'")
    bm25.add_argument("--stopwords", default="en", help="bm25s stopword list name, or 'none'")
    dense = parser.add_argument_group("dense")
    dense.add_argument("--encoder", default="bundled-minilm",
                       help="HF model name or folder (e5 models get query:/passage: prefixes), 'bundled-minilm', or 'hashing:DIM'")
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
        from sorl_verl.retrieval import embedded_corpus_path

        corpus = embedded_corpus_path()
    else:
        corpus = Path(args.corpus)
    if args.method == "bm25":
        opts = {"k1": args.k1, "b": args.b,
                "stemmer": None if args.stemmer == "none" else args.stemmer,
                "stopwords": None if args.stopwords == "none" else args.stopwords}
    else:
        opts = {"encoder": args.encoder, "faiss_type": args.faiss_type, "hnsw_m": args.hnsw_m,
                "ef_construction": args.ef_construction, "ef_search": args.ef_search,
                "batch_size": args.batch_size, "max_length": args.max_length}
    try:
        out = build_index(corpus, args.index_dir, method=args.method, overwrite=args.overwrite,
                          show_progress=not args.quiet, **opts)
    except (FileExistsError, FileNotFoundError, CorpusFormatError, ImportError) as e:
        print(f"sorl-index: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(f"built {args.method} index of {corpus} in {out}")


if __name__ == "__main__":
    main()
