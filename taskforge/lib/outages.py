"""What an unreachable store looks like: the one list behind the API's 503 and the loops' backoff.

An outage is Postgres or Redis not answering (refused, reset, timed out, shutting
down, starting up, no primary or master to be found) rather than a bug: the API
answers it 503 `unavailable` and a loop backs off and rides it out, however long
it lasts (API.md, "Durability, crashes and failover").

A Postgres server that takes a session but refuses writes (a standby, or a
primary being demoted) is one too: `target_session_attrs=read-write` keeps new
connections off it, and a connection that meets it anyway is discarded
(`discard_read_only`) so that the next one finds the primary.
"""

from __future__ import annotations

import psycopg
from django.db import InterfaceError, OperationalError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from taskforge.lib.redisconn import CLUSTER_OUTAGES

# Django's wrappers, psycopg's own (a connection outside Django's: LISTEN,
# readiness, the pusher; psycopg_pool's PoolTimeout is an OperationalError),
# and Redis's (Sentinel's MasterNotFoundError and BusyLoadingError are
# ConnectionErrors).
OUTAGES: tuple[type[BaseException], ...] = (
    OperationalError,
    InterfaceError,
    psycopg.OperationalError,
    psycopg.InterfaceError,
    RedisConnectionError,
    RedisTimeoutError,
    *CLUSTER_OUTAGES,
)


def read_only(exc: BaseException) -> bool:
    """Did a write meet a server that refuses writes (a standby)?  Django's wrapper
    or psycopg's error itself (SQLSTATE 25006)."""
    for error in _chain(exc):
        if isinstance(error, psycopg.errors.ReadOnlySqlTransaction):
            return True
    return False


def is_outage(exc: BaseException) -> bool:
    """Is `exc` Postgres or Redis being unreachable (or read-only), not a bug?"""
    return any(isinstance(error, OUTAGES) for error in _chain(exc)) or read_only(exc)


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and what it was raised from (Django wraps psycopg's errors)."""
    found: list[BaseException] = []
    error: BaseException | None = exc
    while error is not None and len(found) < 8:
        found.append(error)
        error = error.__cause__
    return found
