from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import connection

from taskforge.lib import internals, pg
from tasks.models import TaskStatus

QUERY = """
SELECT v FROM unnest(%s::timestamptz[]) WITH ORDINALITY AS t(v, n) ORDER BY n
"""
VALUES = [
    "2026-11-30 05:09:23.075089+00",
    "2026-11-30 05:09:23+05:30",
    "1999-12-31 23:59:59.999999-08",
    "2026-03-29 01:30:00+01",
    "0001-01-01 00:00:00+00",
]


@pytest.mark.django_db
def test_pg_cursor__timestamps_load_as_django_loads_them() -> None:
    with connection.cursor() as cursor:
        cursor.execute(QUERY, [VALUES])
        expected = [row[0] for row in cursor.fetchall()]
    with pg.cursor() as cursor:
        cursor.execute(QUERY, [VALUES])
        got = [row[0] for row in cursor.fetchall()]
    assert got == expected
    assert [value.utcoffset().total_seconds() for value in got] == [0.0] * len(VALUES)
    assert {value.tzinfo for value in got} == {value.tzinfo for value in expected}
    # The plain cursors of the connection keep Django's loader.
    with connection.cursor() as cursor:
        cursor.execute(QUERY, [VALUES[:1]])
        assert cursor.fetchone()[0] == expected[0]


def _prepared(marker: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            [f"%{marker}%"],
        )
        count: int = cursor.fetchone()[0]
    return count


@pytest.mark.django_db
@pytest.mark.parametrize("prepared", [True, False])
def test_pg_cursor__prepares_unless_the_setting_is_off(
    settings: LazySettings, prepared: bool
) -> None:
    """DATABASE_PREPARED_STATEMENTS false (a transaction pooler): no named statement is left
    on the server connection for the next client to trip over, and values still bind."""
    settings.DATABASE_PREPARED_STATEMENTS = prepared
    marker = f"probe_pg_cursor_{prepared}".lower()
    for n in (1, 2, 3):
        with pg.cursor() as cursor:
            cursor.execute(f"SELECT %(n)s::int + 1 AS {marker}", {"n": n})
            assert cursor.fetchone()[0] == n + 1
    assert _prepared(marker) == (1 if prepared else 0)


@pytest.mark.django_db(transaction=True)
def test_listener__listens_on_its_own_connection_when_a_listen_url_is_set(
    settings: LazySettings,
) -> None:
    from taskforge.lib.listen import Listener
    from tests.service import database_url

    settings.DATABASE_LISTEN_URL = database_url(connection.settings_dict)
    listener = Listener("taskforge_listen_probe", "taskforge-probe")
    own = listener.connection()
    try:
        connection.ensure_connection()
        assert own is not connection.connection
        assert listener.connection() is own  # kept, not reconnected
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_notify('taskforge_listen_probe', 'hi')")
        assert [n.payload for n in own.notifies(timeout=5, stop_after=1)] == ["hi"]
        listener.reset()
        assert own.closed
        again = listener.connection()
        assert again is not own and not again.closed
    finally:
        listener.reset()


@pytest.mark.django_db(transaction=True)
def test_listener__a_pooled_connection_goes_back_listening_no_more() -> None:
    """A loop made in a pooled process listened on a pooled connection; whoever
    got it next read every NOTIFY sent meanwhile as new (two flaky wait tests)."""
    from taskforge.lib.listen import Listener

    listener = Listener("taskforge_listen_probe", "taskforge-probe")
    listened = listener.connection()
    listener.reset()  # back to the pool
    pool = connection.pool  # type: ignore[attr-defined]  # the postgresql backend's
    assert pool is not None
    with pool.connection() as sender:
        sender.execute("SELECT pg_notify('taskforge_listen_probe', 'stale')")
    handed: list[Any] = []
    try:
        while (pg := pool.getconn(timeout=1.0)) is not listened:
            handed.append(pg)
        handed.append(pg)
        assert pg.execute("SELECT count(*) FROM pg_listening_channels()").fetchone() == (0,)
        assert list(pg.notifies(timeout=0.2)) == []
    finally:
        for pg in handed:
            pool.putconn(pg)


TEXTS = [
    "plain",
    "",
    " spaced ",
    "NULL",
    "null",
    'a "quoted" word',
    "back\\slash\\",
    "\\",
    '\\"',
    "{braces},commas,;",
    "new\nline\ttab",
    "\u00a0\u2003unicode spaces\u3000",
    '{"n": 1, "s": "x\\"y"}',
    None,
]


def _cursor(kind: str) -> Any:
    if kind == "django":  # client-side binding (workers.protocol.heartbeat)
        return connection.cursor()
    return internals.prepared_cursor(connection, prepare=kind == "prepared")


@pytest.mark.django_db
@pytest.mark.parametrize("cursor_kind", ["prepared", "unnamed", "django"])
def test_array__postgres_reads_back_what_psycopg_would_send(cursor_kind: str) -> None:
    """Each kind of value the hot statements pass, through each kind of cursor."""
    ids = [uuid.UUID("6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"), uuid.uuid4()]
    when = [datetime(2026, 11, 30, 5, 9, 23, 75089, tzinfo=UTC), datetime(1, 1, 1, tzinfo=UTC)]
    cases: list[tuple[str, list[Any]]] = [
        ("text", TEXTS),
        ("uuid", ids),
        ("uuid", [str(ids[0]), str(ids[1]).upper()]),
        ("int", [1, -5, 2**31 - 1, None]),
        ("bool", [True, False, None]),
        ("timestamptz", when),
        ("int", []),
    ]
    query = "SELECT %(ours)s::{0}[] IS NOT DISTINCT FROM %(psycopg)s::{0}[], %(ours)s::{0}[]"
    with _cursor(cursor_kind) as cursor:
        for kind, values in cases:
            cursor.execute(query.format(kind), {"ours": pg.array(values), "psycopg": values})
            same, read = cursor.fetchone()
            assert same, (kind, values, read)
            assert len(read) == len(values)


def test_array__refuses_a_type_it_cannot_write() -> None:
    assert pg.array([TaskStatus.DONE, 7]) == '{"done",7}'  # enums: their values
    with pytest.raises(TypeError):
        pg.array([1.5])
