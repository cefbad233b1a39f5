"""Search-R1's published artifacts served as they are: a FAISS file whose id i is row i of a
memory-mapped corpus JSONL (sorl_verl.retrieval.artifacts). Everything is built here, offline."""

from __future__ import annotations

import json

import numpy as np
import pytest

from sorl_verl.retrieval import load_retriever
from sorl_verl.retrieval.artifacts import FaissArtifactRetriever
from sorl_verl.retrieval.corpus import CorpusFormatError, MmapCorpus, format_contents, iter_corpus
from sorl_verl.retrieval.dense import HashingEncoder
from sorl_verl.retrieval.store import IndexFormatError

faiss = pytest.importorskip("faiss")


def corpus_rows(n: int) -> list[dict]:
    return [
        {"id": str(i), "contents": format_contents(f"Title {i}", f"passage number {i} é ✓ " * (1 + i % 3))}
        for i in range(n)
    ]


def write_rows(path, rows, newline="\n", trailing=True) -> None:
    text = newline.join(json.dumps(r, ensure_ascii=False) for r in rows) + (newline if trailing else "")
    path.write_bytes(text.encode("utf-8"))


def search_r1_index(path, vectors: np.ndarray) -> None:
    """The index as Search-R1's index_builder.py writes it: index_factory 'Flat', inner product."""
    index = faiss.index_factory(vectors.shape[1], "Flat", faiss.METRIC_INNER_PRODUCT)
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))


def unit_rows(rng, n, dim) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


class TableEncoder:
    """Maps query text 'q<j>' to the test's vector j (what a real encoder does, without a model)."""

    def __init__(self, vectors: np.ndarray):
        self.vectors = vectors
        self.dim = vectors.shape[1]
        self.kinds = []

    def encode(self, texts, kind="passage", show_progress=False):
        self.kinds.append(kind)
        return self.vectors[[int(t[1:]) for t in texts]]


# ---- memory-mapped corpus -------------------------------------------------------------------


def test_mmap_corpus_random_access_equals_reading_the_file(tmp_path):
    rows = corpus_rows(300)
    rows[7] = {"id": "seven", "title": "Seven", "text": "a {title, text} row"}
    rows[8] = {"contents": "an integer id, fields in another order", "id": 8}
    rows[9] = {"id": "nine", "contents": "an extra field", "extra": [1, 2]}
    rows[10] = {"id": "ten", "contents": "contents win over title/text", "title": "T", "text": "x"}
    rows[11] = {"id": 10**30, "contents": "JSON that orjson refuses and json takes", "extra": float("nan")}
    path = tmp_path / "wiki.jsonl"
    body = "\n".join(json.dumps(r, ensure_ascii=False) for r in rows[:100])
    body += "\n\n   \n" + "\r\n".join(json.dumps(r, ensure_ascii=False) for r in rows[100:200]) + "\r\n"
    body += "\n".join(json.dumps(r, ensure_ascii=False) for r in rows[200:])  # no final newline
    path.write_bytes(body.encode("utf-8"))

    corpus = MmapCorpus(path, show_progress=False)
    expected = [{"id": d.id, "contents": d.contents} for d in iter_corpus(path)]
    assert len(corpus) == len(expected) == 300 and corpus.rebuilt
    order = np.random.default_rng(0).permutation(300)
    assert [corpus[i] for i in order] == [expected[i] for i in order]
    assert corpus[7] == {"id": "seven", "contents": '"Seven"\na {title, text} row'}
    for row, doc_id in (
        (8, "8"),
        (9, "nine"),
        (10, "ten"),
        (11, str(10**30)),
    ):  # always {"id": str, "contents": str}, in that order
        assert list(corpus[row].items()) == [("id", doc_id), ("contents", rows[row]["contents"])]
    assert corpus[0] is not corpus[0] and corpus[0] == corpus[0]  # a fresh dict each time
    table = tmp_path / "wiki.jsonl.offsets"
    assert (table / "offsets.npy").is_file() and json.loads((table / "meta.json").read_text())["num_rows"] == 300
    assert not MmapCorpus(path, show_progress=False).rebuilt  # built once, then reused
    with pytest.raises(IndexError, match="row 300 out of range"):
        corpus[300]


def test_mmap_corpus_rebuilds_its_table_when_the_corpus_changes(tmp_path):
    path = tmp_path / "c.jsonl"
    write_rows(path, corpus_rows(20))
    assert MmapCorpus(path, show_progress=False)[19]["id"] == "19"
    write_rows(path, corpus_rows(25)[5:])  # same row count, other bytes
    changed = MmapCorpus(path, show_progress=False)
    assert changed.rebuilt and changed[0]["id"] == "5" and changed[19]["id"] == "24"


def test_offset_table_goes_to_the_cache_when_the_corpus_folder_is_read_only(tmp_path, monkeypatch):
    from sorl_verl.retrieval import corpus as corpus_module

    monkeypatch.setenv("SORL_VERL_CACHE", str(tmp_path / "cache"))
    shared, prebuilt = tmp_path / "shared", tmp_path / "prebuilt"
    shared.mkdir()
    prebuilt.mkdir()
    write_rows(shared / "wiki.jsonl", corpus_rows(10))
    write_rows(prebuilt / "wiki.jsonl", corpus_rows(10))
    assert MmapCorpus(prebuilt / "wiki.jsonl", show_progress=False).offsets_dir == prebuilt / "wiki.jsonl.offsets"
    # as for a read-only folder (we run as root)
    monkeypatch.setattr(corpus_module.os, "access", lambda path, mode: False)
    corpus = MmapCorpus(shared / "wiki.jsonl", show_progress=False)
    assert corpus.rebuilt and corpus.offsets_dir.parent == tmp_path / "cache" / "corpus_offsets"
    assert not (shared / "wiki.jsonl.offsets").exists() and corpus[9]["id"] == "9"
    again = MmapCorpus(prebuilt / "wiki.jsonl", show_progress=False)  # a table beside it is still used
    assert not again.rebuilt and again.offsets_dir == prebuilt / "wiki.jsonl.offsets"


def test_truncated_corpus_gives_an_error_naming_the_file(tmp_path):
    path = tmp_path / "wiki-18.jsonl"
    write_rows(path, corpus_rows(50))
    MmapCorpus(path, show_progress=False)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 25])  # cut inside the last row
    with pytest.raises(CorpusFormatError, match=r"wiki-18\.jsonl: row 49 .*invalid JSON.*truncated"):
        MmapCorpus(path, show_progress=False)
    write_rows(path, corpus_rows(40))  # cut at a row boundary: only the row count can tell
    with pytest.raises(CorpusFormatError, match=r"wiki-18\.jsonl: 40 rows, but 50 were expected"):
        MmapCorpus(path, expected_rows=50, show_progress=False)


def test_mmap_corpus_refuses_gzip_empty_and_bad_rows(tmp_path):
    gz = tmp_path / "c.jsonl.gz"
    gz.write_bytes(b"")
    with pytest.raises(CorpusFormatError, match="gunzip"):
        MmapCorpus(gz, show_progress=False)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(CorpusFormatError, match="empty.jsonl: the corpus has no documents"):
        MmapCorpus(empty, show_progress=False)
    bad = tmp_path / "bad.jsonl"
    write_rows(bad, [*corpus_rows(3), {"id": "x"}])
    with pytest.raises(CorpusFormatError, match=r"bad\.jsonl: row 3 .*missing field 'contents'"):
        MmapCorpus(bad, show_progress=False)
    middle = tmp_path / "middle.jsonl"
    middle.write_text(json.dumps(corpus_rows(1)[0]) + "\n{not json\n" + json.dumps(corpus_rows(2)[1]) + "\n")
    corpus = MmapCorpus(middle, show_progress=False)  # only the first and last rows are checked on opening
    with pytest.raises(CorpusFormatError, match=r"middle\.jsonl: row 1 \(byte \d+\): invalid JSON"):
        corpus[1]
    typed = tmp_path / "typed.jsonl"
    write_rows(typed, [corpus_rows(1)[0], {"id": "x", "contents": 5}, {"id": 1.5, "contents": "c"}, corpus_rows(1)[0]])
    corpus = MmapCorpus(typed, show_progress=False)
    with pytest.raises(CorpusFormatError, match=r"typed\.jsonl: row 1 \(byte \d+\): field 'contents' must be a string"):
        corpus[1]
    with pytest.raises(CorpusFormatError, match=r"typed\.jsonl: row 2 \(byte \d+\): field 'id' must be a string"):
        corpus[2]


# ---- FAISS artifacts --------------------------------------------------------------------------


def test_faiss_artifacts_equal_brute_force_inner_product(tmp_path):
    rng = np.random.default_rng(1)
    docs, queries = unit_rows(rng, 80, 24), unit_rows(rng, 7, 24)
    rows = corpus_rows(80)
    write_rows(tmp_path / "wiki-18.jsonl", rows)
    search_r1_index(tmp_path / "e5_Flat.index", docs)
    encoder = TableEncoder(queries)

    retriever = load_retriever(
        faiss_index=tmp_path / "e5_Flat.index", corpus=tmp_path / "wiki-18.jsonl", encoder=encoder
    )
    assert isinstance(retriever, FaissArtifactRetriever) and len(retriever) == 80 and retriever.method == "dense"
    hits = retriever.search([f"q{j}" for j in range(7)], topk=5)
    assert encoder.kinds == ["query"]
    scores = queries @ docs.T  # (7, 80) brute force
    for j, query_hits in enumerate(hits):
        best = np.argsort(-scores[j], kind="stable")[:5]
        assert [h["document"] for h in query_hits] == [rows[i] for i in best]
        assert [h["score"] for h in query_hits] == pytest.approx(scores[j, best].tolist(), abs=1e-5)
    everything = retriever.search(["q0"], topk=500)[0]  # topk capped at the corpus size
    assert len(everything) == 80 and {h["document"]["id"] for h in everything} == {r["id"] for r in rows}
    assert retriever.search([], topk=3) == []


def test_artifact_mismatches_are_clear_errors(tmp_path):
    rng = np.random.default_rng(2)
    write_rows(tmp_path / "corpus.jsonl", corpus_rows(30))
    search_r1_index(tmp_path / "ip.index", unit_rows(rng, 31, 8))
    with pytest.raises(CorpusFormatError, match=r"corpus\.jsonl: 30 rows, but 31 were expected"):
        load_retriever(faiss_index=tmp_path / "ip.index", corpus=tmp_path / "corpus.jsonl", encoder="hashing:8")
    search_r1_index(tmp_path / "ip30.index", unit_rows(rng, 30, 8))
    with pytest.raises(
        IndexFormatError, match=r"ip30\.index: vectors of dimension 8, but encoder 'hashing:16' gives 16"
    ):
        load_retriever(faiss_index=tmp_path / "ip30.index", corpus=tmp_path / "corpus.jsonl", encoder="hashing:16")
    l2 = faiss.IndexFlatL2(8)
    l2.add(unit_rows(rng, 30, 8))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(IndexFormatError, match="not inner product"):
        load_retriever(faiss_index=tmp_path / "l2.index", corpus=tmp_path / "corpus.jsonl", encoder="hashing:8")
    (tmp_path / "junk.index").write_bytes(b"not faiss")
    with pytest.raises(IndexFormatError, match=r"junk\.index: not a FAISS index"):
        load_retriever(faiss_index=tmp_path / "junk.index", corpus=tmp_path / "corpus.jsonl", encoder="hashing:8")
    with pytest.raises(ValueError, match="needs its corpus"):
        load_retriever(faiss_index=tmp_path / "ip30.index", encoder="hashing:8")
    with pytest.raises(ValueError, match="needs the encoder"):
        load_retriever(faiss_index=tmp_path / "ip30.index", corpus=tmp_path / "corpus.jsonl")


# ---- Search-R1's layout end to end, with a tiny local e5-named encoder -----------------------


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory):
    """A random 2-layer BERT with a word-level vocabulary, saved in a folder named like e5."""
    torch = pytest.importorskip("torch")
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import BertConfig, BertModel, PreTrainedTokenizerFast

    words = sorted(
        {w for r in corpus_rows(40) for w in r["contents"].replace('"', " ").lower().split()}
        | {"query", "passage", ":", "which", "number"}
    )
    vocab = {w: i for i, w in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", *words])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)]
    )
    folder = tmp_path_factory.mktemp("models") / "tiny-e5-base"
    PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]", sep_token="[SEP]"
    ).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
    )
    BertModel(config).eval().save_pretrained(folder)
    return folder


def reference_encode(folder, texts: list[str]) -> np.ndarray:
    """Search-R1's encoding, written out here: mean over real tokens, then L2 normalisation."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True).eval()
    batch = tokenizer(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"][..., None].bool()
    pooled = hidden.masked_fill(~mask, 0.0).sum(1) / batch["attention_mask"].sum(1)[..., None]
    return torch.nn.functional.normalize(pooled, dim=-1).numpy()


def test_search_r1_layout_with_e5_prefixes(tmp_path, tiny_e5):
    rows = corpus_rows(40)
    write_rows(tmp_path / "wiki-18.jsonl", rows)
    docs = reference_encode(tiny_e5, [f"passage: {r['contents']}" for r in rows])
    search_r1_index(tmp_path / "e5_Flat.index", docs)
    questions = ["which passage number 3", "title 17", "passage"]
    queries = reference_encode(tiny_e5, [f"query: {q}" for q in questions])
    assert not np.allclose(queries, reference_encode(tiny_e5, questions), atol=1e-3)  # the prefix matters here

    retriever = load_retriever(
        faiss_index=str(tmp_path / "e5_Flat.index"), corpus=str(tmp_path / "wiki-18.jsonl"), encoder=str(tiny_e5)
    )
    assert not retriever.on_gpu  # faiss-cpu here
    hits = retriever.search(questions, topk=4)
    scores = queries @ docs.T
    for j, query_hits in enumerate(hits):
        best = np.argsort(-scores[j], kind="stable")[:4]
        assert [h["score"] for h in query_hits] == pytest.approx(scores[j, best].tolist(), abs=1e-4)
        assert [h["document"]["id"] for h in query_hits] == [rows[i]["id"] for i in best]


# ---- sorl-retriever --faiss-index -------------------------------------------------------------


def test_sorl_retriever_serves_search_r1_artifacts(tmp_path, monkeypatch, capsys, live_server_class):
    import httpx

    from sorl_verl.retrieval import server

    rows = corpus_rows(12)
    write_rows(tmp_path / "wiki-18.jsonl", rows)
    search_r1_index(tmp_path / "e5_Flat.index", HashingEncoder(32).encode([r["contents"] for r in rows]))
    served = {}
    monkeypatch.setattr(server, "serve", lambda app, host, port, **kw: served.update(app=app, port=port))
    server.main(
        [
            "--faiss-index",
            str(tmp_path / "e5_Flat.index"),
            "--corpus",
            str(tmp_path / "wiki-18.jsonl"),
            "--encoder",
            "hashing:32",
            "--faiss-gpu",
            "no",
            "--port",
            "8123",
        ]
    )
    assert served["port"] == 8123
    with live_server_class(served["app"]) as live:
        assert httpx.get(live.url + "/health").json()["num_docs"] == 12
        reply = httpx.post(
            live.url + "/retrieve",
            json={"queries": [rows[5]["contents"]], "topk": 2, "return_scores": True},
            timeout=30,
        ).json()
    assert reply["result"][0][0]["document"] == rows[5] and reply["result"][0][0]["score"] == pytest.approx(
        1.0, abs=1e-5
    )

    for argv, message in (
        (["--faiss-index", "x.index", "--corpus", "c.jsonl"], "needs --corpus"),
        (["--index", "folder", "--encoder", "hashing:8"], "go with --faiss-index"),
        (["--faiss-index", "x.index", "--index", "folder"], "not allowed with"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            server.main(argv)
        assert exit_info.value.code == 2 and message in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        server.main(
            [
                "--faiss-index",
                str(tmp_path / "missing.index"),
                "--corpus",
                str(tmp_path / "wiki-18.jsonl"),
                "--encoder",
                "hashing:32",
            ]
        )
    assert exit_info.value.code == 2 and "FAISS index file not found" in capsys.readouterr().err
