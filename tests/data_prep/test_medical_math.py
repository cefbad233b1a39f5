"""Medical (MIRAGE) and math conversion on the fixtures: row format, letters, prompts, errors, atomic writes."""

import csv
import json
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from data_prep import math as math_prep
from data_prep import medical
from data_prep._common import DataPrepError, run_cli, write_parquet_atomic
from reward_fns import compute_score
from reward_fns._text import normalize_answer

# Our medical template, typed out independently of data_prep.templates.
MEDICAL_PROMPT = (
    "Answer the given multiple-choice question. You must conduct reasoning inside <think> and </think> first every "
    "time you get new information. After reasoning, if you find you lack some knowledge, you can call a search "
    "engine by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge needed, "
    "you can directly provide the letter of the correct option inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> C </answer>. Question: {q}\nOptions:\n{options}\n"
)
DAPO_PROMPT = (
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n{p}\n\n"
    'Remember to put your answer on its own line after "Answer:".'
)
EXPECTED_FIXTURE_ROWS = {"medqa": 12, "medmcqa": 12, "pubmedqa": 6, "mmlu_med": 18}


def expected_prompt(question, choices):
    options = "\n".join(f"{letter}. {text}" for letter, text in zip("ABCDEFGHIJ", choices, strict=False))
    return MEDICAL_PROMPT.format(q=question.strip(), options=options)


def check_medical_rows(rows, name):
    for index, row in enumerate(rows):
        info = row["extra_info"]
        letter = row["reward_model"]["ground_truth"]["target"]
        assert len(letter) == 1 and letter[0] in "ABCD"[: len(info["choices"])], (name, index)
        assert row["data_source"] == name and row["ability"] == "medical-mcqa" and info["index"] == index
        assert row["prompt"] == [{"role": "user", "content": expected_prompt(info["question"], info["choices"])}]
        assert info["retrieval_query"] == info["question"]  # the question only, never the options
        assert (
            compute_score(name, f"<answer>{letter[0]}</answer>", row["reward_model"]["ground_truth"], info)["score"]
            == 1.0
        )


def test_medical_fixtures(fixtures, tmp_path):
    assert medical.main(["--mirage-dir", str(fixtures / "mirage"), "--output-dir", str(tmp_path)]) == 0
    for name, count in EXPECTED_FIXTURE_ROWS.items():
        rows = pq.read_table(tmp_path / f"{name}.parquet").to_pylist()
        assert len(rows) == count
        check_medical_rows(rows, name)


def test_medical_fields_map_from_the_raw_files(fixtures):
    raw = json.loads((fixtures / "mirage/medqa/US_4options_test.jsonl").read_text().splitlines()[0])
    row = medical.convert("medqa", fixtures / "mirage")[0]
    assert row["extra_info"]["choices"] == [raw["options"][k] for k in "ABCD"]
    assert row["reward_model"]["ground_truth"]["target"] == [raw["answer_idx"]]

    raw = json.loads((fixtures / "mirage/medmcqa/dev.json").read_text().splitlines()[0])
    row = medical.convert("medmcqa", fixtures / "mirage")[0]
    assert row["extra_info"]["choices"] == [raw[k] for k in ("opa", "opb", "opc", "opd")]
    assert row["reward_model"]["ground_truth"]["target"] == ["ABCD"[raw["cop"] - 1]]  # cop is 1-based
    assert row["extra_info"]["source_id"] == raw["id"] and row["extra_info"]["split"] == "dev"

    raw = json.loads((fixtures / "mirage/pubmedqa/test_set.json").read_text())
    rows = medical.convert("pubmedqa", fixtures / "mirage")
    for row, (pmid, entry) in zip(rows, raw.items(), strict=True):
        assert row["extra_info"]["choices"] == ["yes", "no", "maybe"]
        assert row["reward_model"]["ground_truth"]["target"] == [
            {"yes": "A", "no": "B", "maybe": "C"}[entry["final_decision"]]
        ]
        assert row["extra_info"]["source_id"] == pmid
        assert entry["CONTEXTS"][0] not in row["prompt"][0]["content"]  # PubMedQA*: no contexts

    rows = medical.convert("mmlu_med", fixtures / "mirage")
    assert [r["extra_info"]["subject"] for r in rows[::3]] == list(medical.MMLU_MED_SUBJECTS)
    with open(fixtures / "mirage/mmlu_med/anatomy_test.csv", newline="", encoding="utf-8") as handle:
        first = next(csv.reader(handle))
    assert rows[0]["extra_info"]["choices"] == first[1:5] and rows[0]["reward_model"]["ground_truth"]["target"] == [
        first[5]
    ]


def copy_mirage(fixtures, tmp_path):
    shutil.copytree(fixtures / "mirage", tmp_path / "mirage")
    return tmp_path / "mirage"


def replace_line(path, number, transform):
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[number - 1] = transform(lines[number - 1])
    path.write_text("".join(lines), encoding="utf-8")


def test_medical_bad_input_names_file_line_and_field(fixtures, tmp_path):
    mirage = copy_mirage(fixtures, tmp_path)
    medmcqa = mirage / "medmcqa/dev.json"
    replace_line(medmcqa, 3, lambda line: json.dumps({**json.loads(line), "cop": 5}) + "\n")
    with pytest.raises(DataPrepError, match=r"dev.json: line 3: field 'cop': answer index 5 out of range"):
        medical.convert("medmcqa", mirage)

    medqa = mirage / "medqa/US_4options_test.jsonl"
    replace_line(medqa, 2, lambda line: json.dumps({**json.loads(line), "answer_idx": "E"}) + "\n")
    with pytest.raises(DataPrepError, match=r"US_4options_test.jsonl: line 2: field 'answer_idx'"):
        medical.convert("medqa", mirage)
    replace_line(medqa, 2, lambda line: line[:40] + "\n")
    with pytest.raises(DataPrepError, match=r"line 2: malformed JSON"):
        medical.convert("medqa", mirage)

    pubmedqa = mirage / "pubmedqa/test_set.json"
    data = json.loads(pubmedqa.read_text())
    pmid = next(iter(data))
    del data[pmid]["QUESTION"]
    pubmedqa.write_text(json.dumps(data))
    with pytest.raises(DataPrepError, match=rf"test_set.json: entry {pmid}: field 'QUESTION': missing"):
        medical.convert("pubmedqa", mirage)

    anatomy = mirage / "mmlu_med/anatomy_test.csv"
    anatomy.write_text(anatomy.read_text(encoding="utf-8") + "Q?,a,b,c,d,F\n", encoding="utf-8")
    with pytest.raises(DataPrepError, match=r"anatomy_test.csv: line \d+: field 'answer': 'F'"):
        medical.convert("mmlu_med", mirage)

    shutil.copy(fixtures / "mirage/mmlu_med/anatomy_test.csv", anatomy)
    (mirage / "mmlu_med/medical_genetics_test.csv").unlink()
    with pytest.raises(DataPrepError, match=r"medical_genetics_test.csv: file not found"):
        medical.convert("mmlu_med", mirage)


def test_failed_conversion_keeps_the_old_output(fixtures, tmp_path, capsys):
    mirage = copy_mirage(fixtures, tmp_path)
    out = tmp_path / "out"
    assert medical.main(["--mirage-dir", str(mirage), "--output-dir", str(out), "--datasets", "medmcqa"]) == 0
    before = (out / "medmcqa.parquet").read_bytes()
    replace_line(mirage / "medmcqa/dev.json", 12, lambda line: json.dumps({**json.loads(line), "cop": 0}) + "\n")
    args = ["--mirage-dir", str(mirage), "--output-dir", str(out), "--datasets", "medmcqa"]
    assert run_cli(medical.main, args) == 2
    assert "line 12: field 'cop'" in capsys.readouterr().err
    assert (out / "medmcqa.parquet").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["medmcqa.parquet"]  # no temp file left


def test_atomic_write_removes_the_temp_file_on_failure(tmp_path, monkeypatch):
    import data_prep._common as common

    def broken_write(table, where):
        open(where, "wb").write(b"half")
        raise OSError("disk full")

    monkeypatch.setattr(common.pq, "write_table", broken_write)
    row = common.make_row(
        data_source="nq", agent_name="a", content="c", ability="x", targets=["t"], split="s", index=0, question="q"
    )
    with pytest.raises(DataPrepError, match=r"x.parquet: cannot write \(disk full\)"):
        write_parquet_atomic([row], tmp_path / "x.parquet")
    assert list(tmp_path.iterdir()) == []


def test_medical_sample_is_deterministic(fixtures):
    a = medical.convert("medmcqa", fixtures / "mirage", sample=5, seed=11)
    assert a == medical.convert("medmcqa", fixtures / "mirage", sample=5, seed=11)
    assert len(a) == 5 and [r["extra_info"]["index"] for r in a] == list(range(5))


def test_math_published_layouts(fixtures, tmp_path):
    dapo, aime = fixtures / "math/dapo_math_17k_layout.parquet", fixtures / "math/aime_2024_layout.jsonl"
    raw = pq.read_table(dapo).to_pylist()
    rows = math_prep.convert([("dapo_math", dapo)], "train")
    assert len(rows) == 5 and len(math_prep.convert([("dapo_math", dapo)], "train", dedupe=True)) == 4
    for row, record in zip(rows, raw, strict=True):
        assert row["prompt"][0]["content"] == record["prompt"][0]["content"]  # verbatim
        assert row["reward_model"]["ground_truth"]["target"] == [record["reward_model"]["ground_truth"]]
        assert row["prompt"][0]["content"] == DAPO_PROMPT.format(p=row["extra_info"]["question"])
        assert row["extra_info"]["source_id"] == record["extra_info"]["index"]
        assert row["agent_name"] == "single_turn_agent" and row["data_source"] == "dapo_math"

    output = tmp_path / "aime.parquet"
    assert math_prep.main(["--input", f"aime2024={aime}", "--split", "test", "--output", str(output)]) == 0
    rows = pq.read_table(output).to_pylist()
    raw = [json.loads(line) for line in aime.read_text().splitlines()]
    assert [r["reward_model"]["ground_truth"]["target"] for r in rows] == [[str(r["Answer"])] for r in raw]
    assert [r["prompt"][0]["content"] for r in rows] == [DAPO_PROMPT.format(p=r["Problem"]) for r in raw]
    for row in rows:
        answer = row["reward_model"]["ground_truth"]["target"][0]
        assert compute_score("aime2024", f"...\nAnswer: {answer}", row["reward_model"]["ground_truth"])["score"] == 1.0


def test_math_bad_input(tmp_path):
    path = tmp_path / "aime.jsonl"
    path.write_text('{"Problem": "1+1?", "Answer": 2}\n{"Problem": "2+2?"}\n')
    with pytest.raises(DataPrepError, match=r"aime.jsonl: line 2: field 'answer': missing"):
        math_prep.convert([("aime2024", path)], "test")
    with pytest.raises(DataPrepError, match="unknown data source 'gsm8k'"):
        math_prep.convert([("gsm8k", path)], "test")


def test_every_family_shares_one_schema_so_verl_can_mix_them(fixtures, tmp_path):
    """verl's RLHFDataset concatenates data files with datasets.concatenate_datasets."""
    import datasets

    from data_prep import search_qa

    files = {
        "qa": search_qa.convert([("nq", fixtures / "nq_open/NQ-open.dev.jsonl")], "train", limit=3),
        "med": medical.convert("pubmedqa", fixtures / "mirage"),
        "math": math_prep.convert([("aime2024", fixtures / "math/aime_2024_layout.jsonl")], "train"),
    }
    for name, rows in files.items():
        write_parquet_atomic(rows, tmp_path / f"{name}.parquet")
    parts = [datasets.load_dataset("parquet", data_files=str(tmp_path / f"{n}.parquet"))["train"] for n in files]
    mixed = datasets.concatenate_datasets(parts)
    assert len(mixed) == 3 + 6 + 3
    for row in mixed:
        gold = row["reward_model"]["ground_truth"]
        answer = {"nq": gold["target"][0], "pubmedqa": gold["target"][0], "aime2024": gold["target"][0]}
        response = f"<think>t</think><answer>{answer[row['data_source']]}</answer>"
        assert compute_score(row["data_source"], response, gold, row["extra_info"])["score"] == 1.0


@pytest.mark.parametrize("module", ["search_qa", "medical", "math"])
def test_cli_help(module):
    result = subprocess.run([sys.executable, "-m", f"data_prep.{module}", "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "--limit" in result.stdout and "--sample" in result.stdout


# Full public files (../shared/data/mirage), skipped when absent.
EXPECTED_FULL_ROWS = {"medqa": 1273, "medmcqa": 4183, "pubmedqa": 500, "mmlu_med": 1089}
MMLU_MED_PER_SUBJECT = {  # MMLU's test split sizes; they sum to MIRAGE's 1,089
    "anatomy": 135,
    "clinical_knowledge": 265,
    "college_biology": 144,
    "college_medicine": 173,
    "medical_genetics": 100,
    "professional_medicine": 272,
}


def test_mirage_full(shared_data, tmp_path):
    mirage = shared_data / "mirage"
    assert medical.main(["--mirage-dir", str(mirage), "--output-dir", str(tmp_path)]) == 0
    ambiguous = 0  # options that repeat after normalization, or that are letters themselves
    for name, count in EXPECTED_FULL_ROWS.items():
        rows = pq.read_table(tmp_path / f"{name}.parquet").to_pylist()
        assert len(rows) == count, name
        check_medical_rows(rows, name)  # gold letter among the options, exact prompt, gold letter scores 1
        for row in rows:
            info, gold = row["extra_info"], row["reward_model"]["ground_truth"]
            normalized = [normalize_answer(c) for c in info["choices"]]
            gold_text = info["choices"]["ABCD".index(gold["target"][0])]
            looks_like_a_letter = re.fullmatch(r"\(?[A-Z]\)?[.:)]?", gold_text.strip()) is not None
            if (
                normalized.count(normalize_answer(gold_text)) > 1
                or not normalize_answer(gold_text)
                or looks_like_a_letter
            ):
                ambiguous += 1
                continue
            # Answering with the gold option's text also scores 1.
            assert compute_score(name, f"<answer>{gold_text}</answer>", gold, info)["score"] == 1.0, (name, row)
    assert ambiguous < 50, ambiguous  # rare: the text of the gold option cannot name it unambiguously
    subjects = [r["extra_info"]["subject"] for r in pq.read_table(tmp_path / "mmlu_med.parquet").to_pylist()]
    assert {s: subjects.count(s) for s in MMLU_MED_PER_SUBJECT} == MMLU_MED_PER_SUBJECT
