"""Pyserini (Lucene) BM25 behind our index folder and retriever contract: ``--method pyserini``.

::

    sorl-index CORPUS.jsonl INDEX_DIR --method pyserini      # Lucene index + our docs.jsonl and meta.json
    sorl-retriever --index INDEX_DIR                          # served like any other index folder
    load_retriever("INDEX_DIR").search(["who painted ..."], topk=3)

Search-R1 and FlashRAG build their BM25 baseline with ``python -m pyserini.index.lucene
--collection JsonCollection --generator DefaultLuceneDocumentGenerator --threads 1`` and no
``--store*`` flag (their ``index_builder.py``), and search it with ``LuceneSearcher`` at Pyserini's
default BM25, k1=0.9, b=0.4. We build the same kind of index (same collection, generator, analyzer
and defaults; no positions, document vectors or raw documents are stored) with one difference of
layout (ours): the Lucene document id of corpus row ``i`` is the string ``"i"``, and the documents
(original ids and contents) are read from the index folder's memory-mapped ``docs.jsonl``, as
Search-R1's server does for an index without raw documents (``corpus[int(hit.docid)]``). So the
``lucene/`` folder is also usable by Search-R1's own server with the corpus beside it.

Index folder::

    meta.json       method "pyserini", num_docs, k1, b, pyserini and Java versions
    docs.jsonl      + docs.jsonl.offsets/ (as for BM25: row i = Lucene document "i")
    lucene/         the Lucene index written by Anserini's IndexCollection

Requirements (optional; not installed with sorl-verl): ``pip install 'sorl-verl[pyserini]'`` (pyjnius)
and ``pip install --no-deps pyserini==0.25.0`` (Pyserini's full requirements pull torch, spaCy,
nmslib, lightgbm..., none of which the Lucene BM25 path uses), and a Java runtime. Pyserini's
Anserini jar decides the Java version: 0.25.0 is Java 11 bytecode (runs on Debian 12's OpenJDK 17),
0.35.0 and later need Java 21. :func:`require_pyserini` checks both and says what to install.

Searching goes to Anserini's ``SimpleSearcher`` (the Java object that Pyserini's ``LuceneSearcher``
wraps) through ``pyserini.pyclass``, which needs pyjnius and the jar only; importing
``pyserini.search`` would also import faiss, torch, transformers, onnxruntime and openai (26 s as measured).
When that class is absent (a Pyserini whose Anserini renamed it) we fall back to ``LuceneSearcher``.
A batch of queries is searched by Anserini's ``batch_search`` on ``search_threads`` Java threads;
pyjnius holds the GIL during a call, so Python threads would not search in parallel.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

from sorl_verl.retrieval.store import IndexFormatError, open_docs

LUCENE_DIR = "lucene"
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4
PINNED_PYSERINI = "0.25.0"
INSTALL_HINT = (
    "pip install 'sorl-verl[pyserini]' && pip install --no-deps pyserini==0.25.0, and a Java runtime "
    "(Debian/Ubuntu: apt-get install openjdk-17-jre-headless; pyserini 0.25.0 runs on Java 11 to 17, "
    "pyserini >= 0.35 needs Java 21)"
)


class PyseriniUnavailable(ImportError):
    """pyserini, pyjnius or a suitable Java runtime is missing; the message says what to install."""


def required_java(pyserini_version: str) -> int:
    """The oldest Java major version that runs ``pyserini_version``'s Anserini jar: 11 before 0.35
    (class files version 55), 21 from 0.35 on (version 65). Measured on 0.22.1-0.25.0 and 0.35.0."""
    parts = [int(p) for p in re.findall(r"\d+", pyserini_version)[:2]] + [0, 0]
    return 11 if tuple(parts[:2]) < (0, 35) else 21


def parse_java_version(text: str) -> int:
    """The major version in ``java -version`` output: ``version "17.0.15"`` -> 17, ``"1.8.0_392"`` -> 8."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    if match is None:
        raise ValueError(f"no version in java -version output: {text.strip()[:200]!r}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


@lru_cache(maxsize=1)
def require_pyserini() -> dict:
    """Check that pyserini, pyjnius and a Java runtime pyserini can run on are present; returns
    ``{"pyserini": version, "java": major, "java_home": path}``. Raises :class:`PyseriniUnavailable`
    (an ``ImportError``) naming what to install. Starts no JVM (runs ``java -version``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pyserini_version = version("pyserini")
    except PackageNotFoundError:
        raise PyseriniUnavailable(f"--method pyserini needs pyserini, which is not installed: {INSTALL_HINT}") from None
    try:
        from jnius_config.env import get_java_setup
    except ImportError:
        raise PyseriniUnavailable(f"--method pyserini needs pyjnius, which is not installed: {INSTALL_HINT}") from None
    try:
        java_home = get_java_setup(sys.platform).get_javahome()
    except Exception as e:  # pyjnius raises RuntimeError, or fails on a broken JAVA_HOME
        raise PyseriniUnavailable(
            f"--method pyserini needs a Java runtime and found none ({e}): {INSTALL_HINT}"
        ) from None
    java = Path(java_home) / "bin" / "java"
    try:
        shown = subprocess.run([str(java), "-version"], capture_output=True, text=True, timeout=60)
        major = parse_java_version(shown.stderr + shown.stdout)
    except (OSError, subprocess.TimeoutExpired, ValueError) as e:
        raise PyseriniUnavailable(
            f"--method pyserini: cannot run {java} -version ({e}); set JAVA_HOME to a Java runtime: {INSTALL_HINT}"
        ) from None
    needed = required_java(pyserini_version)
    if major < needed:
        raise PyseriniUnavailable(
            f"pyserini {pyserini_version} needs Java >= {needed}, but {java_home} is Java {major}: "
            f"install pyserini=={PINNED_PYSERINI} (pip install --no-deps pyserini=={PINNED_PYSERINI}), "
            f"or a Java {needed} runtime and point JAVA_HOME at it"
        )
    return {"pyserini": pyserini_version, "java": major, "java_home": str(java_home)}


@contextmanager
def _openai_key_placeholder() -> Iterator[None]:
    """Pyserini (0.25 at least) builds an OpenAI client when ``pyserini.search`` is imported, for its
    OpenAI query encoder, and that client refuses to be built without ``OPENAI_API_KEY``. Nothing is
    sent to OpenAI by a Lucene search, so a placeholder is set for the import only, and only when the
    user has no key of their own; afterwards the environment is as it was."""
    if os.environ.get("OPENAI_API_KEY"):
        yield
        return
    previous = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = "placeholder-set-by-sorl-verl-for-the-pyserini-import"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop("OPENAI_API_KEY", None)
        else:
            os.environ["OPENAI_API_KEY"] = previous


class AnseriniSearcher:
    """Pyserini ``LuceneSearcher``'s ``search``/``batch_search``/``set_bm25``/``close`` on Anserini's
    ``SimpleSearcher`` (the Java object ``LuceneSearcher`` wraps, called the same way), without
    importing ``pyserini.search``. ``java_searcher``: an ``io.anserini.search.SimpleSearcher``;
    ``array_list``: ``java.util.ArrayList`` (pyjnius class)."""

    def __init__(self, java_searcher, array_list):
        self.object = java_searcher
        self._array_list = array_list

    def set_bm25(self, k1: float, b: float) -> None:
        self.object.set_bm25(float(k1), float(b))

    def search(self, q: str, k: int = 10) -> list:
        return list(self.object.search(q, int(k)))

    def batch_search(self, queries: list[str], qids: list[str], k: int = 10, threads: int = 1) -> dict:
        query_list, qid_list = self._array_list(), self._array_list()
        for query, qid in zip(queries, qids, strict=True):
            query_list.add(query)
            qid_list.add(qid)
        results = self.object.batch_search(query_list, qid_list, int(k), int(threads))
        return {entry.getKey(): list(entry.getValue()) for entry in results.entrySet().toArray()}

    def close(self) -> None:
        self.object.close()


def open_searcher(lucene_dir: str | Path, k1: float = DEFAULT_K1, b: float = DEFAULT_B):
    """A Lucene searcher of ``lucene_dir`` at BM25(k1, b): :class:`AnseriniSearcher`, or Pyserini's
    ``LuceneSearcher`` when Anserini has no ``SimpleSearcher``. Starts the JVM in this process."""
    require_pyserini()
    from pyserini.pyclass import JArrayList, autoclass

    try:
        java_class = autoclass("io.anserini.search.SimpleSearcher")
    except Exception:  # jnius.JavaException: class not found in this Anserini
        java_class = None
    if java_class is not None:
        searcher = AnseriniSearcher(java_class(str(lucene_dir)), JArrayList)
    else:
        with _openai_key_placeholder():
            from pyserini.search.lucene import LuceneSearcher
        searcher = LuceneSearcher(str(lucene_dir))
    searcher.set_bm25(float(k1), float(b))
    return searcher


def write_collection(contents: Iterable[str], folder: Path, files: int = 1) -> int:
    """Write ``contents`` as a Pyserini ``JsonCollection`` under ``folder``: ``{"id": "<row>",
    "contents": text}`` lines, row ``i`` into file ``i % files`` (Anserini indexes one file per
    thread). Returns the number of rows."""
    folder.mkdir(parents=True, exist_ok=True)
    outs = [open(folder / f"part{i:03d}.jsonl", "w", encoding="utf-8") for i in range(files)]
    rows = 0
    try:
        for rows, text in enumerate(contents, start=1):
            outs[(rows - 1) % files].write(
                json.dumps({"id": str(rows - 1), "contents": text}, ensure_ascii=False) + "\n"
            )
    finally:
        for out in outs:
            out.close()
    return rows


def build_lucene(
    contents: Iterable[str],
    index_dir: Path,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    threads: int = 1,
    show_progress: bool = True,
) -> dict:
    """Write a Lucene index of ``contents`` (row ``i`` = Lucene document ``"i"``) into
    ``index_dir/lucene`` with ``python -m pyserini.index.lucene`` (a child process: the JVM does not
    stay in this one); returns the method's meta.json fields. ``threads`` > 1 splits the input into
    as many files, which Anserini indexes in parallel. Raises :class:`PyseriniUnavailable` before
    reading anything when pyserini or Java is missing, ``RuntimeError`` with Anserini's output when
    the indexer fails."""
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive integer, got {threads!r}")
    versions = require_pyserini()
    index_dir = Path(index_dir)
    collection = index_dir / ".lucene_input"
    rows = write_collection(contents, collection, files=threads)
    if rows == 0:
        raise ValueError("the corpus has no documents")
    command = [
        sys.executable,
        "-m",
        "pyserini.index.lucene",
        "--collection",
        "JsonCollection",
        "--input",
        str(collection),
        "--index",
        str(index_dir / LUCENE_DIR),
        "--generator",
        "DefaultLuceneDocumentGenerator",
        "--threads",
        str(threads),
    ]
    env = {**os.environ, "JAVA_HOME": versions["java_home"]}
    # Anserini logs its progress: shown with show_progress, else kept for the error message.
    quiet = {} if show_progress else {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
    done = subprocess.run(command, env=env, text=True, **quiet)
    if done.returncode != 0:
        tail = (done.stdout or "")[-3000:]
        raise RuntimeError(f"pyserini.index.lucene failed (exit {done.returncode}): {' '.join(command)}\n{tail}")
    for part in collection.iterdir():
        part.unlink()
    collection.rmdir()
    return {
        "k1": float(k1),
        "b": float(b),
        "lucene_dir": LUCENE_DIR,
        "collection": "JsonCollection",
        "generator": "DefaultLuceneDocumentGenerator",
        "analyzer": "Anserini default English (Lucene StandardTokenizer, lower case, Lucene stopwords, Porter stemmer)",
        "build_threads": threads,
        "pyserini_version": versions["pyserini"],
        "java_version": versions["java"],
    }


class LuceneRetriever:
    """Search-R1 hits from a Lucene searcher and our memory-mapped ``docs.jsonl``.

    ``searcher``: anything with Pyserini ``LuceneSearcher``'s ``search(q, k) -> [hit]`` and
    ``batch_search(queries, qids, k, threads) -> {qid: [hit]}``, each hit with ``.docid`` (the row
    number as a string) and ``.score``. ``docs``: ``docs[row] -> {"id", "contents"}`` of length
    ``num_docs``. ``search`` returns, per query, at most ``topk`` ``{"document": {"id", "contents"},
    "score"}`` best first (fewer when fewer documents share a term with the query; none for an
    empty query). Safe to call from several threads (Lucene's searcher is).
    """

    method = "pyserini"

    def __init__(self, searcher, docs, num_docs: int, where: str = "Lucene index", search_threads: int | None = None):
        self._searcher = searcher
        self._docs = docs
        self._num_docs = int(num_docs)
        self._where = where
        self._lock = threading.Lock()
        from sorl_verl.retrieval.bm25_search import default_search_threads

        self.set_search_threads(default_search_threads() if search_threads is None else search_threads)

    def __len__(self) -> int:
        return self._num_docs

    def set_search_threads(self, threads: int) -> None:
        """Use ``threads`` (>= 1) Java threads per ``search`` call of several queries from now on."""
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"search_threads must be a positive integer, got {threads!r}")
        self.search_threads = threads

    def _row(self, docid) -> int:
        try:
            row = int(str(docid))
        except ValueError:
            row = -1
        if not 0 <= row < self._num_docs:
            raise IndexFormatError(
                f"{self._where}: Lucene document id {str(docid)!r} is not a row of docs.jsonl "
                f"(0..{self._num_docs - 1}); rebuild the index with sorl-index --method pyserini"
            )
        return row

    def _hits(self, hits, topk: int) -> list[dict]:
        out = []
        for hit in list(hits)[:topk]:
            doc = self._docs[self._row(hit.docid)]
            out.append({"document": {"id": doc["id"], "contents": doc["contents"]}, "score": float(hit.score)})
        return out

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        """One list per query, best first: ``{"document": {"id", "contents"}, "score"}``."""
        if isinstance(topk, bool) or not isinstance(topk, int) or topk <= 0:
            raise ValueError(f"topk must be a positive integer, got {topk!r}")
        queries = list(queries)
        for i, query in enumerate(queries):
            if not isinstance(query, str):
                raise TypeError(f"query {i} must be a string, got {type(query).__name__}")
        threads = min(self.search_threads, len(queries))
        if threads <= 1:
            return [self._hits(self._searcher.search(query, topk), topk) for query in queries]
        qids = [str(i) for i in range(len(queries))]
        found = self._searcher.batch_search(queries, qids, topk, threads)
        return [self._hits(found.get(qid, []), topk) for qid in qids]

    def close(self) -> None:
        """Close the Lucene searcher and unmap ``docs.jsonl`` (the retriever is unusable afterwards)."""
        with self._lock:
            if hasattr(self._searcher, "close"):
                self._searcher.close()
            self._docs.close()


def load_lucene(index_dir: str | Path, meta: dict, search_threads: int | None = None) -> LuceneRetriever:
    """The retriever of an index folder built by ``sorl-index --method pyserini``."""
    index_dir = Path(index_dir)
    lucene_dir = index_dir / meta.get("lucene_dir", LUCENE_DIR)
    if not lucene_dir.is_dir():
        raise IndexFormatError(f"{lucene_dir} is missing; rebuild the index with sorl-index --method pyserini")
    searcher = open_searcher(lucene_dir, meta.get("k1", DEFAULT_K1), meta.get("b", DEFAULT_B))
    docs = open_docs(index_dir, meta["num_docs"])
    return LuceneRetriever(searcher, docs, meta["num_docs"], where=str(lucene_dir), search_threads=search_threads)
