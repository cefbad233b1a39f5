"""Every bad input or output path is one ``error: FILE: line N: ...`` line and exit 2, never a traceback:
invalid UTF-8, deep JSON, lone surrogates, unhashable or non-string answers, non-finite math answers,
empty inputs, an output that is a folder or cannot be written. The readers are fuzzed too."""

import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_prep import math as math_prep
from data_prep import medical, search_qa
from data_prep._common import run_cli

GOOD_QA = '{"question": "q", "golden_answers": ["a"]}\n'


def run_qa(tmp_path, content: bytes | str, output=None):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    output = output or tmp_path / "out" / "nq.parquet"
    return path, run_cli(search_qa.main, ["--input", f"nq={path}", "--split", "test", "--output", str(output)])


@pytest.mark.parametrize(
    "content, message",
    [
        (GOOD_QA.encode() + b'{"question": "q\xff"}\n', "line 2: not valid UTF-8 (byte 0xff)"),
        ("[" * 5000 + "]" * 5000, "line 1: malformed JSON (nested too deeply)"),
        ('{"question": ' + "9" * 5000 + "}", "line 1: malformed JSON"),
        ('{"question": "q\\ud800", "golden_answers": ["a"]}', "line 1: field 'question': contains a lone surrogate"),
        (
            '{"question": "q", "golden_answers": ["\\udfff"]}',
            "line 1: field 'golden_answers[0]': contains a lone surrogate",
        ),
        (
            '{"question": "q", "golden_answers": [true]}',
            "line 1: field 'golden_answers[0]': expected a non-empty string answer, got bool",
        ),
        (
            '{"question": "q", "golden_answers": [NaN]}',
            "line 1: field 'golden_answers[0]': expected a non-empty string answer, got float",
        ),
        (
            '{"question": "q", "answer": ["a", 3]}',
            "line 1: field 'answer[1]': expected a non-empty string answer, got int",
        ),
        (GOOD_QA + '{"question": "q", "golden_answers": [" "]}', "line 2: field 'golden_answers[0]': empty answer"),
        ("", "no records (the input is empty)"),
        ("\n\n  \n", "no records (the input is empty)"),
    ],
)
def test_bad_qa_input_is_one_located_error_and_exit_2(tmp_path, capsys, content, message):
    path, code = run_qa(tmp_path, content)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(f"error: {path}: ") and message in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_u2028_inside_a_string_is_not_a_line_break(tmp_path, capsys):
    _, code = run_qa(tmp_path, '{"question": "a\u2028b", "golden_answers": ["x\u2029y"]}\n')
    assert code == 0, capsys.readouterr().err


def test_bad_output_paths(tmp_path, capsys):
    folder = tmp_path / "folder.parquet"
    folder.mkdir()
    _, code = run_qa(tmp_path, GOOD_QA, output=folder)
    assert code == 2 and f"error: {folder}: is a directory" in capsys.readouterr().err
    blocker = tmp_path / "file"
    blocker.write_text("x")
    _, code = run_qa(tmp_path, GOOD_QA, output=blocker / "out.parquet")
    assert code == 2 and f"error: {blocker / 'out.parquet'}: cannot write" in capsys.readouterr().err
    if os.geteuid() != 0:  # root writes anywhere
        readonly = tmp_path / "readonly"
        readonly.mkdir(mode=0o500)
        _, code = run_qa(tmp_path, GOOD_QA, output=readonly / "out.parquet")
        assert code == 2 and "cannot write (Permission denied)" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder.parquet", "in.jsonl"] + (
        [] if os.geteuid() == 0 else ["readonly"]
    )


def test_limit_below_one_is_an_argparse_error(tmp_path, capsys):
    path = tmp_path / "in.jsonl"
    path.write_text(GOOD_QA)
    with pytest.raises(SystemExit) as caught:
        search_qa.main(
            ["--input", f"nq={path}", "--split", "t", "--output", str(tmp_path / "o.parquet"), "--limit", "0"]
        )
    assert caught.value.code == 2 and "must be >= 1" in capsys.readouterr().err


def mirage(tmp_path, medqa_rows=None, pubmedqa=None):
    root = tmp_path / "mirage"
    (root / "medqa").mkdir(parents=True)
    (root / "pubmedqa").mkdir()
    (root / "medqa" / "US_4options_test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in medqa_rows or []))
    (root / "pubmedqa" / "test_set.json").write_text(json.dumps(pubmedqa or {}))
    return root


MEDQA_OK = {"question": "q", "options": {"A": "a", "B": "b"}, "answer_idx": "A"}


@pytest.mark.parametrize(
    "name, medqa_rows, pubmedqa, message",
    [
        (
            "medqa",
            [MEDQA_OK, {**MEDQA_OK, "answer_idx": ["A"]}],
            None,
            "line 2: field 'answer_idx': ['A'] is not one of",
        ),
        ("medqa", [], None, "US_4options_test.jsonl: no records"),
        (
            "pubmedqa",
            None,
            {"1": {"QUESTION": "q", "final_decision": ["yes"]}},
            "entry 1: field 'final_decision': ['yes']",
        ),
        (
            "pubmedqa",
            None,
            {"1": {"QUESTION": "q\ud800", "final_decision": "yes"}},
            "entry 1: field 'QUESTION': contains a lone",
        ),
        ("pubmedqa", None, {}, "test_set.json: no records"),
    ],
)
def test_bad_mirage_rows(tmp_path, capsys, name, medqa_rows, pubmedqa, message):
    root = mirage(tmp_path, medqa_rows, pubmedqa)
    if pubmedqa is not None:  # json.dumps escapes the surrogate, as a hostile file would
        (root / "pubmedqa" / "test_set.json").write_text(json.dumps(pubmedqa))
    code = run_cli(medical.main, ["--mirage-dir", str(root), "--output-dir", str(tmp_path / "out"), "--datasets", name])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and message in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "answer", ["NaN", "Infinity", "-Infinity", "1e400", '"1e400"', '"nan"', '"inf"', "true", "null"]
)
def test_non_finite_or_non_answer_math_answers_are_refused(tmp_path, capsys, answer):
    path = tmp_path / "aime.jsonl"
    path.write_text('{"problem": "p", "answer": "34"}\n{"problem": "p2", "answer": ' + answer + "}\n")
    code = run_cli(
        math_prep.main, ["--input", f"aime2024={path}", "--split", "test", "--output", str(tmp_path / "o.parquet")]
    )
    err = capsys.readouterr().err
    assert code == 2 and f"error: {path}: line 2: field 'answer':" in err, err
    assert not (tmp_path / "o.parquet").exists()


def test_finite_numeric_math_answers_are_kept(tmp_path):
    path = tmp_path / "aime.jsonl"
    path.write_text(
        '{"problem": "p", "answer": 34}\n{"problem": "q", "answer": 2.5}\n{"problem": "r", "answer": "1e3"}\n'
    )
    rows = math_prep.convert([("aime2024", path)], "test")
    assert [r["reward_model"]["ground_truth"]["target"] for r in rows] == [["34"], ["2.5"], ["1e3"]]


fuzz_lines = st.lists(
    st.binary(max_size=40)
    | st.text(max_size=40).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | st.fixed_dictionaries(
        {"question": st.text(max_size=10)},
        optional={
            "golden_answers": st.lists(st.none() | st.booleans() | st.floats() | st.text(max_size=5)),
            "answer": st.text(max_size=5) | st.integers(),
        },
    ).map(lambda d: json.dumps(d).encode()),
    max_size=5,
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=fuzz_lines)
def test_fuzzed_inputs_write_rows_or_exit_2(tmp_path, lines):
    output = tmp_path / "fuzz.parquet"
    output.unlink(missing_ok=True)
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(lines))
    code = run_cli(search_qa.main, ["--input", f"nq={path}", "--split", "t", "--output", str(output)])
    assert code in (0, 2)
    assert output.exists() == (code == 0)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temp file left
