"""Index builder: folder layout, overwrite refusal, atomicity, CLI."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from sorl_verl.retrieval import IndexFormatError, build_index, load_retriever
from sorl_verl.retrieval.build import main
from sorl_verl.retrieval.corpus import CorpusFormatError


def test_bm25_index_folder(small_corpus, small_docs, tmp_path):
    out = build_index(small_corpus, tmp_path / "idx", show_progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["method"] == "bm25" and meta["num_docs"] == len(small_docs)
    assert meta["tokenizer"]["stemmer"] == "english"
    assert (out / "bm25" / "params.index.json").is_file()
    docs = [json.loads(line) for line in (out / "docs.jsonl").read_text().splitlines()]
    assert docs == small_docs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "idx"]


def test_refuses_to_overwrite_unless_asked(small_corpus, small_docs, jsonl_writer, tmp_path):
    out = build_index(small_corpus, tmp_path / "idx", show_progress=False)
    before = (out / "docs.jsonl").read_text()
    with pytest.raises(FileExistsError, match="overwrite"):
        build_index(small_corpus, out, show_progress=False)
    assert (out / "docs.jsonl").read_text() == before

    jsonl_writer(small_corpus, small_docs[:2])
    build_index(small_corpus, out, overwrite=True, show_progress=False)
    assert len(load_retriever(out)) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl", "idx"]


def test_failed_build_leaves_nothing(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "contents": "fine"}\n{"id": "b"}\n')
    with pytest.raises(CorpusFormatError, match=r"corpus.jsonl:2: missing field 'contents'"):
        build_index(corpus, tmp_path / "idx", show_progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]


def test_failed_overwrite_keeps_old_index(small_corpus, small_docs, tmp_path):
    out = build_index(small_corpus, tmp_path / "idx", show_progress=False)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{oops\n")
    with pytest.raises(CorpusFormatError):
        build_index(bad, out, overwrite=True, show_progress=False)
    assert len(load_retriever(out)) == len(small_docs)


def test_load_rejects_non_index(tmp_path):
    with pytest.raises(IndexFormatError, match="meta.json is missing"):
        load_retriever(tmp_path)
    (tmp_path / "meta.json").write_text(
        json.dumps({"format": "sorl_verl.retrieval", "format_version": 99, "method": "bm25"})
    )
    with pytest.raises(IndexFormatError, match="rebuild the index"):
        load_retriever(tmp_path)


def test_cli_errors_exit_2(small_corpus, tmp_path, capsys):
    main([str(small_corpus), str(tmp_path / "idx"), "--quiet"])
    assert "built bm25 index" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_info:
        main([str(small_corpus), str(tmp_path / "idx"), "--quiet"])
    assert exit_info.value.code == 2
    assert "already exists" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--embedded", str(small_corpus), str(tmp_path / "x")])  # both sources given


def test_module_entry_point_builds_dense_hashing_index(small_corpus, small_docs, tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "sorl_verl.retrieval.build",
            str(small_corpus),
            str(tmp_path / "idx"),
            "--method",
            "dense",
            "--encoder",
            "hashing:64",
            "--faiss",
            "hnsw",
            "--quiet",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "RuntimeWarning" not in proc.stderr
    retriever = load_retriever(tmp_path / "idx")
    assert retriever.meta["faiss"]["type"] == "hnsw" and retriever.meta["encoder"] == {"kind": "hashing", "dim": 64}
    assert retriever.search([small_docs[4]["contents"]], topk=1)[0][0]["document"]["id"] == "cobra"


def test_embedded_index_is_built_once_into_the_cache(tmp_path, monkeypatch):
    from sorl_verl.retrieval import embedded_index

    monkeypatch.setenv("SORL_VERL_CACHE", str(tmp_path))
    first = embedded_index()
    assert first is embedded_index(tmp_path)
    (folder,) = tmp_path.iterdir()
    assert folder.name.startswith("wiki_vital_bm25_v1_") and (folder / "meta.json").is_file()
    assert len(first) == 10033
    assert first.search(["Painting by Georges Seurat"], topk=3)[0][0]["document"]["contents"].startswith(
        '"Georges Seurat"'
    )
