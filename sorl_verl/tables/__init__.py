"""Turn training runs into the paper's tables and curves: ``python -m sorl_verl.tables RUN_DIR ...``.

:mod:`.runs` reads a run folder (verl's FileLogger JSONL and the resolved config),
:mod:`.table` builds and renders the methods x datasets table, :mod:`.plot` draws the
validation and stability curves, :mod:`.cli` is the command line.
"""

from sorl_verl.tables.runs import Run, RunError, load_run, method_name
from sorl_verl.tables.table import build_table, to_csv, to_latex, to_markdown

__all__ = ["Run", "RunError", "build_table", "load_run", "method_name", "to_csv", "to_latex", "to_markdown"]
