"""The connection a loop LISTENs on for its wake-ups (`NOTIFY`).

LISTEN lasts as long as its session. By default a loop listens on its own
Django connection, which it keeps for its whole life (`LoopCommand`). Behind
a pooler in transaction mode that connection is no session: the server
connection behind it changes from one transaction to the next, and
notifications go to whichever client holds it then, or nowhere.  So
DATABASE_LISTEN_URL, when set, names where to listen instead (Postgres
directly, or a pooler's session-mode pool), on a connection of its own that
only ever listens.

A loop command runs without Django's pool, but a loop made inside a pooled
process (the tests make many) listens on a pooled connection.  Such a
connection goes back to the pool still listening, and whoever gets it next
reads every NOTIFY sent since as if it had just come.  `unlisten` stops it
listening and drops them: the pool's reset, set by the first Listener that
listens on one of its connections.  Not before: a pool with a reset hands every
connection given back to a thread of its own, a cost the API's pool, where
nothing listens, is spared (taskforge.lib.internals).
"""

from __future__ import annotations

import contextlib
import logging
import weakref
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection

from taskforge.lib import internals, sql

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_SECONDS = 5

# Django's connections that a Listener made LISTEN (see the module docstring).
_listening: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()


def unlisten(pg: psycopg.Connection[Any]) -> None:
    """The reset of a pool a Listener used: a connection that listened stops, and
    drops what it was sent.

    Any other connection costs a set lookup, not a round trip.
    """
    if pg not in _listening:
        return
    _listening.discard(pg)
    pg.execute(sql.UNLISTEN_ALL)
    for _ in pg.notifies(timeout=0.0):
        pass


class Listener:
    """`connection()`: a psycopg connection that is listening on `channel`."""

    def __init__(self, channel: str, application_name: str) -> None:
        self.channel = channel
        self.application_name = application_name
        self._listening_on: object = None
        self._own: psycopg.Connection[Any] | None = None

    def connection(self) -> psycopg.Connection[Any]:
        """The listening connection, (re)connected and LISTENing as needed."""
        url = settings.DATABASE_LISTEN_URL
        if url:
            if self._own is None or self._own.closed:
                own = psycopg.connect(
                    url,
                    autocommit=True,
                    connect_timeout=CONNECT_TIMEOUT_SECONDS,
                    application_name=f"{self.application_name}-listen",
                )
                try:
                    own.execute(sql.LISTEN.format(channel=self.channel))
                except BaseException:
                    own.close()
                    raise
                self._own = own
            return self._own
        connection.ensure_connection()
        pg: psycopg.Connection[Any] = connection.connection
        if self._listening_on is not pg:
            pool = getattr(connection, "pool", None)  # the postgresql backend's, if pooled
            if pool is not None:
                internals.reset_returned_connections(pool, unlisten)
            with connection.cursor() as cursor:
                cursor.execute(sql.LISTEN.format(channel=self.channel))
            _listening.add(pg)
            self._listening_on = pg
        return pg

    def ensure(self) -> None:
        """LISTEN now, before a tick looks, so a NOTIFY sent meanwhile is not missed.

        On the loop's own connection a failure is the tick's (it needs that
        connection anyway).  A listening connection of its own that cannot be
        had does not stop the tick: it is logged, and the loop works on its
        fallback tick until a later call reconnects.
        """
        if not settings.DATABASE_LISTEN_URL:
            self.connection()
            return
        try:
            self.connection()
        except psycopg.Error as exc:
            logger.warning(
                "listen.unavailable", extra={"channel": self.channel, "error": repr(exc)}
            )
            self.reset()

    def reset(self) -> None:
        """The connection broke: listen afresh at the next `connection()`."""
        self._listening_on = None
        own, self._own = self._own, None
        if own is not None:
            with contextlib.suppress(Exception):
                own.close()
        if not settings.DATABASE_LISTEN_URL:
            connection.close()
