"""The apps import one way: queues <- tasks <- (workers, dlq) <- dashboard.

Each app may import the project's base (`taskforge.*` but its entry points),
itself, and the apps below it; nothing imports upward or sideways, at module
level or inside a function.  The base imports no app; the entry points
(`taskforge.urls`, `taskforge.settings`, `taskforge.wsgi`) may import any.
Tests are left out: a test may reach anywhere it needs.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The rank of each app; an app may import those of a lower rank.
RANKS = {"queues": 1, "tasks": 2, "workers": 3, "dlq": 3, "dashboard": 4}
ENTRY_POINTS = {"taskforge.urls", "taskforge.settings", "taskforge.wsgi"}


def _package(module: str) -> str:
    return module.split(".")[0]


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
    return found


def _allowed(importer: str, imported: str) -> bool:
    src, dst = _package(importer), _package(imported)
    if dst not in RANKS and dst != "taskforge":
        return True  # the standard library or a dependency
    if importer in ENTRY_POINTS:
        return True
    if src == "taskforge":
        return dst == "taskforge"  # the base imports no app
    if dst == "taskforge":
        return imported not in ENTRY_POINTS
    return src == dst or RANKS[dst] < RANKS[src]


def _violations() -> list[str]:
    found = []
    for package in [*RANKS, "taskforge"]:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if {"tests", "migrations"} & set(rel.parts):
                continue
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            tree = ast.parse(path.read_text(), filename=str(rel))
            found += [
                f"{rel}:{line} imports {name}"
                for line, name in _imported(tree)
                if not _allowed(module, name)
            ]
    return found


def test_apps__import_only_downward() -> None:
    assert _violations() == []


def test_rule__refuses_upward_sideways_and_base_to_app_imports() -> None:
    assert not _allowed("tasks.transitions", "dlq.models")
    assert not _allowed("workers.protocol", "dlq.services")
    assert not _allowed("queues.services", "tasks.sql")
    assert not _allowed("taskforge.metrics", "queues.models")
    assert not _allowed("tasks.admin", "dashboard.admin.base")
    assert _allowed("dlq.receivers", "tasks.models")
    assert _allowed("dashboard.views", "workers.models")
    assert _allowed("taskforge.urls", "dashboard.urls")
