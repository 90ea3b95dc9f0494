"""The lifecycle table, the edges each verb and statement declares, and the sets derived."""

from __future__ import annotations

import re

import pytest

from tasks import lifecycle, sql, transitions
from tasks.lifecycle import EDGES, TaskStatus

S = TaskStatus

STATEMENTS = [value for value in vars(sql).values() if isinstance(value, sql.Statement)]


def test_verbs__each_declares_only_allowed_edges() -> None:
    for name, edges in transitions.VERBS.items():
        assert edges, name
        assert edges <= EDGES, (name, edges - EDGES)


def test_verbs__every_allowed_edge_has_a_verb() -> None:
    declared = set().union(*transitions.VERBS.values())
    assert declared == EDGES


def test_statements__are_the_hot_verbs_edges() -> None:
    assert {s.name for s in STATEMENTS} == {"create", "buffer_due", "hand_out", "ack"}
    for statement in STATEMENTS:
        assert transitions.VERBS[statement.name] == statement.edges


def _literal(text: str) -> str | None:
    return None if text.upper() == "NULL" else text.strip("'")


@pytest.mark.parametrize("statement", STATEMENTS, ids=lambda s: s.name)
def test_statements__write_events_for_exactly_their_declared_edges(
    statement: sql.Statement,
) -> None:
    """Each statement's events CTE inserts (from_status, to_status) pairs as
    literals; they are the edges it declares, and its SET/INSERT statuses lead there."""
    at = statement.text.find("INSERT INTO tasks_taskevent")
    pairs = re.findall(r"(NULL|'[a-z]+'),\s*'([a-z]+)'", statement.text[at:]) if at >= 0 else []
    written = {(_literal(a), b) for a, b in pairs}
    if "INSERT INTO tasks_task " in statement.text:  # new rows record these (tasks.events)
        written |= set(lifecycle.ROW_RECORDED)
    if "claimed_at = %(now)s" in statement.text:  # the task row records a hand-out
        written.add(lifecycle.CLAIM)
    assert written == set(statement.edges)
    targets = set(re.findall(r"(?:status = |THEN |ELSE )'([a-z]+)'", statement.text))
    from_guards = set(re.findall(r"status(?: COLLATE \"C\")? = '([a-z]+)'", statement.text))
    assert {to for _, to in statement.edges} <= targets | {S.PENDING}
    assert {frm for frm, _ in statement.edges if frm} <= from_guards | {S.PENDING}


def test_sets__follow_the_table() -> None:
    assert set(lifecycle.FINISHED) == {S.DONE, S.CANCELLED}
    assert set(lifecycle.LIVE) == {S.PENDING, S.CLAIMED, S.EXECUTING, S.RETRY, S.DEAD}
    assert set(lifecycle.IN_PROGRESS) == {S.PENDING, S.CLAIMED, S.EXECUTING, S.RETRY}
    assert set(lifecycle.CANCELLABLE) == {S.PENDING, S.CLAIMED, S.RETRY}
