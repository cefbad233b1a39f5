"""Retrieval for Search-R1-style search agents: index builder, in-process retrievers, server.

Interface (what the agent loops and the quick start use)::

    retriever = load_retriever("indexes/wiki_bm25")     # BM25, dense or pyserini, from the folder's meta.json
    retriever = embedded_index()                         # BM25 of the shipped Wikipedia corpus
    hits = retriever.search(["who painted la grande jatte"], topk=3)
    hits[0][0] == {"document": {"id": "2", "contents": '"Title"\\ntext'}, "score": 12.3}

Document and reply shapes are Search-R1's (its ``retrieval_server.py``); the server in
:mod:`sorl_verl.retrieval.server` exposes the same ``search`` over HTTP.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Protocol, runtime_checkable

from sorl_verl.fileio import default_cache_dir
from sorl_verl.retrieval.store import FORMAT_VERSION, IndexFormatError, read_meta

__all__ = [
    "Retriever",
    "load_retriever",
    "build_index",
    "embedded_corpus_path",
    "embedded_index",
    "CorpusFormatError",
    "IndexFormatError",
]


def __getattr__(name: str):
    # Imported on first use, so that ``python -m sorl_verl.retrieval.build`` / ``.corpus`` do
    # not find their own module already imported by this package.
    if name == "build_index":
        from sorl_verl.retrieval.build import build_index

        return build_index
    if name in ("CorpusFormatError", "EMBEDDED_CORPUS", "embedded_corpus_path"):
        from sorl_verl.retrieval import corpus

        return getattr(corpus, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@runtime_checkable
class Retriever(Protocol):
    """Anything that searches a corpus.

    ``search(queries, topk)`` returns one list per query, best first, of
    ``{"document": {"id": str, "contents": str}, "score": float}`` with ``contents`` in
    Search-R1's form ``"\\"Title\\"\\ntext"``; at most ``topk`` hits per query (BM25 returns
    fewer when fewer documents share a term with the query). Implementations are read-only
    and safe to call from several threads.
    """

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]: ...


def load_retriever(
    index_dir: str | Path | None = None,
    *,
    faiss_index: str | Path | None = None,
    corpus: str | Path | None = None,
    encoder=None,
    **options,
) -> Retriever:
    """In-process retriever for an index folder built by :func:`build_index`, or for
    Search-R1's artifacts as they are: ``load_retriever(faiss_index="e5_Flat.index",
    corpus="wiki-18.jsonl", encoder="intfloat/e5-base-v2")`` (see
    :mod:`sorl_verl.retrieval.artifacts`; ``options`` go to its ``FaissArtifactRetriever``)."""
    if faiss_index is not None:
        if index_dir is not None:
            raise ValueError("give either an index folder or faiss_index=..., not both")
        from sorl_verl.retrieval.artifacts import load_faiss_artifacts

        return load_faiss_artifacts(faiss_index, corpus, encoder, **options)
    if index_dir is None:
        raise ValueError("give an index folder, or faiss_index=... with corpus=... and encoder=...")
    index_dir = Path(index_dir)
    meta = read_meta(index_dir)
    if meta["method"] == "bm25":
        from sorl_verl.retrieval.bm25_search import load_bm25

        return load_bm25(index_dir, meta)
    if meta["method"] == "pyserini":
        # needs pyserini and Java; PyseriniUnavailable (an ImportError) says what to install
        from sorl_verl.retrieval.lucene import load_lucene

        return load_lucene(index_dir, meta)
    from sorl_verl.retrieval.dense import load_dense

    return load_dense(index_dir, meta)


def embedded_index(cache_dir: str | Path | None = None) -> Retriever:
    """BM25 retriever of the embedded corpus, built once into ``cache_dir`` and then loaded.

    The cached folder's name carries a digest of the corpus file and the index format
    version, so a changed corpus or format gets a fresh index. Concurrent first calls are
    safe: each builds atomically and a loser of the race uses the winner's folder.
    """
    from sorl_verl.retrieval.corpus import embedded_corpus_path

    corpus = embedded_corpus_path()
    digest = hashlib.sha256(corpus.read_bytes()).hexdigest()[:12]
    index_dir = Path(cache_dir or default_cache_dir()) / f"wiki_vital_bm25_v{FORMAT_VERSION}_{digest}"
    return _load_or_build(str(index_dir), str(corpus))


@lru_cache(maxsize=4)
def _load_or_build(index_dir: str, corpus: str) -> Retriever:
    from sorl_verl.retrieval.build import build_index

    if not Path(index_dir).exists():
        try:
            build_index(corpus, index_dir, method="bm25", show_progress=False)
        except FileExistsError:
            pass  # another process finished first
    return load_retriever(index_dir)
