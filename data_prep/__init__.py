"""Data preparation: raw public files -> verl parquet in one schema (``data_prep._common.SCHEMA``).

One CLI per family, each with ``--help``:

- ``python -m data_prep.search_qa``: Search-R1's QA sets (FlashRAG or NQ-Open JSONL), Search-R1's prompt;
- ``python -m data_prep.medical``: MIRAGE's MedQA-US, MedMCQA, PubMedQA*, MMLU-Med;
- ``python -m data_prep.math``: DAPO-Math-17k and AIME-2024 in their published layouts.

Prompt templates and their sources are in :mod:`data_prep.templates`; the rewards that score these rows
are in :mod:`reward_fns`.
"""
