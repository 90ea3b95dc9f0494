from __future__ import annotations

import pytest
from django.db import connection

from taskforge.lib import pg

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
