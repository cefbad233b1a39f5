"""BM25 retriever on ``bm25s`` (the embedded default: pure Python + numpy, no JVM).

Search-R1 uses Pyserini's Lucene BM25 for its sparse baseline; we keep Lucene's scoring
variant (``bm25s`` method ``"lucene"``, k1=0.9, b=0.4 as Pyserini's defaults) but not its
analyzer: text is lower-cased, split on ``\\b\\w\\w+\\b``, English stopwords removed and
Snowball-stemmed (PyStemmer). That choice is ours.

Index files (inside the index folder, next to ``meta.json`` and ``docs.jsonl``)::

    bm25/         bm25s's own ``BM25.save`` output: CSC score arrays, vocabulary, parameters

Scoring sums bm25s's precomputed per-(term, document) scores over the documents that contain a
query term (:meth:`BM25Retriever.score_matching`). Queries are tokenized here, by a pure
function of the saved vocabulary, instead of through a
``bm25s.tokenization.Tokenizer``: the Tokenizer memoises every word it sees, so in a
long-running server it would grow without bound and mutate shared state across threads.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path

import bm25s
import numpy as np
import Stemmer

from sorl_verl.retrieval.store import IndexFormatError, make_hits, read_docs

TOKEN_PATTERN = r"(?u)\b\w\w+\b"
DEFAULT_K1 = 0.9
DEFAULT_B = 0.4


def _stopwords(name: str | None) -> frozenset[str]:
    if not name:
        return frozenset()
    return frozenset(bm25s.tokenization._infer_stopwords(name))


def top_k_rows(scores: np.ndarray, k: int) -> np.ndarray:
    """Row indices of the ``k`` largest scores, best first; ties broken by lower row.

    scores: ``(num_docs,)``. Returns ``(min(k, num_docs),)`` int64.
    """
    k = min(k, scores.shape[0])
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    kth_largest = -np.partition(-scores, k - 1)[k - 1]
    above = np.flatnonzero(scores > kth_largest)
    tied = np.flatnonzero(scores == kth_largest)[: k - above.shape[0]]  # the lowest rows among the ties
    candidates = np.concatenate([above, tied])
    order = np.lexsort((candidates, -scores[candidates]))
    return candidates[order]


class BM25Retriever:
    """In-process BM25 search over an index folder (see :func:`build_bm25`).

    ``search`` returns only documents sharing at least one term with the query, so a query
    of stopwords or unknown words gets ``[]`` (as Pyserini's BM25 in Search-R1 does), and a
    query may get fewer than ``topk`` hits.
    """

    method = "bm25"

    def __init__(self, index_dir: str | Path, meta: dict, mmap: bool = False):
        index_dir = Path(index_dir)
        self.index_dir = index_dir
        self.meta = meta
        self._bm25 = bm25s.BM25.load(str(index_dir / "bm25"), mmap=mmap, load_corpus=False)
        if self._bm25.method != "lucene" or self._bm25.nonoccurrence_array is not None:
            raise IndexFormatError(f"{index_dir}: expected a bm25s 'lucene' index, got {self._bm25.method!r}")
        self._vocab: dict[str, int] = self._bm25.vocab_dict
        arrays = self._bm25.scores  # CSC matrix (num_docs x vocab) of per-(term, document) BM25 scores
        self._data, self._indices, self._indptr = arrays["data"], arrays["indices"], arrays["indptr"]
        self._local = threading.local()
        self._ids, self._contents = read_docs(index_dir, meta["num_docs"])
        tok = meta["tokenizer"]
        self._split = re.compile(tok["pattern"]).findall
        self._lower = tok["lower"]
        self._stopwords = _stopwords(tok["stopwords"])
        self._stemmer_language = tok["stemmer"]

    def __len__(self) -> int:
        return len(self._ids)

    def terms(self, text: str) -> list[str]:
        """The index's analysis of ``text``: lower-cased words minus stopwords, stemmed."""
        words = self._split(text.lower() if self._lower else text)
        words = [w for w in words if w not in self._stopwords]
        if self._stemmer_language:
            # A Stemmer object is not thread-safe, and it is cheap to create.
            words = Stemmer.Stemmer(self._stemmer_language).stemWords(words)
        return words

    def query_token_ids(self, query: str) -> list[int]:
        """Vocabulary ids of a query's terms (terms not in the corpus dropped)."""
        return [self._vocab[w] for w in self.terms(query) if w in self._vocab and w != ""]

    def score_matching(self, token_ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """BM25 scores of the documents containing at least one query term.

        Returns ``(rows, scores)``, both ``(num_matching,)``, rows ascending. A repeated query
        term counts once per occurrence (as in bm25s and Lucene). The sum runs over bm25s's
        precomputed per-(term, document) scores (CSC, one column per term); unlike
        ``bm25s.BM25.get_scores`` it reuses one zeroed buffer per thread and hands only the
        touched documents to top-k selection, which is what matters on large corpora.
        """
        buffer = getattr(self._local, "buffer", None)
        if buffer is None:
            buffer = self._local.buffer = np.zeros(len(self._ids), dtype=np.float32)
        for term in token_ids:  # a few terms per query; each slice is that term's posting list
            start, end = self._indptr[term], self._indptr[term + 1]
            buffer[self._indices[start:end]] += self._data[start:end]
        rows = np.flatnonzero(buffer)
        scores = buffer[rows]
        buffer[rows] = 0.0
        return rows, scores

    def search(self, queries: list[str], topk: int = 3) -> list[list[dict]]:
        if topk <= 0:
            raise ValueError(f"topk must be positive, got {topk}")
        results = []
        for query in queries:
            rows, scores = self.score_matching(self.query_token_ids(query))
            best = top_k_rows(scores, topk)  # rows ascending, so ties still go to the lower row
            results.append(make_hits(self._ids, self._contents, rows[best], scores[best]))
        return results


def build_bm25(
    contents: list[str],
    out_dir: Path,
    k1: float = DEFAULT_K1,
    b: float = DEFAULT_B,
    stemmer: str | None = "english",
    stopwords: str | None = "en",
    show_progress: bool = True,
) -> dict:
    """Write the BM25 files for ``contents`` (index order) into ``out_dir``; return meta fields."""
    tokenizer = bm25s.tokenization.Tokenizer(
        lower=True,
        splitter=TOKEN_PATTERN,
        stopwords=stopwords or [],
        stemmer=Stemmer.Stemmer(stemmer) if stemmer else None,
    )
    tokens = tokenizer.tokenize(contents, return_as="tuple", show_progress=show_progress)
    model = bm25s.BM25(k1=k1, b=b, method="lucene")
    model.index(tokens, show_progress=show_progress)
    model.save(str(out_dir / "bm25"), show_progress=False)
    return {
        "bm25": {"k1": k1, "b": b, "variant": "lucene", "vocab_size": len(model.vocab_dict)},
        "tokenizer": {"pattern": TOKEN_PATTERN, "lower": True, "stopwords": stopwords, "stemmer": stemmer},
    }


def load_bm25(index_dir: str | Path, meta: dict) -> BM25Retriever:
    return BM25Retriever(index_dir, meta)
