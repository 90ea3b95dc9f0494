"""Postgres cursors for the hot paths, and the connection pool's repair after an outage."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from django.conf import settings
from django.db import connection

from taskforge.lib import internals

logger = logging.getLogger(__name__)

# At most one pool check at a time, and one a second (check_pool_soon).
_pool_check = threading.Lock()
_pool_checked_at = [0.0]
POOL_CHECK_EVERY = 1.0


@contextmanager
def cursor() -> Iterator[Any]:
    """A cursor for `tasks.sql`'s statements: prepared, and timestamptz loaded in C.

    Prepared: each statement is parsed and planned once per connection, not on
    every call (planning a hot statement cost Postgres more than running it for
    a single task).  The cursor binds parameters server side, so a parameter
    compared with a uuid or an array column needs its cast in the SQL text.

    Timestamps: Django loads every timestamptz through a Python subclass of
    psycopg's loader that pins the tzinfo to its TIME_ZONE: ~2.7 us a value,
    against ~0.13 us for psycopg's C loader, and a hand-out or ack returns eight
    per task.  Django sets each connection's session time zone to TIME_ZONE
    (UTC), and psycopg's loader builds values in the session's zone, so both
    give the same aware datetimes (tzinfo `datetime.timezone.utc`).  What this
    leans on, and its guard: taskforge.lib.internals.

    DATABASE_PREPARED_STATEMENTS off (a transaction pooler that cannot carry named
    statements between server connections): the statements run unnamed, planned
    on every call.
    """
    prepare = settings.DATABASE_PREPARED_STATEMENTS
    with internals.prepared_cursor(connection, prepare=prepare) as wrapper:
        yield wrapper


@contextmanager
def planner_off(cursor: Any, methods: Sequence[str]) -> Iterator[None]:
    """Turn these boolean planner settings (`enable_sort`, `jit`, ...) off inside the block.

    SET LOCAL, so the caller must be inside a transaction; set back (RESET)
    after the block, so they do not outlive it in a longer transaction.
    """
    for method in methods:
        cursor.execute(f"SET LOCAL {method} = off")
    try:
        yield
    finally:
        for method in methods:
            cursor.execute(f"RESET {method}")


def check_pool_soon() -> None:
    """A request met a broken or missing Postgres connection: test the pool's idle ones.

    After Postgres restarts (or a failover, or a proxy cutting idle sessions),
    every connection the pool kept is dead, and each would fail a request of
    its own with 503 before the pool dropped it.  `ConnectionPool.check()`
    takes all idle connections out at once, drops the dead ones and opens new
    ones, so that one request fails instead of one per pooled connection.  In
    a thread of its own (the request answers at once), at most one at a time
    and one a second; nothing without a pool (DATABASE_POOL_MAX=0).
    """
    now = time.monotonic()
    if now - _pool_checked_at[0] < POOL_CHECK_EVERY or not _pool_check.acquire(blocking=False):
        return
    _pool_checked_at[0] = now

    def check() -> None:
        try:
            pool = getattr(connection, "pool", None)  # the postgresql backend's
            if pool is not None:
                pool.check()
        except Exception as exc:  # the server may still be down: the next failure retries
            logger.info("pg.pool_check_failed", extra={"error": repr(exc)})
        finally:
            _pool_check.release()

    threading.Thread(target=check, name="taskforge-pool-check", daemon=True).start()
