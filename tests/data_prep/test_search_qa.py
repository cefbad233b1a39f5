"""Search-R1 QA conversion: prompt template exactly as Search-R1's, row format, subsets, errors."""

import json

import pyarrow.parquet as pq
import pytest

from data_prep import search_qa
from data_prep._common import DataPrepError
from reward_fns import compute_score

# Typed from Search-R1's scripts/data_process/nq_search.py make_prefix(template_type="base"): the f-string's
# backslash-newlines join the sentences with single spaces; it ends with "Question: {question}\n".
SEARCH_R1_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you get "
    "new information. After reasoning, if you find you lack some knowledge, you can call a search engine by "
    "<search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the answer inside <answer> and </answer>, without detailed illustrations. For "
    "example, <answer> Beijing </answer>. Question: {q}\n"
)


def write_jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_nq_open_fixture_rows(fixtures, tmp_path):
    source = fixtures / "nq_open" / "NQ-open.dev.jsonl"
    raw = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    output = tmp_path / "nq.parquet"
    assert search_qa.main(["--input", f"nq={source}", "--split", "test", "--output", str(output)]) == 0
    rows = pq.read_table(output).to_pylist()
    assert len(rows) == len(raw) == 20
    for index, (row, record) in enumerate(zip(rows, raw, strict=True)):
        question = record["question"].strip()
        question = question if question.endswith("?") else question + "?"
        assert row["prompt"] == [{"role": "user", "content": SEARCH_R1_PROMPT.format(q=question)}]
        assert row["data_source"] == "nq" and row["agent_name"] == "search_r1"
        assert row["ability"] == "fact-reasoning"
        assert row["reward_model"] == {"style": "rule", "ground_truth": {"target": record["answer"]}}
        assert row["extra_info"]["split"] == "test" and row["extra_info"]["index"] == index
        assert row["extra_info"]["retrieval_query"] == question
        # The gold answer, in the agent format, scores 1 through the router.
        response = f"<think>known</think><answer> {record['answer'][0]} </answer>"
        assert (
            compute_score(row["data_source"], response, row["reward_model"]["ground_truth"], row["extra_info"])["score"]
            == 1.0
        )


def test_flashrag_format_and_training_mix(tmp_path):
    nq = write_jsonl(
        tmp_path / "nq.jsonl",
        [{"id": "train_0", "question": "  who wrote hamlet  ", "golden_answers": ["Shakespeare"]}],
    )
    hotpot = write_jsonl(
        tmp_path / "hotpot.jsonl",
        [
            {"id": "h0", "question": "Which is older, A or B?", "golden_answers": ["A"]},
            {"id": "h1", "question": "Who directed X", "golden_answers": ["Y", "Mr Y"]},
        ],
    )
    rows = search_qa.convert([("nq", nq), ("hotpotqa", hotpot)], split="train")
    assert [r["data_source"] for r in rows] == ["nq", "hotpotqa", "hotpotqa"]
    assert [r["extra_info"]["index"] for r in rows] == [0, 0, 1]  # per set, as Search-R1's with_indices
    assert rows[0]["prompt"][0]["content"] == SEARCH_R1_PROMPT.format(q="who wrote hamlet?")
    assert rows[1]["prompt"][0]["content"].endswith("Question: Which is older, A or B?\n")  # no second "?"
    assert rows[2]["reward_model"]["ground_truth"]["target"] == ["Y", "Mr Y"]
    assert rows[2]["extra_info"]["source_id"] == "h1"


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"question": "q", "golden_answers": ["a"]}\n{"question": "q2", "golden_answers": ', "line 2: malformed JSON"),
        ('{"golden_answers": ["a"]}', "line 1: field 'question': missing"),
        ('{"question": "   ", "answer": ["a"]}', "line 1: field 'question': empty"),
        ('{"question": "q"}', "line 1: field 'golden_answers': missing"),
        ('{"question": "q", "golden_answers": []}', "line 1: field 'golden_answers': no answer"),
        ('{"question": "q", "answer": {"x": 1}}', "line 1: field 'answer': expected a list"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line, encoding="utf-8")
    with pytest.raises(DataPrepError, match=message) as error:
        search_qa.convert([("nq", path)], split="test")
    assert str(path) in str(error.value)


def test_cli_errors_exit_nonzero_and_leave_no_output(tmp_path, capsys):
    from data_prep._common import run_cli

    output = tmp_path / "out.parquet"
    missing = tmp_path / "missing.jsonl"
    assert run_cli(search_qa.main, ["--input", f"nq={missing}", "--split", "test", "--output", str(output)]) == 2
    assert f"error: {missing}: file not found" in capsys.readouterr().err
    assert run_cli(search_qa.main, ["--input", f"squad={missing}", "--split", "t", "--output", str(output)]) == 2
    assert "unknown data source 'squad'" in capsys.readouterr().err
    assert not output.exists() and list(tmp_path.iterdir()) == []


def test_limit_and_sample_are_deterministic(fixtures):
    source = [("nq", fixtures / "nq_open" / "NQ-open.dev.jsonl")]
    first = search_qa.convert(source, "test", limit=5)
    assert [r["extra_info"]["question"] for r in first] == [
        r["extra_info"]["question"] for r in search_qa.convert(source, "test")[:5]
    ]
    sample_a = search_qa.convert(source, "test", sample=6, seed=3)
    sample_b = search_qa.convert(source, "test", sample=6, seed=3)
    sample_c = search_qa.convert(source, "test", sample=6, seed=4)
    assert sample_a == sample_b and len(sample_a) == 6
    assert [r["extra_info"]["question"] for r in sample_a] != [r["extra_info"]["question"] for r in sample_c]
    assert len(search_qa.convert(source, "test", sample=100, seed=0)) == 20  # capped at the set's size
    with pytest.raises(DataPrepError, match="exclude each other"):
        search_qa.convert(source, "test", limit=2, sample=2)


# Full public file (../shared/data), skipped when absent.
def test_nq_open_dev_full(shared_data, tmp_path):
    source = shared_data / "nq_open" / "NQ-open.dev.jsonl"
    output = tmp_path / "nq.parquet"
    assert search_qa.main(["--input", f"nq={source}", "--split", "test", "--output", str(output)]) == 0
    rows = pq.read_table(output).to_pylist()
    raw = [json.loads(line) for line in source.read_text(encoding="utf-8").splitlines()]
    assert len(rows) == len(raw) == 3610
    for row, record in zip(rows, raw, strict=True):
        question = record["question"].strip()
        question = question if question.endswith("?") else question + "?"
        assert row["prompt"][0]["content"] == SEARCH_R1_PROMPT.format(q=question)
        gold = row["reward_model"]["ground_truth"]
        assert gold["target"] == record["answer"]
        assert compute_score("nq", f"<answer>{record['answer'][-1]}</answer>", gold)["score"] == 1.0
