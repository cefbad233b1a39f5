"""BM25 index layout 2 (factor codes, 16-bit rows in segments, a memory-mapped vocabulary): the same
float32 scores, bit for bit, as layout 1 and bm25s's own build; the same answers on every top-k
path; many segments, uint32 codes, hash collisions, corrupt files; layout-1 indexes still load."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sorl_verl.retrieval import (
    IndexFormatError,
    bm25,
    bm25_format,
    bm25_index,
    bm25_search,
    build_index,
    embedded_corpus_path,
    load_retriever,
)
from sorl_verl.retrieval.build import main as sorl_index_main
from sorl_verl.retrieval.corpus import iter_corpus
from sorl_verl.retrieval.quality import load_questions
from sorl_verl.retrieval.store import read_meta


def coded(index: Path, prune: bool = False) -> bm25.BM25Retriever:
    """The retriever of ``index`` on its layout-2 arrays themselves (these test corpora are small enough
    to be decoded into memory at load otherwise; ``load_retriever`` passes no options to BM25), scoring
    every posting (``prune=False``: the paths these tests compare; MaxScore in test_bm25_maxscore.py)."""
    return bm25.BM25Retriever(index, read_meta(index), decode_postings=0, prune=prune)


EDGE_DOCS = [  # as in test_bm25_scale.py: no words, stopwords only, a tf over 65535, non-ASCII
    {"id": "empty", "contents": ""},
    {"id": "punct", "contents": "?! -- ..."},
    {"id": "stop", "contents": "The and of it is was"},
    {"id": "repeat", "contents": " ".join(["seurat"] * 70_000)},
    {"id": "unicode", "contents": '"Zürich"\nZürich ist die größte Stadt der Schweiz; 東京 is Tokyo.'},
]


def write_corpus(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """1,200 embedded articles with the edge documents among them."""
    rows = [{"id": d.id, "contents": d.contents} for d in iter_corpus(embedded_corpus_path())][:1200]
    for i, doc in enumerate(EDGE_DOCS):
        rows.insert(50 + 233 * i, doc)
    return write_corpus(tmp_path_factory.mktemp("layout2") / "corpus.jsonl", rows)


@pytest.fixture(scope="module")
def indexes(corpus, tmp_path_factory):
    """``{name: index folder}``: layout 1, layout 2 with 32-document segments (many per term), and
    layout 2 with uint32 codes (the fallback past ``uint16_codes`` factors), all small chunks and blocks."""
    root = tmp_path_factory.mktemp("layout2_indexes")
    small = {"show_progress": False, "chunk_docs": 100, "block_postings": 4_000}
    return {
        "layout1": build_index(corpus, root / "layout1", layout=1, **small),
        "segments32": build_index(corpus, root / "segments32", segment_bits=5, **small),
        "codes32": build_index(corpus, root / "codes32", segment_bits=7, uint16_codes=10, **small),
    }


QUERIES = [q.text for q in load_questions(embedded_corpus_path())[:60]] + [
    "seurat",
    "zürich größte 東京",
    "the of",
    "unknownwordxyz seurat",
    "",
]


def test_layout2_arrays_decode_to_layout1_and_bm25s_bit_for_bit(indexes, corpus, tmp_path):
    from sorl_verl.retrieval.store import write_docs, write_meta

    legacy = tmp_path / "legacy"
    (legacy / bm25.BM25_DIR).mkdir(parents=True)
    rows = [json.loads(line) for line in corpus.read_text(encoding="utf-8").splitlines()]
    meta = bm25.build_bm25_in_memory([r["contents"] for r in rows], legacy, show_progress=False)
    write_docs(legacy, [r["id"] for r in rows], [r["contents"] for r in rows])
    write_meta(legacy, {"method": "bm25", "num_docs": len(rows), "corpus": str(corpus), **meta})
    reference = coded(legacy)._index.csc()
    for name, index in indexes.items():
        retriever = coded(index)
        assert retriever.layout == (1 if name == "layout1" else 2)
        for ours, theirs in zip(retriever._index.csc(), reference, strict=True):
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), name  # equal bits, not close
    meta = {name: json.loads((index / "meta.json").read_text())["bm25"] for name, index in indexes.items()}
    assert meta["segments32"]["codes"] == "uint16" and meta["codes32"]["codes"] == "uint32"
    assert meta["codes32"]["factors"] == meta["segments32"]["factors"] > 10
    assert meta["segments32"]["segments"] > 2 * meta["segments32"]["vocab_size"]  # terms of many segments
    assert np.load(indexes["codes32"] / "bm25" / bm25.CODES_FILE).dtype == np.uint32


def test_every_path_of_layout2_answers_as_layout1(indexes, monkeypatch):
    """The one-block window, the sparse and the blocked paths, on block edges that are multiples of the
    segments and on edges inside them (97 documents), answer as layout 1: same rows, float32 scores,
    tie order; and as scoring every match."""
    reference = coded(indexes["layout1"])
    expected = {k: reference.search(QUERIES, topk=k) for k in (3, 10)}
    for name in ("segments32", "codes32"):
        one_block = coded(indexes[name])
        assert len(one_block._block_edges) == 2
        for k in (3, 10):
            assert one_block.search(QUERIES, topk=k) == expected[k], name
        bits = json.loads((indexes[name] / "meta.json").read_text())["bm25"]["segment_bits"]
        for step in (97, 4 << bits):
            blocked = coded(indexes[name])
            blocked._block_edges = np.append(np.arange(0, len(blocked), step, dtype=np.int64), len(blocked))
            for sparse in (0, 300, 1 << 30):  # every query blocked, some sparse, every query sparse
                monkeypatch.setattr(bm25_search, "SPARSE_POSTINGS", sparse)
                assert blocked.search(QUERIES, topk=3) == expected[3], (name, step, sparse)
            for query in QUERIES:
                token_ids = blocked.query_token_ids(query)
                rows, scores = blocked.score_matching(token_ids)
                best = bm25.top_k_rows(scores, 5)
                got_rows, got_scores = blocked.top_k_blocked(token_ids, 5)
                assert got_rows.tolist() == rows[best].tolist() and np.array_equal(got_scores, scores[best]), query
            assert not blocked._buffer().any()
        monkeypatch.setattr(bm25_search, "SPARSE_POSTINGS", 0)
        monkeypatch.setattr(bm25_search, "SCATTER_ALONE_POSTINGS", 1)  # every list through add_to in the window too
        blocked._block_edges = np.append(np.arange(0, len(blocked), 2 << bits, dtype=np.int64), len(blocked))
        for view in (0, 1 << 30):  # segments added one view at a time, or rows decoded first
            monkeypatch.setattr(bm25_index, "VIEW_SEGMENT_POSTINGS", view)
            assert one_block.search(QUERIES, topk=3) == expected[3], (name, view)
            assert blocked.search(QUERIES, topk=3) == expected[3], (name, view)
        monkeypatch.undo()


def test_more_than_65536_documents_span_several_16_bit_segments(tmp_path):
    """70,000 tiny documents at the default 16-bit segments: common terms have two segments, and all
    paths answer as layout 1."""
    words = [f"w{i}" for i in range(50)]
    rows = [
        {"id": str(i), "contents": f"{words[i % 50]} {words[i % 7]} n{i % 3}" + (f" d{i}" if i % 97 == 0 else "")}
        for i in range(70_000)
    ]
    corpus = write_corpus(tmp_path / "corpus.jsonl", rows)
    one, two = (build_index(corpus, tmp_path / f"l{v}", show_progress=False, layout=v) for v in (1, 2))
    layout1, layout2 = coded(one), coded(two)
    assert json.loads((two / "meta.json").read_text())["bm25"]["segment_bits"] == 16
    (n0,) = layout2.query_token_ids("n0")
    (postings,) = layout2._postings([n0])
    bounds, bases = postings.segments()
    assert bases.tolist() == [0, 1 << 16] and bounds.tolist() == [0, 21846, len(postings)]
    for ours, theirs in zip(layout2._index.csc(), layout1._index.csc(), strict=True):
        assert np.array_equal(ours, theirs)
    queries = ["n0", "n1 w3", "d65475 d65572 n2", "w1 w2 w3 w4", "d69937", "d97 n0 w5"]
    assert layout2.search(queries, topk=5) == layout1.search(queries, topk=5)
    for edges in ([0, 1 << 16, 70_000], [0, 40_000, 1 << 16, 70_000]):
        layout2._block_edges = np.array(edges, dtype=np.int64)
        for query in queries:
            ids = layout2.query_token_ids(query)
            rows, scores = layout1.score_matching(ids)
            best = bm25.top_k_rows(scores, 3)
            got_rows, got_scores = layout2.top_k_blocked(ids, 3)
            assert got_rows.tolist() == rows[best].tolist() and np.array_equal(got_scores, scores[best])


def test_vocabulary_table_finds_every_term_and_nothing_else(indexes):
    retriever = coded(indexes["segments32"])
    vocab = json.loads((indexes["segments32"] / "bm25" / bm25.VOCAB_FILE).read_text(encoding="utf-8"))
    table = retriever._index._terms
    assert all(table.get(term) == term_id for term, term_id in vocab.items())
    for missing in ("unknownwordxyz", "zürichx", "seura", "seurat ", "\ud800", "x" * 300):
        assert table.get(missing) is None
    assert retriever.query_token_ids("unknownwordxyz qqqzzz") == []
    assert retriever.search(["unknownwordxyz qqqzzz"], topk=3) == [[]]


def test_term_slots_probe_linearly_and_wrap_around():
    hashes = np.array([6, 6, 7, 1, 6, 14], dtype=np.uint64)  # homes in a table of 8: 6, 6, 7, 1, 6, 6
    slots = bm25.term_slots(hashes, 8)
    # 0 takes 6, 2 takes 7, 3 takes 1; then 1 wraps to 0, and 4 and 5 go past the taken 1 to 2 and 3.
    assert slots.tolist() == [1, 3, 4, 5, -1, -1, 0, 2]
    table = bm25.TermTable(
        slots,
        np.arange(0, 7, dtype=np.int64),
        np.frombuffer(b"abcdef", dtype=np.uint8),
        lambda key: {b"a": 6, b"b": 6, b"c": 7, b"d": 1, b"e": 6, b"f": 14}.get(key, 6),
    )
    assert [table.get(t) for t in "abcdef"] == [0, 1, 2, 3, 4, 5]
    assert table.get("g") is None  # probes 6, 7, 0, 1, 2, 3 (other terms), stops at the free slot 4
    with pytest.raises(ValueError, match="power of two"):
        bm25.term_slots(hashes, 6)


def test_colliding_hashes_still_find_the_exact_terms(small_corpus, tmp_path, monkeypatch):
    """With a hash that is the same for every term, each lookup walks the chain of all the others;
    only the stored bytes decide, so the answers are those of the real hash."""
    queries = ["capital city of France", "Guido van Rossum", "snake planet", "unknownwordxyz"]
    expected = coded(build_index(small_corpus, tmp_path / "real", show_progress=False)).search(queries, 6)
    monkeypatch.setattr(bm25_format, "term_hash", lambda key: 0)  # for the build and the lookups
    collided = coded(build_index(small_corpus, tmp_path / "collide", show_progress=False))
    assert collided.search(queries, topk=6) == expected and sum(map(len, expected)) >= 6
    vocab = json.loads((tmp_path / "collide" / "bm25" / bm25.VOCAB_FILE).read_text(encoding="utf-8"))
    slots = collided._index._terms._slots
    assert slots[: len(vocab)].tolist() == list(range(len(vocab))) and (slots[len(vocab) :] == -1).all()
    assert all(collided._index._terms.get(term) == term_id for term, term_id in vocab.items())
    assert collided._index._terms.get("unknownwordxyz") is None


@pytest.mark.parametrize(
    "name",
    [
        bm25.CODES_FILE,
        bm25.ROWS16_FILE,
        bm25.SEGSTART_FILE,
        bm25.SEGHIGH_FILE,
        bm25.TERM_SLOTS_FILE,
        bm25.TERM_BYTES_FILE,
    ],
)
def test_truncated_or_missing_layout2_file_is_an_index_format_error(indexes, tmp_path, name):
    copy = Path(shutil.copytree(indexes["segments32"], tmp_path / "copy"))
    path = copy / "bm25" / name
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 64])  # the header says more than the file holds
    with pytest.raises(IndexFormatError, match=name):
        coded(copy)
    np.save(path, np.load(indexes["segments32"] / "bm25" / name)[:-1])  # readable, one entry short
    with pytest.raises(IndexFormatError, match=name):
        coded(copy)
    path.write_bytes(b"not an npy file at all")
    with pytest.raises(IndexFormatError, match=name):
        coded(copy)
    path.unlink()
    with pytest.raises(IndexFormatError, match=f"{name} is missing"):
        coded(copy)


def test_unknown_layout_or_parameters_are_index_format_errors(indexes, tmp_path):
    copy = Path(shutil.copytree(indexes["segments32"], tmp_path / "copy"))
    params_path = copy / "bm25" / bm25.PARAMS_FILE
    params = json.loads(params_path.read_text())
    for change in ({"layout": 3}, {"segment_bits": 17}, {"term_hash": "md5"}):
        params_path.write_text(json.dumps({**params, **change}))
        with pytest.raises(IndexFormatError, match=bm25.PARAMS_FILE):
            coded(copy)


def test_layout1_index_loads_and_searches_as_layout2(indexes):
    """An index of the former layout (bm25s's files, a dict vocabulary) loads unchanged."""
    layout1 = coded(indexes["layout1"])
    assert layout1.layout == 1 and isinstance(layout1._index._vocab, dict)
    assert not (indexes["layout1"] / "bm25" / bm25.CODES_FILE).exists()
    assert layout1.search(QUERIES, topk=5) == coded(indexes["codes32"]).search(QUERIES, topk=5)


def test_sorl_index_builds_layout2_by_default(small_corpus, tmp_path):
    sorl_index_main([str(small_corpus), str(tmp_path / "two"), "--quiet"])
    sorl_index_main([str(small_corpus), str(tmp_path / "one"), "--quiet", "--bm25-layout", "1"])
    two, one = coded(tmp_path / "two"), coded(tmp_path / "one")
    assert (two.layout, one.layout) == (2, 1) and two.meta["bm25"]["layout"] == 2
    assert two.search(["capital city of France", "snake"], topk=6) == one.search(
        ["capital city of France", "snake"], topk=6
    )
    with pytest.raises(ValueError, match="layout"):
        bm25.build_bm25(["a b"], tmp_path / "x", layout=3, show_progress=False)


def test_small_layout2_index_is_decoded_at_load_and_answers_the_same(indexes):
    decoded, mapped = load_retriever(indexes["segments32"]), coded(indexes["segments32"])
    assert isinstance(decoded._index, bm25_index.CscIndex) and isinstance(mapped._index, bm25_index.SegmentedIndex)
    assert decoded.layout == mapped.layout == 2
    assert decoded.search(QUERIES, topk=3) == mapped.search(QUERIES, topk=3)
    assert decoded.search(QUERIES, topk=10) == mapped.search(QUERIES, topk=10)
