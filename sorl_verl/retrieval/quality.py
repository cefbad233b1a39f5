"""Retrieval quality on the embedded corpus: recall@k of the right article (our measurement).

Each article yields up to two "which article is this?" questions, with the title removed so
that retrieval cannot just match the name:

* ``description``: the Wikidata short description, e.g. ``"Painting by Georges Seurat"``;
  short and often generic ("Family of birds"), so this is the hard set;
* ``first_sentence``: the extract's first sentence, e.g. ``"... was painted from 1884 to 1886
  and is Georges Seurat's most famous work."``; mostly words of the article itself, so
  the easy set, which a working lexical retriever should nearly always get right.

The answer is the article's document id; recall@k is the fraction of questions whose
answer id is among the top ``k`` hits.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from sorl_verl.retrieval.corpus import open_text, split_contents

QUESTION_KINDS = ("description", "first_sentence")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")


@dataclass(frozen=True)
class Question:
    text: str
    answer_id: str
    kind: str


def remove_title(text: str, title: str) -> str:
    """Delete the title (and, for ``"Dune (novel)"``, also ``"Dune"``) case-insensitively."""
    names = {title, re.sub(r"\s*\(.*\)\s*$", "", title)}
    for name in sorted((n for n in names if n), key=len, reverse=True):
        text = re.sub(re.escape(name), " ", text, flags=re.IGNORECASE)
    return re.sub(r"\s+", " ", text).strip(" ,;:")


def first_sentence(text: str) -> str:
    return _SENTENCE_END.split(text.strip(), maxsplit=1)[0]


def build_questions(
    rows: Iterable[dict], kinds: tuple[str, ...] = QUESTION_KINDS, min_words: int = 2
) -> list[Question]:
    """Questions from corpus rows ``{"id", "contents", "description"?}``; questions with fewer
    than ``min_words`` words left after removing the title are dropped."""
    questions = []
    for row in rows:
        title, text = split_contents(row["contents"])
        sources = {"description": row.get("description", ""), "first_sentence": first_sentence(text)}
        for kind in kinds:
            question = remove_title(sources[kind], title)
            if len(question.split()) >= min_words:
                questions.append(Question(question, row["id"], kind))
    return questions


def load_questions(corpus_path: str | Path, kinds: tuple[str, ...] = QUESTION_KINDS) -> list[Question]:
    import json

    with open_text(corpus_path) as f:
        return build_questions((json.loads(line) for line in f if line.strip()), kinds)


def recall_at_k(retriever, questions: list[Question], k: int = 3, batch_size: int = 512) -> float:
    """Fraction of ``questions`` whose ``answer_id`` is in the retriever's top ``k``."""
    if not questions:
        raise ValueError("no questions")
    found = 0
    for start in range(0, len(questions), batch_size):
        batch = questions[start : start + batch_size]
        results = retriever.search([q.text for q in batch], topk=k)
        found += sum(
            q.answer_id in {hit["document"]["id"] for hit in hits} for q, hits in zip(batch, results, strict=True)
        )
    return found / len(questions)
