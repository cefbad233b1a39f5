"""MaxScore search over layout 2 (sorl_verl/retrieval/maxscore.py): the same documents, float32 scores
and tie order as scoring every posting, on segments of many sizes, uint32 codes, repeated query terms,
exact ties, Zipf-distributed corpora and indexes without per-term bounds; and it reads fewer postings."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sorl_verl.retrieval import IndexFormatError, bm25, build_index, embedded_corpus_path
from sorl_verl.retrieval.corpus import iter_corpus
from sorl_verl.retrieval.quality import load_questions
from sorl_verl.retrieval.store import read_meta

SMALL = {"show_progress": False, "chunk_docs": 300, "block_postings": 5_000}


def retriever(index: Path, prune: bool, **options) -> bm25.BM25Retriever:
    """``index``'s layout-2 arrays as they are (never decoded at load), pruned or scoring every posting."""
    return bm25.BM25Retriever(index, read_meta(index), decode_postings=0, prune=prune, **options)


def write_corpus(path: Path, texts: list[str]) -> Path:
    path.write_text("".join(json.dumps({"id": str(i), "contents": t}) + "\n" for i, t in enumerate(texts)))
    return path


def zipf_texts(seed: int, docs: int, vocab: int = 400) -> list[str]:
    """Documents of 1 to 150 words drawn from a Zipf law over ``w0..w{vocab-1}``: frequent and rare
    terms, term counts from 1 to dozens, lengths that spread the BM25 factors."""
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, vocab + 1) ** 1.1
    p /= p.sum()
    return [" ".join(f"w{w}" for w in rng.choice(vocab, size=rng.integers(1, 150), p=p)) for _ in range(docs)]


def assert_same_answers(pruned: bm25.BM25Retriever, full: bm25.BM25Retriever, queries: list[str], ks) -> None:
    """Per query and k: MaxScore's rows and float32 scores equal scoring every match and taking its top k
    (rows ascending among equal scores), and the two retrievers' search results are equal."""
    for query in queries:
        ids = pruned.query_token_ids(query)
        rows, scores = full.score_matching(ids)
        for k in ks:
            best = bm25.top_k_rows(scores, k)
            got_rows, got_scores, stats = pruned._index.top_k_maxscore(ids, k)
            assert got_rows.dtype == np.int64 and got_scores.dtype == np.float32
            assert got_rows.tolist() == rows[best].tolist(), (query, k)
            assert np.array_equal(got_scores, scores[best]), (query, k)  # equal bits, not close
            assert stats.sum() <= 2 * sum(map(len, full._postings(ids)))
    for k in ks:
        assert pruned.search(queries, topk=k) == full.search(queries, topk=k)


@pytest.fixture(scope="module")
def wiki_indexes(tmp_path_factory):
    """1,500 embedded articles at segments of 32 documents (many per term), 1,024 (uint32 codes) and
    65,536 (one segment: the default), and the questions of the embedded corpus."""
    root = tmp_path_factory.mktemp("maxscore")
    texts = [d.contents for d in iter_corpus(embedded_corpus_path())][:1500]
    corpus = write_corpus(root / "corpus.jsonl", texts)
    return {
        "segments32": build_index(corpus, root / "s32", segment_bits=5, **SMALL),
        "codes32": build_index(corpus, root / "c32", segment_bits=10, uint16_codes=10, **SMALL),
        "default": build_index(corpus, root / "default", **SMALL),
    }


QUESTIONS = [q.text for q in load_questions(embedded_corpus_path())[:150]] + [
    "seurat",
    "the of",
    "",
    "unknownwordxyz",
    "seurat seurat seurat painting",  # a repeated term counts once per occurrence
    "film film album song band music record",
]


@pytest.mark.parametrize("name", ["segments32", "codes32", "default"])
def test_maxscore_answers_as_scoring_every_posting(wiki_indexes, name):
    pruned, full = retriever(wiki_indexes[name], True), retriever(wiki_indexes[name], False)
    assert pruned.prune and not full.prune
    assert_same_answers(pruned, full, QUESTIONS, ks=(1, 3, 10, 40))
    pruned.set_search_threads(3)
    assert pruned.search(QUESTIONS, topk=3) == full.search(QUESTIONS, topk=3)


@pytest.mark.parametrize("seed", range(3))
def test_maxscore_on_zipf_corpora_with_long_queries(tmp_path, seed):
    """Frequent terms with counts of dozens, rare ones, queries of 1 to 12 terms (some repeated)."""
    corpus = write_corpus(tmp_path / "corpus.jsonl", zipf_texts(seed, 2_500))
    index = build_index(corpus, tmp_path / "index", segment_bits=7, **SMALL)
    pruned, full = retriever(index, True), retriever(index, False)
    rng = np.random.default_rng(100 + seed)
    queries = [" ".join(f"w{w}" for w in rng.integers(0, 420, size=rng.integers(1, 13))) for _ in range(150)]
    assert_same_answers(pruned, full, queries, ks=(1, 3, 8, 25))


def test_ties_go_to_the_lower_row(tmp_path):
    """Copies of the same documents score the same: every path keeps the lowest rows, in row order,
    across segment edges (32 documents a segment)."""
    base = ["alpha beta gamma", "alpha alpha delta", "beta epsilon", "gamma gamma gamma alpha"]
    texts = [base[i % 4] if i % 3 else f"filler{i} words only" for i in range(600)]
    index = build_index(write_corpus(tmp_path / "corpus.jsonl", texts), tmp_path / "index", segment_bits=5, **SMALL)
    pruned, full = retriever(index, True), retriever(index, False)
    queries = ["alpha", "alpha beta", "gamma alpha delta", "beta epsilon gamma", "filler7 alpha", "delta delta"]
    assert_same_answers(pruned, full, queries, ks=(1, 3, 10, 100))
    rows, scores, _ = pruned._index.top_k_maxscore(pruned.query_token_ids("alpha beta"), 5)
    assert len(set(scores.tolist())) == 1 and rows.tolist() == sorted(rows.tolist())  # 5 equal scores, rows up


def test_maxscore_reads_a_fraction_of_the_postings(tmp_path):
    """A query of a rare term and frequent ones: once the top k hold the rare term's documents, the
    frequent terms are only probed, so far fewer postings are read (and seeks made) than exist."""
    texts = zipf_texts(7, 4_000, vocab=300)
    index = build_index(write_corpus(tmp_path / "corpus.jsonl", texts), tmp_path / "index", **SMALL)
    pruned = retriever(index, True)
    ids = pruned.query_token_ids("w0 w1 w2 w250")
    postings = sum(map(len, pruned._postings(ids)))
    _, _, (read, seeks) = pruned._index.top_k_maxscore(ids, 3)
    assert postings > 5_000 and read + seeks < postings / 4, (read, seeks, postings)


def test_each_terms_largest_code_is_stored(wiki_indexes):
    """maxcode.index.npy names, for each term, a code of its largest factor (checked on every term)."""
    for name in ("segments32", "codes32"):
        index = retriever(wiki_indexes[name], True)._index
        codes, indptr = np.asarray(index.codes), np.asarray(index._indptr)
        largest = np.maximum.reduceat(index.factors[codes], indptr[:-1][np.diff(indptr) > 0])
        stored = np.load(wiki_indexes[name] / "bm25" / bm25.MAXCODE_FILE)
        assert stored.dtype == codes.dtype and len(stored) == len(indptr) - 1
        assert np.array_equal(index.factors[stored[np.diff(indptr) > 0]], largest)


def test_index_without_maxcode_is_bounded_by_the_largest_factor(wiki_indexes, tmp_path):
    """A layout-2 index built before maxcode existed still searches exactly (looser bounds); a maxcode
    file of the wrong length is an IndexFormatError naming it."""
    copy = Path(shutil.copytree(wiki_indexes["segments32"], tmp_path / "old"))
    (copy / "bm25" / bm25.MAXCODE_FILE).unlink()
    pruned, full = retriever(copy, True), retriever(copy, False)
    assert pruned._index._max_codes is None
    assert_same_answers(pruned, full, QUESTIONS[:60], ks=(3,))
    np.save(copy / "bm25" / bm25.MAXCODE_FILE, np.zeros(5, dtype=np.uint16))
    with pytest.raises(IndexFormatError, match=bm25.MAXCODE_FILE):
        retriever(copy, True)
