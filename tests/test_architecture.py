"""The apps import one way: queues <- tasks <- (workers, dlq) <- (dashboard, cloudtasks).

Each app may import the project's base (`taskforge.*` but its entry points),
itself, and the apps below it; nothing imports upward or sideways, at module
level or inside a function.  The base imports no app; the entry points
(`taskforge.urls`, `taskforge.settings`, `taskforge.wsgi`) may import any.
Tests are left out: a test may reach anywhere it needs.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The rank of each app; an app may import those of a lower rank.
RANKS = {"queues": 1, "tasks": 2, "workers": 3, "dlq": 3, "dashboard": 4, "cloudtasks": 4}
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
    assert _allowed("cloudtasks.services", "tasks.transitions")
    assert not _allowed("cloudtasks.views", "dashboard.views")
    assert not _allowed("workers.pusher", "cloudtasks.taskbody")
    assert _allowed("taskforge.urls", "dashboard.urls")


# --- circles ---------------------------------------------------------------------------
#
# Inside the base, each sub-package (`taskforge.api`, `taskforge.audit`, `taskforge.lib`)
# and each top-level module (`taskforge.conf`, `taskforge.metrics`, ...) is one part; in
# the SDK each module is one.  An import at any depth (inside a function too) is an edge,
# and no part may reach itself: a circle means neither side can be read, tested or
# moved alone.  The entry points see everything and are left out.
CIRCLE_ROOTS = {"taskforge": 2, "taskforge_client": 2}


def _part(module: str) -> str | None:
    """The part a module belongs to, or None for one outside the checked packages."""
    parts = module.split(".")
    depth = CIRCLE_ROOTS.get(parts[0])
    if depth is None or module in ENTRY_POINTS or module == "taskforge.rsgi":
        return None
    return ".".join(parts[:depth])


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for root in CIRCLE_ROOTS:
        for path in sorted((ROOT / root).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if {"tests", "migrations"} & set(rel.parts):
                continue
            module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
            source = _part(module)
            if source is None:
                continue
            for _, name in _imported(ast.parse(path.read_text(), filename=str(rel))):
                target = _part(name)
                if target is not None and target != source:
                    edges.setdefault(source, set()).add(target)
    return edges


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of `edges`, as its parts in order (one per strongly connected group)."""
    found: list[list[str]] = []
    for start in sorted(edges):
        stack = [(start, [start])]
        seen: set[str] = set()
        while stack:
            node, trail = stack.pop()
            for following in sorted(edges.get(node, ())):
                if following == start:
                    circle = sorted(trail)
                    if circle not in found:
                        found.append(circle)
                elif following not in seen and following > start:
                    seen.add(following)
                    stack.append((following, [*trail, following]))
    return found


def test_parts__import_no_circle() -> None:
    assert _circles(_edges()) == []


def test_circles__found_at_any_length() -> None:
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _circles(edges) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []
    assert _part("taskforge.api.hot") == "taskforge.api"
    assert _part("taskforge.conf") == "taskforge.conf"
    assert _part("taskforge_client.batching") == "taskforge_client.batching"
    assert _part("taskforge.urls") is None


# --- long modules ----------------------------------------------------------------------
#
# A module stays under 500 lines; one longer is listed here with its reason
# (docs/architecture.md, "Long modules, and why").
LONG_MODULES = {
    "bench/run.py": "the benchmark: one program driven by `make bench`",
    "tests/test_faults.py": "the real-process fault suite around one shared service",
    "tests/test_malformed.py": "one table-driven sweep of bad input over every endpoint",
    "tests/test_metrics.py": "one scrape format end to end",
    "tests/test_sdk.py": "the SDK against one running service",
}
MAX_LINES = 500


def test_modules__long_ones_listed_with_their_reason() -> None:
    skipped = {".venv", "node_modules", ".git", "migrations"}
    long = {
        str(path.relative_to(ROOT))
        for path in ROOT.rglob("*.py")
        if not skipped & set(path.relative_to(ROOT).parts)
        and len(path.read_text().splitlines()) > MAX_LINES
    }
    assert sorted(long - set(LONG_MODULES)) == []
    assert sorted(set(LONG_MODULES) - long) == []  # a module back under the bar leaves the list


# --- raw SQL ---------------------------------------------------------------------------
#
# SQL is written in the statement modules alone, one per app and one for the base, each
# statement named there; the rest of the code runs them by name (docs/architecture.md).
# Migrations keep their own.  Found: a string (outside a docstring) that opens with an SQL
# keyword, and any call of the ORM's raw doors (`.raw()`, `.extra()`, `RawSQL`).
SQL_MODULES = {
    "taskforge/lib/sql.py",
    "queues/sql.py",
    "tasks/sql.py",
    "workers/sql.py",
    "dlq/sql.py",
}
SQL_OPENING = re.compile(
    r"\s*(SELECT|INSERT|UPDATE|DELETE|WITH|SET|RESET|LISTEN|UNLISTEN|NOTIFY|VACUUM|ANALYZE"
    r"|CREATE|ALTER|DROP|TRUNCATE|COPY|LOCK|BEGIN|COMMIT)\s"
)
RAW_DOORS = {"raw", "extra", "RawSQL"}


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes of `tree` (prose, whatever word opens it)."""
    return {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
        and isinstance(node.body[0].value.value, str)
    }


def _raw_sql(source: str, filename: str) -> list[int]:
    """The lines of `source` that write SQL or open one of the ORM's raw doors."""
    tree = ast.parse(source, filename=filename)
    docstrings = _docstrings(tree)
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant | ast.JoinedStr) and id(node) not in docstrings:
            first = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
            text = first.value if isinstance(first, ast.Constant) else None
            if isinstance(text, str) and SQL_OPENING.match(text):
                lines.append(node.lineno)
        elif isinstance(node, ast.Call):
            name = getattr(node.func, "attr", None) or getattr(node.func, "id", None)
            if name in RAW_DOORS:
                lines.append(node.lineno)
    return sorted(set(lines))


def _sql_outside_its_modules() -> list[str]:
    found = []
    for package in [*RANKS, "taskforge", "taskforge_client"]:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if {"tests", "migrations"} & set(rel.parts) or str(rel) in SQL_MODULES:
                continue
            found += [f"{rel}:{line}" for line in _raw_sql(path.read_text(), str(rel))]
    return found


def test_sql__only_in_the_statement_modules() -> None:
    assert _sql_outside_its_modules() == []


def test_sql__found_in_strings_f_strings_and_raw_doors() -> None:
    source = '''
"""SELECT in a docstring is prose."""
A = "SELECT 1"
def f(cursor, name, qs):
    """UPDATE: also prose."""
    cursor.execute(f"SET LOCAL {name} = off")
    qs.raw("x")
    qs.extra(where=["x"])
    RawSQL("x", [])
    label = "Selected"
'''
    assert _raw_sql(source, "x.py") == [3, 6, 7, 8, 9]


# --- the dispatch structure in Redis -----------------------------------------------------
#
# `tasks/buffer.py` names every key of the dispatch structure and is the one module that
# writes them and runs their Lua (`tasks/buffer_scripts.py`); everything else goes
# through its `Buffer`.  Found elsewhere: a string naming a dispatch key or the wake-up
# channel, an import of a key's name from `tasks.buffer`, an import of the scripts.
DISPATCH_HOME = {
    "tasks/buffer.py",
    "tasks/buffer_scripts.py",
    "tasks/fair_buffer.py",
    "tasks/fair_buffer_scripts.py",
}
DISPATCH_KEY = re.compile(
    r"tf:\{.*\}:(ready|bucket|epoch|running|counted|counting|watched|fair|ring|cpark|rpark"
    r"|krun|ktask|kwv?|kb|k:)\b|tf:\{.*\}:k:|tf:wake"
)


def _dispatch_named(source: str, filename: str) -> list[int]:
    """The lines of `source` that name a dispatch key or reach for the buffer's Lua
    (docstrings are prose)."""
    tree = ast.parse(source, filename=filename)
    docstrings = _docstrings(tree)
    lines = []
    for node in ast.walk(tree):
        if id(node) in docstrings:
            continue
        if isinstance(node, ast.JoinedStr):
            text = "{}".join(
                part.value
                for part in node.values
                if isinstance(part, ast.Constant) and isinstance(part.value, str)
            )
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
        elif isinstance(node, ast.ImportFrom) and node.module == "tasks.buffer":
            if any(alias.name.endswith("_key") for alias in node.names):
                lines.append(node.lineno)
            continue
        elif isinstance(node, ast.ImportFrom | ast.Import):
            names = [node.module] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names]
            if any(name and name.endswith("buffer_scripts") for name in names):
                lines.append(node.lineno)
            continue
        else:
            continue
        if DISPATCH_KEY.search(text):
            lines.append(node.lineno)
    return sorted(set(lines))


def _dispatch_outside_its_home() -> list[str]:
    found = []
    for package in [*RANKS, "taskforge", "taskforge_client"]:
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT)
            if {"tests", "migrations"} & set(rel.parts) or str(rel) in DISPATCH_HOME:
                continue
            found += [f"{rel}:{line}" for line in _dispatch_named(path.read_text(), str(rel))]
    return found


def test_dispatch__keys_and_scripts_only_in_the_buffer() -> None:
    assert _dispatch_outside_its_home() == []


def test_dispatch__found_in_strings_f_strings_and_imports() -> None:
    source = '''
"""Keys like tf:{q}:ready, in prose."""
from tasks.buffer import get_buffer, score
from tasks.buffer import ready_key
from tasks.buffer_scripts import TAKE
from tasks import buffer_scripts
READY = "tf:{q}:ready"
def push(client, queue_id):
    client.zadd(f"tf:{{{queue_id}}}:running", {})
    client.lpush(f"tf:{{{queue_id}}}:hb", 1)  # not a dispatch key
    client.publish("tf:wake:3", "x")
'''
    assert _dispatch_named(source, "x.py") == [4, 5, 6, 7, 9, 11]
