"""Heartbeat history: when each running task last told us it was alive.

The lease itself lives in Postgres (`Task.heartbeat_at`, overwritten on every
heartbeat); this module keeps the recent past of it for the dashboard's task
page, so an operator can see a worker that heartbeats irregularly or stopped.

Storage is the cheapest thing that is durable enough for a diagnostic: one
capped Redis list per task (`tf:{<task-id>}:hb`), newest first, holding
heartbeat times in epoch milliseconds.  It is no part of dispatch (no claim,
script or reconcile reads it; losing it loses no task), so its key lives here
with its one writer and its one reader, not among the dispatch keys of
`tasks.buffer`, whose Redis connection it shares.  One pipelined round trip
records a whole heartbeat batch; the list keeps the last `KEEP` beats (ten
minutes at the workers' 10 s cadence) and expires `TTL_SECONDS` after the last
one, so finished tasks clean up after themselves.  Losing Redis loses only
this history, never a lease.

"The current attempt" is everything at or after the task's `claimed_at` (the
hand-out that started the attempt), so no attempt number is stored.

Writer: `workers.protocol.heartbeat()` calls `record(ids, now)` for the ids whose
lease it extended.  Reader: the dashboard's task page calls `history()`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime

from taskforge.lib.redisconn import REDIS_FAILURES
from tasks.buffer import get_client

logger = logging.getLogger(__name__)

KEEP = 60
TTL_SECONDS = 24 * 3600


def history_key(task_id: uuid.UUID | str) -> str:
    """The task's capped list of heartbeat times; the task id is its hash tag."""
    return f"tf:{{{task_id}}}:hb"


def record(task_ids: Iterable[uuid.UUID | str], at: datetime) -> None:
    """Append one heartbeat at `at` to each task's history, in one round trip.

    Never raises for Redis trouble: a heartbeat must not fail because its
    diagnostic trail could not be written.
    """
    stamp = int(at.timestamp() * 1000)
    try:
        pipe = get_client().pipeline(transaction=False)
        for task_id in task_ids:
            key = history_key(task_id)
            pipe.lpush(key, stamp)
            pipe.ltrim(key, 0, KEEP - 1)
            pipe.expire(key, TTL_SECONDS)
        pipe.execute()
    except REDIS_FAILURES:
        logger.warning("heartbeat history not recorded", exc_info=True)


def history(task_id: uuid.UUID | str, *, since: datetime | None = None) -> list[datetime] | None:
    """Heartbeat times of a task, newest first, at or after `since`.

    Returns None when Redis cannot be read (the page says so instead of
    showing an empty history).
    """
    try:
        raw = get_client().lrange(history_key(task_id), 0, KEEP - 1)
    except REDIS_FAILURES:
        logger.warning("heartbeat history not readable", exc_info=True)
        return None
    times = [datetime.fromtimestamp(int(value) / 1000, tz=UTC) for value in raw]
    if since is not None:
        # Millisecond resolution: a beat in the same millisecond as the claim counts.
        floor = since.replace(microsecond=since.microsecond // 1000 * 1000)
        times = [t for t in times if t >= floor]
    return times
