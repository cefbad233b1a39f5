"""BM25 at scale: the bounded-memory build equals bm25s's in-memory build, the streaming corpus
reader, the memory-mapped index and documents, and multi-threaded search."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from sorl_verl.retrieval import IndexFormatError, build_index, embedded_corpus_path, load_retriever
from sorl_verl.retrieval.bm25 import BM25_DIR, BM25Retriever, build_bm25, build_bm25_in_memory
from sorl_verl.retrieval.bm25_index import read_index
from sorl_verl.retrieval.build import main as sorl_index_main
from sorl_verl.retrieval.build import stream_corpus
from sorl_verl.retrieval.corpus import CorpusFormatError, iter_corpus
from sorl_verl.retrieval.quality import load_questions
from sorl_verl.retrieval.server import build_parser
from sorl_verl.retrieval.store import DOCS_NAME, write_docs, write_meta

# Documents bm25s treats specially: no words, only stopwords, one word many times, non-ASCII.
EDGE_DOCS = [
    {"id": "empty", "contents": ""},
    {"id": "punct", "contents": "?! -- ..."},
    {"id": "stop", "contents": "The and of it is was"},
    {"id": "repeat", "contents": " ".join(["seurat"] * 70_000)},  # a tf over 65535: uint32 postings in its chunk
    {"id": "unicode", "contents": '"Zürich"\nZürich ist die größte Stadt der Schweiz; 東京 is Tokyo.'},
]


@pytest.fixture(scope="module")
def corpus_rows():
    """1,500 embedded Wikipedia articles with the edge documents spread among them."""
    rows = [{"id": d.id, "contents": d.contents} for d in iter_corpus(embedded_corpus_path())][:1500]
    for i, doc in enumerate(EDGE_DOCS):
        rows.insert(97 + 301 * i, doc)
    return rows


@pytest.fixture(scope="module")
def corpus_file(corpus_rows, tmp_path_factory):
    corpus = tmp_path_factory.mktemp("scale_corpus") / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in corpus_rows), encoding="utf-8")
    return corpus


@pytest.fixture(scope="module")
def layout1_index(corpus_file, tmp_path_factory):
    """The corpus indexed by ``sorl-index`` in layout 1 (bm25s's files), small chunks and blocks."""
    out = tmp_path_factory.mktemp("scale_layout1") / "bounded"
    return build_index(corpus_file, out, show_progress=False, chunk_docs=128, block_postings=5_000, layout=1)


@pytest.fixture(scope="module")
def both_indexes(corpus_rows, corpus_file, tmp_path_factory):
    """The same corpus indexed by ``sorl-index`` (bounded build in its default layout 2, small chunks
    and blocks so that every code path runs many times) and, in the former layout, by bm25s's
    in-memory build."""
    root = tmp_path_factory.mktemp("scale")
    corpus = corpus_file
    bounded = build_index(corpus, root / "bounded", show_progress=False, chunk_docs=128, block_postings=5_000)
    legacy = root / "legacy"
    (legacy / BM25_DIR).mkdir(parents=True)
    contents = [r["contents"] for r in corpus_rows]
    method_meta = build_bm25_in_memory(contents, legacy, show_progress=False)
    write_docs(legacy, [r["id"] for r in corpus_rows], contents)
    shutil.rmtree(legacy / f"{DOCS_NAME}.offsets")  # the former layout had no offset table
    write_meta(legacy, {"method": "bm25", "num_docs": len(corpus_rows), "corpus": str(corpus), **method_meta})
    return bounded, legacy


def test_bounded_build_writes_the_same_arrays_as_bm25s(layout1_index, both_indexes):
    bounded, legacy = layout1_index / BM25_DIR, both_indexes[1] / BM25_DIR
    vocab = json.loads((bounded / "vocab.index.json").read_text(encoding="utf-8"))
    assert vocab == json.loads((legacy / "vocab.index.json").read_text(encoding="utf-8"))
    assert list(vocab.values()) == list(range(len(vocab))) and vocab[""] == 0
    params = json.loads((bounded / "params.index.json").read_text())
    assert params == json.loads((legacy / "params.index.json").read_text())
    for name in ("indptr", "indices"):
        ours, theirs = (np.load(folder / f"{name}.csc.index.npy") for folder in (bounded, legacy))
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs), name
    ours, theirs = (np.load(folder / "data.csc.index.npy") for folder in (bounded, legacy))
    assert ours.dtype == theirs.dtype == np.float32
    # The same float64 formula rounded once to float32: equal bits, not merely close values.
    assert np.array_equal(ours, theirs)
    assert not (bounded / ".postings").exists()


def test_bounded_index_searches_like_the_former_one(both_indexes, corpus_rows):
    bounded, legacy = (load_retriever(index) for index in both_indexes)
    assert bounded.meta["bm25"]["builder"] == "bounded" and len(bounded) == len(legacy) == len(corpus_rows)
    queries = [q.text for q in load_questions(embedded_corpus_path())[:300]] + ["zürich größte", "seurat", "the of"]
    ours, theirs = bounded.search(queries, topk=10), legacy.search(queries, topk=10)
    assert ours == theirs
    assert sum(len(hits) for hits in ours) > 2000
    assert ours[-2][0]["document"]["id"] == "repeat" and ours[-1] == []
    assert bounded.search(["zürich größte"], topk=1)[0][0]["document"] == EDGE_DOCS[4]


def test_former_index_without_offset_table_loads(both_indexes):
    _, legacy = both_indexes
    table = legacy / f"{DOCS_NAME}.offsets"
    if table.exists():  # an earlier test's load built it
        shutil.rmtree(table)
    first = load_retriever(legacy)
    assert first._docs.rebuilt is True and table.is_dir()  # built beside docs.jsonl on first load
    assert load_retriever(legacy)._docs.rebuilt is False
    assert first.search(["Painting by Georges Seurat"], topk=1)[0][0]["document"]["contents"].startswith('"')


def test_build_writes_the_offset_table_the_corpus_reader_accepts(both_indexes, corpus_rows):
    bounded, _ = both_indexes
    retriever = load_retriever(bounded)
    assert retriever._docs.rebuilt is False  # written by the build, not scanned on load
    rows = np.random.default_rng(0).integers(0, len(corpus_rows), 50)
    assert [retriever._docs[int(r)] for r in rows] == [corpus_rows[int(r)] for r in rows]


def test_threaded_search_equals_serial_search(both_indexes):
    queries = [q.text for q in load_questions(embedded_corpus_path())[300:700]]
    retriever = load_retriever(both_indexes[0])
    retriever.set_search_threads(1)
    serial = retriever.search(queries, topk=3)
    for threads in (2, 3, 8):
        retriever.set_search_threads(threads)
        assert retriever.search(queries, topk=3) == serial
        assert retriever.search(queries[:1], topk=3) == serial[:1]
    assert retriever.search([], topk=3) == []
    with pytest.raises(ValueError, match="search_threads"):
        retriever.set_search_threads(0)
    retriever.close()


def test_in_memory_arrays_search_like_mapped_ones(both_indexes):
    index = both_indexes[0]
    meta = json.loads((index / "meta.json").read_text())
    mapped = BM25Retriever(index, meta, mmap=True, decode_postings=0)  # layout 2's arrays, not decoded at load
    loaded = BM25Retriever(index, meta, mmap=False, search_threads=1, decode_postings=0)
    for array_ in (mapped._index.codes, mapped._index.lows, mapped._index._segstart, mapped._index._terms._slots):
        assert isinstance(array_.base, np.memmap) and not array_.flags.writeable
    for array_ in (loaded._index.codes, loaded._index.lows, loaded._index._segstart, loaded._index._terms._slots):
        assert not isinstance(array_, np.memmap) and not isinstance(array_.base, np.memmap)
    queries = [q.text for q in load_questions(embedded_corpus_path())[:100]]
    assert mapped.search(queries, topk=5) == loaded.search(queries, topk=5)


def test_build_reads_the_corpus_a_chunk_at_a_time(tmp_path):
    """Each chunk's postings are on disk before the next chunk is read (bounded memory)."""
    scratch = tmp_path / "bounded" / BM25_DIR / ".postings"
    texts = [f"document {i} mentions word{i % 37} and word{i % 11}" for i in range(1000)]

    def contents():
        for i, text in enumerate(texts):
            chunks_on_disk = len(list(scratch.glob("*.terms.npy")))
            assert chunks_on_disk == i // 100, (i, chunks_on_disk)
            yield text

    (tmp_path / "memory" / BM25_DIR).mkdir(parents=True)
    ours = build_bm25(contents(), tmp_path / "bounded", chunk_docs=100, block_postings=64, show_progress=False)
    theirs = build_bm25_in_memory(texts, tmp_path / "memory", show_progress=False)
    assert ours["bm25"]["vocab_size"] == theirs["bm25"]["vocab_size"] > 1000
    data = [read_index(tmp_path / kind / BM25_DIR, mmap=False)[1].csc()[0] for kind in ("bounded", "memory")]
    assert ours["bm25"]["postings"] == len(data[0]) and np.array_equal(*data)
    assert not scratch.exists()


def test_bad_and_duplicate_rows_give_iter_corpus_errors_and_no_index(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        '{"id": "0", "contents": "a b"}\n\n{"id": "1", "contents": "c d"}\n{"id": "0", "contents": "x"}\n'
    )
    with pytest.raises(CorpusFormatError, match=r"corpus.jsonl:4: field 'id' = '0' duplicates line 1"):
        build_index(corpus, tmp_path / "idx", show_progress=False)
    corpus.write_text('{"id": "0", "contents": "a b"}\n{"id": "1", "contents": 5}\n')
    with pytest.raises(CorpusFormatError, match=r"corpus.jsonl:2: field 'contents' must be a string"):
        list(stream_corpus(corpus))
    corpus.write_text("\n\n")
    with pytest.raises(CorpusFormatError, match="no documents"):
        build_index(corpus, tmp_path / "idx", show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]


def test_stream_corpus_equals_iter_corpus(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"title": "A", "text": "x"}\n\n{"id": 7, "contents": "y"}\n{"contents": "z"}\n')
    assert list(stream_corpus(corpus)) == list(iter_corpus(corpus))
    assert list(stream_corpus(embedded_corpus_path()))[-3:] == list(iter_corpus(embedded_corpus_path()))[-3:]


def test_truncated_docs_file_is_an_index_format_error(both_indexes, tmp_path):
    copy = Path(shutil.copytree(both_indexes[0], tmp_path / "copy"))
    docs = copy / DOCS_NAME
    docs.write_bytes(docs.read_bytes()[:-40])
    with pytest.raises(IndexFormatError, match=DOCS_NAME):
        load_retriever(copy)


def test_cli_options(small_corpus, tmp_path, capsys):
    sorl_index_main([str(small_corpus), str(tmp_path / "idx"), "--quiet", "--chunk-docs", "2", "--block-postings", "3"])
    assert "built bm25 index" in capsys.readouterr().out
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["bm25"]["chunk_docs"] == 2 and meta["num_docs"] == 6
    args = build_parser().parse_args(["--index", "x", "--search-threads", "3"])
    assert args.search_threads == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--index", "x", "--search-threads", "0"])


@pytest.mark.parametrize("seed", range(5))
def test_top_k_argmax_passes_equal_the_partition_path(seed):
    """Up to ARGMAX_TOPK, top_k_rows takes k argmax passes; both paths order by score, then lower row,
    and leave the scores as they were."""
    from sorl_verl.retrieval import bm25

    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 6, size=200).astype(np.float32) / 2  # many ties
    before = scores.copy()
    for k in range(1, bm25.ARGMAX_TOPK + 1):
        expected = np.lexsort((np.arange(200), -scores))[:k]
        assert bm25.top_k_rows(scores, k).tolist() == expected.tolist()
        assert np.array_equal(scores, before)
    assert bm25.top_k_rows(scores, 50).tolist() == np.lexsort((np.arange(200), -scores))[:50].tolist()


def test_blocked_top_k_equals_scoring_every_match(both_indexes):
    """Blocked search (small blocks here, so a query spans many) returns the documents and scores that
    scoring every matching document and taking its top k does."""
    from sorl_verl.retrieval import bm25

    retriever = load_retriever(both_indexes[0])
    retriever._block_edges = np.append(np.arange(0, len(retriever), 97, dtype=np.int64), len(retriever))
    questions = [q.text for q in load_questions(embedded_corpus_path())[:200]] + ["seurat", "the of", "zürich"]
    for query in questions:
        token_ids = retriever.query_token_ids(query)
        for k in (1, 3, bm25.ARGMAX_TOPK):
            rows, scores = retriever.score_matching(token_ids)
            best = bm25.top_k_rows(scores, k)
            got_rows, got_scores = retriever.top_k_blocked(token_ids, k)
            assert got_rows.tolist() == rows[best].tolist() and np.array_equal(got_scores, scores[best]), query
    assert not retriever._buffer().any()  # left zeroed for the next query


def test_every_top_k_path_equals_scoring_every_match(both_indexes, monkeypatch):
    """top_k's fast paths (the one-block window, the few-postings selection) and the blocked path give
    the documents, float32 scores and tie order of scoring every match and taking its top k; a corpus
    searched as one block and as many blocks gives the same answers."""
    from sorl_verl.retrieval import bm25, bm25_search

    one_block = load_retriever(both_indexes[0])
    many_blocks = load_retriever(both_indexes[0])
    many_blocks._block_edges = np.append(np.arange(0, len(many_blocks), 97, dtype=np.int64), len(many_blocks))
    assert len(one_block._block_edges) == 2 and len(many_blocks._block_edges) > 2
    questions = [q.text for q in load_questions(embedded_corpus_path())[:200]]
    questions += ["seurat", "the of", "zürich", "seurat seurat zürich", "unknownwordxyz", ""]
    paths = {
        "window": one_block._top_k_window,
        "sparse": many_blocks._top_k_sparse,
        "blocked": lambda spans, k, ids: many_blocks.top_k_blocked(ids, k),
    }
    used = {"sparse": 0, "blocked": 0}
    monkeypatch.setattr(bm25_search, "SPARSE_POSTINGS", 300)  # this small corpus: both multi-block paths taken
    for query in questions:
        token_ids = one_block.query_token_ids(query)
        spans = one_block._postings(token_ids)
        for k in (1, 3, bm25.ARGMAX_TOPK):
            rows, scores = one_block.score_matching(token_ids)
            best = bm25.top_k_rows(scores, k)
            expected = (rows[best].tolist(), scores[best])
            for name, path in paths.items():
                if not spans:
                    continue
                got_rows, got_scores = path(spans, k, token_ids) if name == "blocked" else path(spans, k)
                assert got_rows.dtype == np.int64 and got_scores.dtype == np.float32, name
                assert got_rows.tolist() == expected[0] and np.array_equal(got_scores, expected[1]), (name, query)
            got_rows, got_scores = many_blocks.top_k(token_ids, k)  # the dispatcher, as searches use it
            assert got_rows.tolist() == expected[0] and np.array_equal(got_scores, expected[1]), query
            if spans:
                used["sparse" if sum(map(len, spans)) <= bm25_search.SPARSE_POSTINGS else "blocked"] += 1
    assert used["sparse"] > 0 and used["blocked"] > 0  # both multi-block paths ran
    assert not one_block._buffer().any() and not many_blocks._buffer().any()  # left zeroed
    assert one_block.search(questions, topk=3) == many_blocks.search(questions, topk=3)
    monkeypatch.setattr(bm25_search, "SPARSE_POSTINGS", 1 << 30)  # every multi-block query through the sparse path
    assert one_block.search(questions, topk=5) == many_blocks.search(questions, topk=5)
    monkeypatch.setattr(bm25_search, "SPARSE_POSTINGS", 0)  # every multi-block query through the blocked path
    assert one_block.search(questions, topk=5) == many_blocks.search(questions, topk=5)
    monkeypatch.setattr(bm25_search, "SCATTER_GROUP_POSTINGS", 50)  # posting lists joined in groups, split, or alone
    for query in questions:
        token_ids = one_block.query_token_ids(query)
        spans = one_block._postings(token_ids)
        if spans:
            rows, scores = one_block.score_matching(token_ids)
            best = bm25.top_k_rows(scores, 3)
            for got_rows, got_scores in (one_block._top_k_window(spans, 3), many_blocks._top_k_sparse(spans, 3)):
                assert got_rows.tolist() == rows[best].tolist() and np.array_equal(got_scores, scores[best]), query
