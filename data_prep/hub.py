"""Data sets from the Hugging Face hub by name, through ``datasets`` (installed with verl).

``python -m data_prep.search_qa --hf nq,hotpotqa --split train ...`` and
``python -m data_prep.medical --hf ...`` fetch what Search-R1's and MIRAGE's users would
otherwise download and convert by hand. Each hub split is exported (progress bar, atomic write)
into the raw local layout the converters already read, in ``<cache>/hub/`` (``$SORL_VERL_CACHE``,
else ``~/.cache/sorl_verl``), and then converted exactly as a local file is: one row schema
(:mod:`data_prep._common`), one set of checks, errors naming the exported file and line.

QA (FlashRAG, what Search-R1's ``scripts/data_process/qa_search_*_merge.py`` load):
``datasets.load_dataset("RUC-NLPIR/FlashRAG_datasets", NAME)`` with NAME the ``data_source``
(``nq``, ``triviaqa``, ``popqa``, ``hotpotqa``, ``2wikimultihopqa``, ``musique``, ``bamboogle``);
rows ``{"id", "question", "golden_answers", "metadata"}``. Split (Search-R1's rule): ``train``
for ``--split train``; otherwise ``test`` if the set has one, else ``dev``, else ``train``.

Medical (MIRAGE's four sets; the hub copies are our choice, MIRAGE ships its own files):

=========  ===================================  ===========================  =====================================
name       hub data set (config)                split                        becomes MIRAGE's file
=========  ===================================  ===========================  =====================================
medqa      GBaker/MedQA-USMLE-4-options         test (1,273)                 medqa/US_4options_test.jsonl
medmcqa    openlifescienceai/medmcqa            validation (4,183)           medmcqa/dev.json, ``cop`` 0-3 -> 1-4
pubmedqa   qiaojin/PubMedQA (pqa_labeled)       train (1,000: all of PQA-L)  pubmedqa/test_set.json
mmlu_med   cais/mmlu (six subject configs)      test                         mmlu_med/{subject}_test.csv
=========  ===================================  ===========================  =====================================

PubMedQA's hub copy holds all 1,000 expert-labelled questions, of which MIRAGE's test set is
the official 500; the hub does not mark which, so ``--hf`` pubmedqa gives the 1,000 (a warning
says so). ``--hf-repo PATH`` (QA) or ``--hf-repo NAME=PATH`` (medical, repeatable) reads another
repo or a local folder in the hub's layout (a ``huggingface-cli download --repo-type dataset`` snapshot),
which is also how the tests run offline.
"""

from __future__ import annotations

import csv
import io
import json
import sys
from collections.abc import Iterable
from pathlib import Path

from data_prep._common import MMLU_MED_SUBJECTS, DataPrepError
from sorl_verl.fileio import atomic_file
from sorl_verl.progress import progress

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"
# name -> (repo, config or None, split) of the medical sets' hub copies
MEDICAL_HUB = {
    "medqa": ("GBaker/MedQA-USMLE-4-options", None, "test"),
    "medmcqa": ("openlifescienceai/medmcqa", None, "validation"),
    "pubmedqa": ("qiaojin/PubMedQA", "pqa_labeled", "train"),
    "mmlu_med": ("cais/mmlu", None, "test"),  # one config per subject
}


def hub_cache_dir() -> Path:
    from sorl_verl.retrieval import default_cache_dir

    return default_cache_dir() / "hub"


def parse_names(text: str, known: Iterable[str], what: str) -> list[str]:
    """``"nq, hotpotqa"`` -> ``["nq", "hotpotqa"]``; an unknown or repeated name is an error."""
    known = tuple(known)
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise DataPrepError(f"--hf needs at least one {what} name; choose from {', '.join(known)}")
    for name in names:
        if name not in known:
            raise DataPrepError(f"unknown {what} {name!r} for --hf; choose from {', '.join(known)}")
    if len(set(names)) != len(names):
        raise DataPrepError(f"--hf names a {what} twice: {text!r}")
    return names


def parse_repo_overrides(specs: Iterable[str] | None, names: Iterable[str]) -> dict:
    """``["medqa=/data/medqa", "mmlu_med=cais/mmlu"]`` -> ``{"medqa": "/data/medqa", "mmlu_med": "cais/mmlu"}``."""
    names = tuple(names)
    out = {}
    for spec in specs or ():
        name, sep, repo = spec.partition("=")
        if not sep:
            raise DataPrepError(f"--hf-repo {spec!r}: expected NAME=REPO with NAME one of {', '.join(names)}")
        if name not in names:
            raise DataPrepError(f"--hf-repo {spec!r}: unknown name {name!r}; choose from {', '.join(names)}")
        if not repo:
            raise DataPrepError(f"--hf-repo {spec!r}: empty repo")
        out[name] = repo
    return out


def load_splits(repo: str, config: str | None):
    """``datasets.DatasetDict`` of ``repo`` (hub name or local folder) and ``config``; errors name both."""
    try:
        import datasets
    except ImportError:
        raise DataPrepError("--hf needs the 'datasets' package (a dependency of verl): pip install datasets") from None
    where = f"{repo}" + (f" (config {config!r})" if config else "")
    print(f"loading {where} with datasets.load_dataset", file=sys.stderr)
    try:
        return datasets.load_dataset(str(repo), config)
    except Exception as error:  # datasets raises many types (network, missing config, bad files)
        raise DataPrepError(
            f"{where}: datasets.load_dataset failed: {type(error).__name__}: {str(error)[:300]}"
        ) from None


def pick_split(splits, wanted: str | list[str], where: str):
    """The first of ``wanted`` that ``splits`` has; an error listing what it has otherwise."""
    for name in [wanted] if isinstance(wanted, str) else wanted:
        if name in splits:
            return name, splits[name]
    raise DataPrepError(f"{where}: no split {wanted!r}; it has {', '.join(splits)}")


def export_jsonl(rows: Iterable[dict], out: Path, desc: str, total: int | None = None) -> Path:
    """JSON lines, atomically, with a progress bar."""
    with atomic_file(out) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for row in progress(rows, desc=desc, total=total, unit=" rows"):
            f.write(json.dumps(row, ensure_ascii=False, default=str) + "\n")
    return out


def flashrag_split_for(split: str, available) -> list[str]:
    """Search-R1's choice: train for training data; test, else dev, else train for evaluation."""
    return ["train"] if split == "train" else ["test", "dev", "train"]


def fetch_qa(
    names: list[str], split: str, repo: str = FLASHRAG_REPO, cache_dir: Path | None = None
) -> list[tuple[str, Path]]:
    """Export each FlashRAG set's split to ``<cache>/hub/<repo>/<name>/<split>.jsonl``; returns
    ``[(name, path)]`` for :func:`data_prep.search_qa.convert`."""
    root = Path(cache_dir or hub_cache_dir()) / _slug(repo)
    inputs = []
    for name in names:
        splits = load_splits(repo, name)
        hub_split, dataset = pick_split(splits, flashrag_split_for(split, splits), f"{repo} config {name!r}")
        print(f"{name}: using {repo} split {hub_split!r} ({len(dataset)} rows)", file=sys.stderr)
        fields = {"id", "question", "golden_answers", "answer"}
        rows = ({k: v for k, v in row.items() if k in fields} for row in dataset)
        inputs.append((name, export_jsonl(rows, root / name / f"{hub_split}.jsonl", f"export {name}", len(dataset))))
    return inputs


def fetch_medical(names: list[str], repos: dict | None = None, cache_dir: Path | None = None) -> Path:
    """Export the medical sets' hub copies into MIRAGE's raw layout under ``<cache>/hub/mirage``;
    returns that folder, for :func:`data_prep.medical.convert` (``mirage_dir``)."""
    repos = repos or {}
    root = Path(cache_dir or hub_cache_dir()) / "mirage"
    for name in names:
        default_repo, config, split = MEDICAL_HUB[name]
        repo = repos.get(name, default_repo)
        if name == "mmlu_med":
            for subject in MMLU_MED_SUBJECTS:
                _, data = pick_split(load_splits(repo, subject), split, f"{repo} config {subject!r}")
                _export_mmlu(data, root / "mmlu_med" / f"{subject}_test.csv", f"{repo} config {subject!r}")
            continue
        _, data = pick_split(load_splits(repo, config), split, f"{repo}")
        if name == "medqa":
            fields = ("question", "options", "answer_idx")
            export_jsonl(
                ({k: row.get(k) for k in fields} for row in data),
                root / "medqa" / "US_4options_test.jsonl",
                "export medqa",
                len(data),
            )
        elif name == "medmcqa":
            export_jsonl(
                (_medmcqa_row(row, i, repo) for i, row in enumerate(data)),
                root / "medmcqa" / "dev.json",
                "export medmcqa",
                len(data),
            )
        else:
            print(
                f"pubmedqa: {repo} ({config}) holds all {len(data)} labelled questions; MIRAGE's test set is "
                f"the official 500 of them, which the hub copy does not mark",
                file=sys.stderr,
            )
            _export_pubmedqa(data, root / "pubmedqa" / "test_set.json", repo)
    return root


def _medmcqa_row(row: dict, index: int, repo: str) -> dict:
    cop = row.get("cop")
    if isinstance(cop, bool) or not isinstance(cop, int) or not 0 <= cop <= 3:
        raise DataPrepError(
            f"{repo}: row {index}: field 'cop': {cop!r} is not an answer index 0..3 (the hub's test "
            f"split has no answers; use validation)"
        )
    out = {k: row.get(k) for k in ("id", "question", "opa", "opb", "opc", "opd", "subject_name")}
    out["cop"] = cop + 1  # MIRAGE's dev.json is 1-based, the hub's ClassLabel 0-based
    return out


def _export_pubmedqa(data, out: Path, repo: str) -> None:
    entries = {}
    for index, row in enumerate(progress(data, desc="export pubmedqa", unit=" rows")):
        pmid = str(row.get("pubid", index))
        if pmid in entries:
            raise DataPrepError(f"{repo}: row {index}: field 'pubid': {pmid} appears twice")
        entries[pmid] = {"QUESTION": row.get("question"), "final_decision": row.get("final_decision")}
    with atomic_file(out) as tmp:
        tmp.write_text(json.dumps(entries, ensure_ascii=False), encoding="utf-8")


def _export_mmlu(data, out: Path, where: str) -> None:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for index, row in enumerate(progress(data, desc=f"export {out.stem}", unit=" rows")):
        choices, answer = row.get("choices"), row.get("answer")
        if not isinstance(choices, list) or len(choices) != 4:
            raise DataPrepError(f"{where}: row {index}: field 'choices': expected 4 options, got {choices!r}")
        if isinstance(answer, bool) or not isinstance(answer, int) or not 0 <= answer <= 3:
            raise DataPrepError(f"{where}: row {index}: field 'answer': {answer!r} is not an index 0..3")
        writer.writerow([row.get("question") or "", *map(str, choices), "ABCD"[answer]])
    with atomic_file(out) as tmp:
        tmp.write_text(buffer.getvalue(), encoding="utf-8")


def _slug(repo: str) -> str:
    path = Path(repo)
    if path.is_dir():  # a local snapshot: its folder name plus a short digest of its path
        import hashlib

        return f"local-{path.name}-{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:8]}"
    return repo.replace("/", "__")
