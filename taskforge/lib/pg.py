"""Postgres cursors for the hot paths, and the connection pool's repair after an outage."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from django.conf import settings
from django.db import DEFAULT_DB_ALIAS, connections, transaction

from taskforge.lib import internals, sql

logger = logging.getLogger(__name__)

# At most one pool check at a time, and one a second (check_pool_soon).
_pool_check = threading.Lock()
_pool_checked_at = [0.0]
POOL_CHECK_EVERY = 1.0
# How many times a request met a broken connection (check_pool_soon): a connection
# a thread kept outside the pool before that (taskforge.api.lane.Parking) may be
# dead too, and is not used again.
_broken = [0]


def broken_seen() -> int:
    """A number that changes whenever a request meets a broken connection."""
    return _broken[0]


def own_params() -> dict[str, Any]:
    """psycopg's connection parameters for the default database, outside Django's
    connection and pool: Django's, without its cursor class and adapters."""
    params = connections[DEFAULT_DB_ALIAS].get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return params


def connect_own(**options: Any) -> psycopg.Connection[Any]:
    """A psycopg connection of its own to the default database (`own_params`),
    `options` (autocommit, connect_timeout, ...) over its parameters."""
    return psycopg.connect(**{**own_params(), **options})


@contextmanager
def cursor() -> Iterator[Any]:
    """A cursor for `tasks.sql`'s statements: prepared, and timestamptz loaded in C.

    Prepared: each statement is parsed and planned once per connection, not on
    every call (planning a hot statement cost Postgres more than running it for
    a single task).  The cursor binds parameters server side, so a parameter
    compared with a uuid or an array column needs its cast in the SQL text.
    The connection runs them with their generic plans (`_generic_plans`).

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
    # This thread's connection itself: each attribute read through the
    # `django.db.connection` proxy looks the connection up again (asgiref's
    # Local), half a dozen times per cursor.
    connection = connections[DEFAULT_DB_ALIAS]
    with internals.prepared_cursor(connection, prepare=prepare) as wrapper:
        if prepare:
            _generic_plans(connection)
        yield wrapper


def _generic_plans(connection: Any) -> None:
    """Once per connection: its prepared statements run their generic plans.

    Left to choose (`plan_cache_mode` auto), Postgres compared a statement's
    generic plan with the plans made for its first five calls' values, and
    for the hand-out and the ack (an array of one id) kept planning every
    call anew: a third of a single-path task's Postgres CPU (`bench/pg_cost.py`,
    interleaved: 1.41/1.43 -> 0.82/0.88 ms per task).  Their generic plans
    are the ones tasks/tests/test_plans.py checks, under every statistics.
    Only prepared statements have a plan cache: Django's own queries, bound
    client side, are unaffected.

    Set outside a transaction (one whose rollback would undo it), so the
    first call inside one leaves it to the next.  Behind a transaction pooler
    that carries prepared statements it lands on whichever server connection
    runs it, and only its prepared statements see it.
    """
    raw = connection.connection
    if getattr(raw, "_taskforge_generic_plans", False):
        return
    if not raw.autocommit or raw.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        return
    with connection.wrap_database_errors:
        raw.execute(sql.GENERIC_PLANS)
    raw._taskforge_generic_plans = True


@contextmanager
def planner_off(cursor: Any, methods: Sequence[str]) -> Iterator[None]:
    """Turn these planner settings off inside the block: a boolean by its name
    (`enable_sort`, `jit`, ...), another as `name=value` (NO_PARALLEL).

    SET LOCAL, so the caller must be inside a transaction; set back (RESET)
    after the block, so they do not outlive it in a longer transaction.
    """
    settings = [method.partition("=")[::2] for method in methods]
    for name, value in settings:
        cursor.execute(sql.SET_LOCAL.format(name=name, value=value or "off"))
    try:
        yield
    finally:
        for name, _ in settings:
            cursor.execute(sql.RESET.format(name=name))


# The task lists (API and dashboard) filtered by a live status: with sorting
# off, the one plan is the walk of task_not_done_idx (queue, status,
# -created_at, -id) that stops after a page.  Allowed to sort, the planner
# reads every task of that status in every queue through that status's own
# partial index (task_pending_sched_idx, task_claimed_since_idx) and sorts
# them, as soon as the statistics say the status is rare (on a server with
# history they do): 220 ms for a page with 50,000 pending tasks in other
# queues.  jit too: a plan that must sort (a list over all queues) carries the
# penalty cost, which would otherwise buy it a JIT compilation.  And no
# parallel workers (NO_PARALLEL, below).
ORDERED_BY_INDEX = ("enable_sort", "jit", "max_parallel_workers_per_gather=0")

# Reads whose plan is one index walk that stops early, where a wrong estimate
# buys parallel workers: on a server with history, the statistics guess that
# tens of thousands of a queue's tasks are live (the share of its history
# times the share of live tasks), and the stats' count planned two parallel
# workers to read an empty range: 13 ms of starting them on an idle 2-core
# machine for a 0.1 ms scan, and 600 ms and more under load.
NO_PARALLEL = ("max_parallel_workers_per_gather=0",)


@contextmanager
def planned_without(methods: Sequence[str], using: str = DEFAULT_DB_ALIAS) -> Iterator[None]:
    """Run the block's queries with these planner settings off (`planner_off`),
    in a transaction (or savepoint) of its own; with none, as they are."""
    if not methods:
        yield
        return
    with transaction.atomic(using=using), connections[using].cursor() as cursor:
        with planner_off(cursor, methods):
            yield


def discard_connection(using: str = DEFAULT_DB_ALIAS) -> None:
    """This thread's connection met a server that refuses writes (a standby, or a
    primary on its way down): close it, so that the pool drops it rather than hand
    it out again, and the next connection, made with `target_session_attrs`, finds
    the primary.  Inside a transaction Django closes it at the block's end."""
    wrapper = connections[using]
    raw = wrapper.connection
    if raw is not None:
        try:
            raw.close()
        except Exception as exc:  # closing a broken connection may fail; it is gone anyway
            logger.debug("pg.discard_failed", extra={"error": repr(exc)})
    if not wrapper.in_atomic_block:
        wrapper.close()


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
    _broken[0] += 1
    now = time.monotonic()
    if now - _pool_checked_at[0] < POOL_CHECK_EVERY or not _pool_check.acquire(blocking=False):
        return
    _pool_checked_at[0] = now

    def check() -> None:
        try:
            pool = getattr(connections[DEFAULT_DB_ALIAS], "pool", None)  # the postgresql backend's
            if pool is not None:
                pool.check()
        except Exception as exc:  # the server may still be down: the next failure retries
            logger.info("pg.pool_check_failed", extra={"error": repr(exc)})
        finally:
            _pool_check.release()

    threading.Thread(target=check, name="taskforge-pool-check", daemon=True).start()


def array(values: Iterable[Any]) -> str:
    """`values` as the text of a Postgres array, for a parameter whose statement
    casts it (`%(ids)s::uuid[]`, `%(payloads)s::text[]`, ...).

    psycopg dumps a list parameter element by element in Python: it picks a
    dumper for the list from its elements, then dumps each one, tests it
    against a regex and escapes it (~1.8 us an element: a batch enqueue's
    seven arrays of 1000 cost more than its INSERT).  This writes the text
    Postgres reads: a string in double quotes with its backslashes and double
    quotes escaped (read back as it was, whatever it holds: commas, braces,
    spaces, "NULL"), None as NULL, and integers, booleans, UUIDs and aware
    datetimes as they print, which never need quotes.

    Raises:
        TypeError: a value of another type.
    """
    return "{" + ",".join([_element(value) for value in values]) + "}"


def _quoted(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


_ELEMENT: dict[type, Callable[[Any], str]] = {
    str: _quoted,
    int: int.__repr__,
    bool: lambda value: "t" if value else "f",
    uuid.UUID: uuid.UUID.__str__,
    datetime: datetime.isoformat,
    type(None): lambda value: "NULL",
}


def _element(value: Any) -> str:
    write = _ELEMENT.get(type(value))
    if write is None:  # a subclass (a str enum, an int enum, a datetime subclass)
        for kind in (bool, int, str, uuid.UUID, datetime):
            if isinstance(value, kind):
                write = _ELEMENT[kind]
                break
        else:
            raise TypeError(f"no Postgres array text for {type(value).__name__}")
    return write(value)
