"""Corpus reading, validation errors, and the Wikipedia summaries converter."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from sorl_verl.retrieval import embedded_corpus_path
from sorl_verl.retrieval.corpus import (
    CorpusFormatError,
    convert_wiki_summaries,
    format_contents,
    iter_corpus,
    main,
    split_contents,
    wiki_summaries_to_rows,
)

SHARED_SUMMARIES = (
    Path(__file__).resolve().parents[3] / "shared" / "data" / "wiki_vital_summaries" / "summaries_en.json"
)


def test_contents_round_trip():
    contents = format_contents("Dune (novel)", "Dune is a 1965 novel.\nSecond line.")
    assert contents == '"Dune (novel)"\nDune is a 1965 novel.\nSecond line.'
    assert split_contents(contents) == ("Dune (novel)", "Dune is a 1965 novel.\nSecond line.")


def test_reads_both_row_layouts_and_gzip(tmp_path):
    path = tmp_path / "c.jsonl.gz"
    rows = [
        {"id": "a", "contents": '"A"\ntext a'},
        {"title": "B", "text": "text b"},
        {"id": 7, "title": "C", "text": ""},
    ]
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n" + json.dumps(rows[2]) + "\n")
    docs = list(iter_corpus(path))
    assert [(d.id, d.contents) for d in docs] == [("a", '"A"\ntext a'), ("1", '"B"\ntext b'), ("7", '"C"\n')]


@pytest.mark.parametrize(
    "bad_line, message",
    [
        ("{not json", "invalid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"id": "x"}', "missing field 'contents'"),
        ('{"id": "x", "contents": 3}', "field 'contents' must be a string"),
        ('{"id": "x", "title": "T"}', "missing field 'text'"),
        ('{"id": "x", "title": "T", "text": null}', "field 'text' must be a string"),
        ('{"id": [1], "contents": "c"}', "field 'id' must be a string or an integer"),
        ('{"id": "0", "contents": "dup"}', "field 'id' = '0' duplicates line 1"),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, bad_line, message):
    path = tmp_path / "corpus.jsonl"
    path.write_text('{"id": "0", "contents": "ok"}\n{"id": "1", "contents": "ok"}\n' + bad_line + "\n")
    with pytest.raises(CorpusFormatError) as err:
        list(iter_corpus(path))
    assert f"{path}:3:" in str(err.value)
    assert message in str(err.value)


def test_empty_and_missing_corpus(tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(CorpusFormatError, match="no documents"):
        list(iter_corpus(empty))
    with pytest.raises(FileNotFoundError, match="corpus file not found"):
        list(iter_corpus(tmp_path / "nope.jsonl"))


def test_converter_rows_and_cli(tmp_path, capsys):
    summaries = {
        "Mercury (planet)": {
            "title": "Mercury (planet)",
            "extract": " Mercury is the first planet. ",
            "description": "Planet",
        },
        "Empty": {"title": "Empty", "extract": "", "description": "skipped"},
        "Tea": {"title": "Tea", "extract": "Tea is a drink.", "description": ""},
    }
    assert wiki_summaries_to_rows(summaries) == [
        {"id": "0", "contents": '"Mercury (planet)"\nMercury is the first planet.', "description": "Planet"},
        {"id": "1", "contents": '"Tea"\nTea is a drink.'},
    ]
    src = tmp_path / "s.json"
    src.write_text(json.dumps(summaries))
    main([str(src), str(tmp_path / "out.jsonl.gz")])
    assert "wrote 2 documents" in capsys.readouterr().out
    assert [d.id for d in iter_corpus(tmp_path / "out.jsonl.gz")] == ["0", "1"]
    src.write_text("[1, 2]")
    with pytest.raises(SystemExit) as exit_info:
        main([str(src), str(tmp_path / "bad.jsonl")])
    assert exit_info.value.code == 2
    assert not (tmp_path / "bad.jsonl").exists()


def test_embedded_corpus_shape():
    path = embedded_corpus_path()
    assert (path.parent / "ATTRIBUTION.md").is_file() and (path.parent / "LICENSE").is_file()
    assert "CC BY-SA 4.0" in (path.parent / "ATTRIBUTION.md").read_text()
    docs = list(iter_corpus(path))
    assert len(docs) == 10033
    title, text = split_contents(docs[2].contents)
    assert title == "A Sunday Afternoon on the Island of La Grande Jatte" and "Seurat" in text


@pytest.mark.skipif(not SHARED_SUMMARIES.is_file(), reason="shared data folder not present")
def test_embedded_corpus_is_the_converter_output(tmp_path):
    out = tmp_path / "wiki_vital.jsonl.gz"
    convert_wiki_summaries(SHARED_SUMMARIES, out)
    assert out.read_bytes() == embedded_corpus_path().read_bytes()
