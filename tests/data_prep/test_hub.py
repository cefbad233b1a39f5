"""data_prep.hub: data sets by hub name through ``datasets``, tested offline against local folders in
the hub's layout (a README.md whose YAML lists each config's data files, as the hub repos do)."""

from __future__ import annotations

import json

import pytest

from data_prep import hub, medical, search_qa
from data_prep._common import DataPrepError

datasets = pytest.importorskip("datasets")


@pytest.fixture(autouse=True)
def offline_caches(tmp_path, monkeypatch):
    """No network, and every cache (datasets', ours) inside the test's folder."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("SORL_VERL_CACHE", str(tmp_path / "sorl_cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def hub_folder(root, configs: dict[str | None, dict[str, object]]):
    """A dataset repo snapshot: ``{config: {split: rows or (filename, text)}}``; config None = default."""
    root.mkdir(parents=True)
    yaml = ["---", "configs:"]
    for config, splits in configs.items():
        name = config or "default"
        yaml.append(f"- config_name: {name}")
        yaml.append("  data_files:")
        for split, rows in splits.items():
            path = f"{name}/{split}.jsonl"
            (root / name).mkdir(exist_ok=True)
            (root / path).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
            yaml.append(f"  - split: {split}")
            yaml.append(f"    path: {path}")
    (root / "README.md").write_text("\n".join([*yaml, "---", "", "test snapshot"]) + "\n", encoding="utf-8")
    return root


def flashrag_rows(prefix: str, n: int) -> list[dict]:
    return [
        {
            "id": f"{prefix}_{i}",
            "question": f"{prefix} question {i}",
            "golden_answers": [f"ans {i}", f"alias {i}"],
            "metadata": {"type": "x"},
        }
        for i in range(n)
    ]


@pytest.fixture
def flashrag(tmp_path):
    return hub_folder(
        tmp_path / "FlashRAG_datasets",
        {
            "nq": {
                "train": flashrag_rows("nq_train", 5),
                "dev": flashrag_rows("nq_dev", 2),
                "test": flashrag_rows("nq_test", 3),
            },
            "hotpotqa": {"train": flashrag_rows("hp_train", 4), "dev": flashrag_rows("hp_dev", 2)},
            "bamboogle": {"test": flashrag_rows("bamboogle", 2)},
        },
    )


def test_flashrag_by_name_uses_search_r1_splits_and_the_one_row_schema(flashrag, tmp_path):
    test_inputs = hub.fetch_qa(["nq", "hotpotqa", "bamboogle"], "test", repo=str(flashrag))
    assert [(name, path.name) for name, path in test_inputs] == [
        ("nq", "test.jsonl"),
        ("hotpotqa", "dev.jsonl"),
        ("bamboogle", "test.jsonl"),
    ]
    rows = search_qa.convert(test_inputs, "test")
    assert [r["extra_info"]["source_id"] for r in rows] == [f"nq_test_{i}" for i in range(3)] + [
        f"hp_dev_{i}" for i in range(2)
    ] + ["bamboogle_0", "bamboogle_1"]
    assert rows[0]["reward_model"]["ground_truth"]["target"] == ["ans 0", "alias 0"]
    assert rows[0]["prompt"][0]["content"].rstrip().endswith("Question: nq_test question 0?")
    # the same rows as converting the hub's own file locally
    local = tmp_path / "nq_test.jsonl"
    local.write_text((flashrag / "nq" / "test.jsonl").read_text())
    assert rows[:3] == search_qa.convert([("nq", local)], "test")
    train = search_qa.convert(hub.fetch_qa(["nq", "hotpotqa"], "train", repo=str(flashrag)), "train")
    assert [r["extra_info"]["split"] for r in train] == ["train"] * 9
    assert train[5]["data_source"] == "hotpotqa" and train[5]["extra_info"]["index"] == 0


def test_hub_errors_name_the_repo_and_what_is_wrong(flashrag, tmp_path):
    with pytest.raises(DataPrepError, match=r"FlashRAG_datasets config 'bamboogle': no split \['train'\]; it has test"):
        hub.fetch_qa(["bamboogle"], "train", repo=str(flashrag))
    with pytest.raises(DataPrepError, match=r"FlashRAG_datasets \(config 'musique'\): datasets.load_dataset failed"):
        hub.fetch_qa(["musique"], "test", repo=str(flashrag))
    with pytest.raises(DataPrepError, match="unknown QA data set 'squad'"):
        hub.parse_names("nq,squad", search_qa.DATA_SOURCES, "QA data set")
    with pytest.raises(DataPrepError, match="twice"):
        hub.parse_names("nq, nq", search_qa.DATA_SOURCES, "QA data set")
    broken = hub_folder(tmp_path / "broken", {"nq": {"test": [{"id": "1", "question": "q", "golden_answers": []}]}})
    inputs = hub.fetch_qa(["nq"], "test", repo=str(broken))
    with pytest.raises(DataPrepError, match=r"test\.jsonl: line 1: field 'golden_answers': no answer"):
        search_qa.convert(inputs, "test")


@pytest.fixture
def medical_repos(tmp_path):
    medqa = hub_folder(
        tmp_path / "medqa",
        {
            None: {
                "test": [
                    {
                        "question": "Which drug?",
                        "answer": "Aspirin",
                        "options": {"A": "Aspirin", "B": "Heparin", "C": "X", "D": "Y"},
                        "meta_info": "step1",
                        "answer_idx": "A",
                    }
                ]
            }
        },
    )
    medmcqa = hub_folder(
        tmp_path / "medmcqa",
        {
            None: {
                "validation": [
                    {
                        "id": "m1",
                        "question": "Nerve?",
                        "opa": "a1",
                        "opb": "b1",
                        "opc": "c1",
                        "opd": "d1",
                        "cop": 2,
                        "choice_type": "single",
                        "exp": "",
                        "subject_name": "Anatomy",
                        "topic_name": "t",
                    }
                ],
                "test": [
                    {
                        "id": "m2",
                        "question": "Q?",
                        "opa": "a",
                        "opb": "b",
                        "opc": "c",
                        "opd": "d",
                        "cop": -1,
                        "choice_type": "single",
                        "exp": "",
                        "subject_name": "Anatomy",
                        "topic_name": "t",
                    }
                ],
            }
        },
    )
    pubmedqa = hub_folder(
        tmp_path / "pubmedqa",
        {
            "pqa_labeled": {
                "train": [
                    {
                        "pubid": 111,
                        "question": "Does it work?",
                        "context": {"contexts": ["c"]},
                        "long_answer": "l",
                        "final_decision": "maybe",
                    },
                    {
                        "pubid": 222,
                        "question": "Is it safe?",
                        "context": {"contexts": ["c"]},
                        "long_answer": "l",
                        "final_decision": "no",
                    },
                ]
            }
        },
    )
    mmlu = hub_folder(
        tmp_path / "mmlu",
        {
            subject: {
                "test": [
                    {
                        "question": f"{subject} q, with a comma",
                        "subject": subject,
                        "choices": ["w", "x", "y", "z"],
                        "answer": 3,
                    }
                ]
            }
            for subject in medical.MMLU_MED_SUBJECTS
        },
    )
    return {"medqa": str(medqa), "medmcqa": str(medmcqa), "pubmedqa": str(pubmedqa), "mmlu_med": str(mmlu)}


def test_medical_hub_copies_become_mirage_rows(medical_repos):
    mirage_dir = hub.fetch_medical(list(hub.MEDICAL_HUB), repos=medical_repos)
    rows = {name: medical.convert(name, mirage_dir) for name in hub.MEDICAL_HUB}
    assert rows["medqa"][0]["reward_model"]["ground_truth"]["target"] == ["A"]
    assert rows["medqa"][0]["extra_info"]["choices"] == ["Aspirin", "Heparin", "X", "Y"]
    medmcqa_row = rows["medmcqa"][0]  # the hub's cop 2 (0-based) is C
    assert (
        medmcqa_row["reward_model"]["ground_truth"]["target"] == ["C"]
        and medmcqa_row["extra_info"]["source_id"] == "m1"
    )
    assert [r["reward_model"]["ground_truth"]["target"] for r in rows["pubmedqa"]] == [["C"], ["B"]]
    assert [r["extra_info"]["source_id"] for r in rows["pubmedqa"]] == ["111", "222"]
    assert [r["extra_info"]["subject"] for r in rows["mmlu_med"]] == list(medical.MMLU_MED_SUBJECTS)
    assert rows["mmlu_med"][0]["extra_info"]["question"] == "anatomy q, with a comma"
    assert {r["reward_model"]["ground_truth"]["target"][0] for r in rows["mmlu_med"]} == {"D"}


def test_medmcqa_without_answers_is_refused(medical_repos, monkeypatch):
    monkeypatch.setitem(hub.MEDICAL_HUB, "medmcqa", ("openlifescienceai/medmcqa", None, "test"))
    with pytest.raises(DataPrepError, match=r"medmcqa: row 0: field 'cop': -1 is not an answer index"):
        hub.fetch_medical(["medmcqa"], repos=medical_repos)


def test_repo_overrides():
    assert hub.parse_repo_overrides(["medqa=/x", "mmlu_med=cais/mmlu"], hub.MEDICAL_HUB) == {
        "medqa": "/x",
        "mmlu_med": "cais/mmlu",
    }
    with pytest.raises(DataPrepError, match="expected NAME=REPO"):
        hub.parse_repo_overrides(["/snap"], hub.MEDICAL_HUB)
    with pytest.raises(DataPrepError, match="unknown name 'nq'"):
        hub.parse_repo_overrides(["nq=/x"], hub.MEDICAL_HUB)


def test_command_lines(flashrag, medical_repos, tmp_path, capsys):
    import pyarrow.parquet as pq

    out = tmp_path / "qa" / "test.parquet"
    assert (
        search_qa.main(["--hf", "nq,bamboogle", "--hf-repo", str(flashrag), "--split", "test", "--output", str(out)])
        == 0
    )
    assert pq.read_table(out).column("data_source").to_pylist() == ["nq"] * 3 + ["bamboogle"] * 2
    with pytest.raises(SystemExit):
        search_qa.main(["--hf", "nq", "--input", f"nq={out}", "--split", "test", "--output", str(out)])
    assert "not allowed with" in capsys.readouterr().err
    out_dir = tmp_path / "medical"
    assert (
        medical.main(
            [
                "--hf",
                "--hf-repo",
                f"medqa={medical_repos['medqa']}",
                "--hf-repo",
                f"medmcqa={medical_repos['medmcqa']}",
                "--datasets",
                "medqa,medmcqa",
                "--output-dir",
                str(out_dir),
            ]
        )
        == 0
    )
    assert sorted(p.name for p in out_dir.iterdir()) == ["medmcqa.parquet", "medqa.parquet"]
    assert pq.read_table(out_dir / "medmcqa.parquet").to_pylist()[0]["reward_model"]["ground_truth"]["target"] == ["C"]
