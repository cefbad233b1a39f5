"""``--method pyserini`` (sorl_verl.retrieval.lucene): the adapter on fake searchers, the dependency
checks on a fake Java, and, where pyserini and Java are installed, a real Lucene index."""

from __future__ import annotations

import importlib.metadata
import json
import os
import sys
import types
from dataclasses import dataclass

import pytest

from sorl_verl.retrieval import IndexFormatError, build_index, load_retriever, lucene
from sorl_verl.retrieval.build import main
from sorl_verl.retrieval.lucene import (
    AnseriniSearcher,
    LuceneRetriever,
    PyseriniUnavailable,
    parse_java_version,
    require_pyserini,
    required_java,
)


@dataclass
class Hit:
    docid: str
    score: float


class FakeDocs:
    def __init__(self, rows):
        self.rows = rows
        self.closed = False

    def __getitem__(self, row):
        return dict(self.rows[row])

    def __len__(self):
        return len(self.rows)

    def close(self):
        self.closed = True


class FakeSearcher:
    """LuceneSearcher's interface over a fixed table query -> [(row, score)], recording the calls."""

    def __init__(self, table):
        self.table = table
        self.calls = []
        self.closed = False

    def search(self, q, k=10):
        self.calls.append(("search", q, k))
        return [Hit(str(row), score) for row, score in self.table.get(q, [])[:k]]

    def batch_search(self, queries, qids, k=10, threads=1):
        self.calls.append(("batch_search", tuple(queries), tuple(qids), k, threads))
        return {qid: self.search(q, k) for q, qid in zip(queries, qids, strict=True) if q in self.table}

    def close(self):
        self.closed = True


DOCS = [{"id": f"doc-{i}", "contents": f'"Title {i}"\ntext {i}'} for i in range(5)]
TABLE = {"alpha": [(3, 7.5), (0, 2.25), (4, 1.0), (1, 0.5)], "beta": [(2, 1.5)], "nothing": []}


def make_retriever(threads=1, table=TABLE, docs=DOCS):
    return LuceneRetriever(FakeSearcher(table), FakeDocs(docs), len(docs), where="fake", search_threads=threads)


def test_hits_become_search_r1_rows_best_first():
    retriever = make_retriever()
    (hits,) = retriever.search(["alpha"], topk=3)
    assert [h["document"]["id"] for h in hits] == ["doc-3", "doc-0", "doc-4"]
    assert hits[0] == {"document": {"id": "doc-3", "contents": '"Title 3"\ntext 3'}, "score": 7.5}
    assert all(type(h["score"]) is float for h in hits)
    assert retriever.method == "pyserini" and len(retriever) == 5


def test_topk_is_passed_and_enforced():
    retriever = make_retriever()
    assert [len(h) for h in retriever.search(["alpha", "beta"], topk=2)] == [2, 1]
    assert ("search", "alpha", 2) in retriever._searcher.calls

    class Overfull(FakeSearcher):  # a searcher that returns more than asked is cut to topk
        def search(self, q, k=10):
            return [Hit(str(r), s) for r, s in self.table.get(q, [])]

    over = LuceneRetriever(Overfull(TABLE), FakeDocs(DOCS), 5, search_threads=1)
    assert len(over.search(["alpha"], topk=1)[0]) == 1


def test_empty_results_and_empty_batch():
    retriever = make_retriever()
    assert retriever.search(["nothing", "unknown words", ""], topk=3) == [[], [], []]
    assert retriever.search([], topk=3) == []


def test_batch_search_over_threads_keeps_query_order():
    serial = make_retriever(threads=1)
    batched = make_retriever(threads=4)
    queries = ["beta", "nothing", "alpha", "unknown", "alpha"]
    assert batched.search(queries, topk=3) == serial.search(queries, topk=3)
    kinds = [call[0] for call in batched._searcher.calls]
    assert kinds[0] == "batch_search"
    assert batched._searcher.calls[0][4] == 4  # threads: min(search_threads, queries)
    assert [c[0] for c in serial._searcher.calls] == ["search"] * len(queries)
    # one query never goes through batch_search
    batched._searcher.calls.clear()
    batched.search(["alpha"], topk=3)
    assert [c[0] for c in batched._searcher.calls] == ["search"]


def test_docid_outside_the_docs_is_a_format_error():
    retriever = make_retriever(table={"q": [(9, 1.0)]})
    with pytest.raises(IndexFormatError, match=r"fake: Lucene document id '9' is not a row of docs.jsonl \(0..4\)"):
        retriever.search(["q"])

    class Named(FakeSearcher):
        def search(self, q, k=10):
            return [Hit("paris", 1.0)]

    named = LuceneRetriever(Named({}), FakeDocs(DOCS), 5, where="idx/lucene", search_threads=1)
    with pytest.raises(
        IndexFormatError, match="'paris' is not a row.*rebuild the index with sorl-index --method pyserini"
    ):
        named.search(["q"])


def test_bad_arguments():
    retriever = make_retriever()
    for topk in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="topk must be a positive integer"):
            retriever.search(["alpha"], topk=topk)
    with pytest.raises(TypeError, match="query 1 must be a string, got int"):
        retriever.search(["alpha", 3])
    for threads in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="search_threads must be a positive integer"):
            retriever.set_search_threads(threads)
    retriever.set_search_threads(3)
    assert retriever.search_threads == 3


def test_close_closes_searcher_and_docs():
    retriever = make_retriever()
    retriever.close()
    assert retriever._searcher.closed and retriever._docs.closed


def test_anserini_searcher_converts_java_results():
    class JavaList(list):
        def add(self, value):
            self.append(value)

    class Entry:
        def __init__(self, key, value):
            self.key, self.value = key, value

        def getKey(self):  # noqa: N802 (Java's name)
            return self.key

        def getValue(self):  # noqa: N802
            return self.value

    class JavaSearcher:
        def __init__(self):
            self.calls = []

        def set_bm25(self, k1, b):
            self.calls.append(("set_bm25", k1, b))

        def search(self, q, k):
            self.calls.append(("search", q, k))
            return (Hit("0", 1.0),)

        def batch_search(self, queries, qids, k, threads):
            self.calls.append(("batch_search", list(queries), list(qids), k, threads))
            entries = [Entry(qid, (Hit(qid, 2.0),)) for qid in qids]
            return types.SimpleNamespace(entrySet=lambda: types.SimpleNamespace(toArray=lambda: entries))

        def close(self):
            self.calls.append(("close",))

    java = JavaSearcher()
    searcher = AnseriniSearcher(java, JavaList)
    searcher.set_bm25(0.9, 0.4)
    assert searcher.search("q", 3) == [Hit("0", 1.0)]
    assert searcher.batch_search(["a", "b"], ["0", "1"], 3, 2) == {"0": [Hit("0", 2.0)], "1": [Hit("1", 2.0)]}
    searcher.close()
    assert java.calls == [
        ("set_bm25", 0.9, 0.4),
        ("search", "q", 3),
        ("batch_search", ["a", "b"], ["0", "1"], 3, 2),
        ("close",),
    ]


# ---------------------------------------------------------------- dependency checks


def test_java_version_rules():
    assert parse_java_version('openjdk version "17.0.15" 2025-04-15') == 17
    assert parse_java_version('java version "1.8.0_392"') == 8
    assert parse_java_version('openjdk version "21" 2023-09-19') == 21
    with pytest.raises(ValueError, match="no version"):
        parse_java_version("command not found")
    assert required_java("0.25.0") == 11 and required_java("0.22.1") == 11
    assert required_java("0.35.0") == 21 and required_java("1.6.0") == 21


@pytest.fixture
def fake_java(tmp_path, monkeypatch):
    """A fake pyjnius (jnius_config.env) pointing at a fake JAVA_HOME whose bin/java prints ``version``;
    returns a setter ``(pyserini_version, java_version_or_None)``. ``None``: no Java found."""
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)

    def configure(pyserini_version, java_version):
        java = home / "bin" / "java"
        java.write_text(f"#!/bin/sh\necho 'openjdk version \"{java_version}\" 2025-04-15' >&2\n")
        java.chmod(0o755)

        def get_java_setup(platform):
            if java_version is None:
                raise RuntimeError("Could not find your Java installed. Please set the JAVA_HOME env var.")
            return types.SimpleNamespace(get_javahome=lambda: str(home))

        env = types.ModuleType("jnius_config.env")
        env.get_java_setup = get_java_setup
        monkeypatch.setitem(sys.modules, "jnius_config", types.ModuleType("jnius_config"))
        monkeypatch.setitem(sys.modules, "jnius_config.env", env)

        def version(name):
            if name == "pyserini" and pyserini_version is not None:
                return pyserini_version
            raise importlib.metadata.PackageNotFoundError(name)

        monkeypatch.setattr(importlib.metadata, "version", version)
        require_pyserini.cache_clear()

    yield configure
    require_pyserini.cache_clear()


def test_missing_pyserini_says_what_to_install(fake_java, small_corpus, tmp_path, capsys):
    fake_java(None, "17.0.15")
    with pytest.raises(PyseriniUnavailable, match="pyserini, which is not installed") as err:
        require_pyserini()
    for needed in (
        "pip install 'sorl-verl[pyserini]'",
        "pip install --no-deps pyserini==0.25.0",
        "openjdk-17-jre-headless",
        "pyserini >= 0.35 needs Java 21",
    ):
        assert needed in str(err.value)
    assert isinstance(err.value, ImportError)  # sorl-retriever and sorl-index report ImportErrors as errors
    with pytest.raises(PyseriniUnavailable):
        build_index(small_corpus, tmp_path / "idx", method="pyserini", show_progress=False)
    assert not (tmp_path / "idx").exists()
    with pytest.raises(SystemExit) as exit_:
        main([str(small_corpus), str(tmp_path / "idx"), "--method", "pyserini", "--quiet"])
    assert exit_.value.code == 2
    assert "pip install --no-deps pyserini==0.25.0" in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()


def test_missing_java_says_what_to_install(fake_java):
    fake_java("0.25.0", None)
    with pytest.raises(PyseriniUnavailable, match="needs a Java runtime and found none.*apt-get install openjdk-17"):
        require_pyserini()


def test_java_too_old_for_the_pyserini_release(fake_java, tmp_path):
    fake_java("0.35.0", "17.0.15")
    with pytest.raises(
        PyseriniUnavailable,
        match=r"pyserini 0.35.0 needs Java >= 21, but .* is Java 17: "
        r"install pyserini==0.25.0",
    ):
        require_pyserini()
    fake_java("0.25.0", "1.8.0_392")
    with pytest.raises(PyseriniUnavailable, match="pyserini 0.25.0 needs Java >= 11, but .* is Java 8"):
        require_pyserini()
    fake_java("0.25.0", "17.0.15")
    assert require_pyserini() == {"pyserini": "0.25.0", "java": 17, "java_home": str(tmp_path / "jdk")}


def test_pyserini_index_folder_without_pyserini_fails_on_load(fake_java, tmp_path):
    (tmp_path / "idx").mkdir()
    meta = {"format": "sorl_verl.retrieval", "format_version": 1, "method": "pyserini", "num_docs": 1}
    (tmp_path / "idx" / "meta.json").write_text(json.dumps(meta))
    (tmp_path / "idx" / "lucene").mkdir()
    fake_java(None, "17.0.15")
    with pytest.raises(PyseriniUnavailable, match="pip install --no-deps pyserini==0.25.0"):
        load_retriever(tmp_path / "idx")


def test_openai_key_placeholder_only_when_unset_and_only_for_the_import(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with lucene._openai_key_placeholder():
        assert os.environ["OPENAI_API_KEY"]
    assert "OPENAI_API_KEY" not in os.environ
    monkeypatch.setenv("OPENAI_API_KEY", "")
    with lucene._openai_key_placeholder():
        assert os.environ["OPENAI_API_KEY"]
    assert os.environ["OPENAI_API_KEY"] == ""
    monkeypatch.setenv("OPENAI_API_KEY", "users-own-key")
    with lucene._openai_key_placeholder():
        assert os.environ["OPENAI_API_KEY"] == "users-own-key"
    assert os.environ["OPENAI_API_KEY"] == "users-own-key"


def test_collection_rows_are_spread_over_files(tmp_path):
    rows = lucene.write_collection((f"text {i}" for i in range(7)), tmp_path / "c", files=3)
    assert rows == 7
    parts = sorted((tmp_path / "c").iterdir())
    lines = [[json.loads(line) for line in p.read_text().splitlines()] for p in parts]
    assert [len(x) for x in lines] == [3, 2, 2]
    assert lines[1] == [{"id": "1", "contents": "text 1"}, {"id": "4", "contents": "text 4"}]


# ---------------------------------------------------------------- a real Lucene index


def _pyserini_skip_reason() -> str | None:
    try:
        require_pyserini()
    except PyseriniUnavailable as e:
        return f"pyserini or Java unavailable ({str(e)[:120]}...)"
    finally:
        require_pyserini.cache_clear()
    return None


needs_pyserini = pytest.mark.skipif(_pyserini_skip_reason() is not None, reason=str(_pyserini_skip_reason()))


@needs_pyserini
def test_real_lucene_index_builds_and_searches(small_corpus, small_docs, tmp_path):
    out = build_index(small_corpus, tmp_path / "idx", method="pyserini", show_progress=False, threads=2)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["method"] == "pyserini" and meta["num_docs"] == len(small_docs)
    assert (meta["k1"], meta["b"], meta["collection"]) == (0.9, 0.4, "JsonCollection")
    assert (out / "lucene").is_dir() and not (out / ".lucene_input").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "idx"]
    retriever = load_retriever(out)
    assert retriever.method == "pyserini" and len(retriever) == len(small_docs)
    queries = ["capital of France", "venomous snake", "largest planet", "the of and", ""]
    retriever.set_search_threads(1)
    serial = retriever.search(queries, topk=3)
    retriever.set_search_threads(2)
    batched = retriever.search(queries, topk=3)
    assert batched == serial
    assert serial[0][0]["document"]["id"] == "paris"
    assert serial[1][0]["document"] == {"id": "cobra", "contents": small_docs[4]["contents"]}
    assert serial[2][0]["document"]["id"] == "jupiter"
    assert serial[3] == [] and serial[4] == []  # Lucene's stopwords only; empty query
    for hits in serial[:3]:
        scores = [h["score"] for h in hits]
        assert scores == sorted(scores, reverse=True) and len(hits) <= 3
    assert [len(h) for h in retriever.search(queries[:1], topk=1)] == [1]
    retriever.close()


@needs_pyserini
def test_real_lucene_index_from_the_cli(small_corpus, tmp_path, capsys):
    main([str(small_corpus), str(tmp_path / "idx"), "--method", "pyserini", "--quiet", "--k1", "1.2", "--b", "0.75"])
    assert "built pyserini index" in capsys.readouterr().out
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert (meta["k1"], meta["b"], meta["build_threads"]) == (1.2, 0.75, 1)
    retriever = load_retriever(tmp_path / "idx")
    assert retriever.search(["Guido van Rossum"], topk=2)[0][0]["document"]["id"] == "python"


def test_failed_lucene_indexer_leaves_nothing_and_shows_its_output(fake_java, small_corpus, tmp_path, capsys):
    # The fake JAVA_HOME has no JVM (and CI has no pyserini), so the indexer's child process fails.
    fake_java("0.25.0", "17.0.15")
    with pytest.raises(RuntimeError, match=r"pyserini.index.lucene failed \(exit \d+\)"):
        build_index(small_corpus, tmp_path / "idx", method="pyserini", show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "jdk"]
    with pytest.raises(SystemExit) as exit_:
        main([str(small_corpus), str(tmp_path / "idx"), "--method", "pyserini", "--quiet"])
    assert exit_.value.code == 2 and "pyserini.index.lucene failed" in capsys.readouterr().err
    assert not (tmp_path / "idx").exists()
