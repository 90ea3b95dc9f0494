"""Queue rows for the hot paths: enqueue, claim, and the tasks a worker call moves.

Each of those requests names its queues, and every task it moves needs its
queue's name for the response and the log line; reading the rows each time
would cost a query per request.  Rows are remembered per process for
QUEUE_CACHE_SECONDS.  A change made in this process shows at once (saving or
deleting a queue forgets it); one made in another process within that time.
What a stale row can do is bounded: a pause is enforced by the hand-out SQL
itself, an enqueue into a queue deleted meanwhile fails its foreign key (404),
and a new rate limit or `max_retries` default applies everywhere within the
second.  The rows returned are shared: read them, never modify them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from queues.models import Queue
from taskforge.lib.ttlcache import TTLCache

QUEUE_CACHE_SECONDS = 1.0

_by_name: TTLCache[Queue] = TTLCache(QUEUE_CACHE_SECONDS)
_by_id: TTLCache[Queue] = TTLCache(QUEUE_CACHE_SECONDS)


def by_names(names: Iterable[str]) -> dict[str, Queue]:
    """The queues of those names that exist, in one query for the ones not remembered."""
    found: dict[str, Queue] = {}
    missing = set()
    for name in names:
        queue = _by_name.get(name)
        if queue is None:
            missing.add(name)
        else:
            found[name] = queue
    if missing:
        for queue in Queue.objects.filter(name__in=missing):
            _remember(queue)
            found[queue.name] = queue
    return found


def by_name(name: str) -> Queue | None:
    return by_names([name]).get(name)


def by_ids(ids: Iterable[Any], *, fresh: bool = False) -> dict[Any, Queue]:
    """The queues of those ids that exist, keyed by id; `fresh` reads them all anew."""
    found: dict[Any, Queue] = {}
    missing = set()
    for queue_id in ids:
        queue = None if fresh else _by_id.get(queue_id)
        if queue is None:
            missing.add(queue_id)
        else:
            found[queue_id] = queue
    if missing:
        for queue in Queue.objects.filter(pk__in=missing):
            _remember(queue)
            found[queue.pk] = queue
    return found


def forget(queue: Queue) -> None:
    _by_name.forget(queue.name)
    _by_id.forget(queue.pk)


def clear() -> None:
    _by_name.clear()
    _by_id.clear()


def _remember(queue: Queue) -> None:
    _by_name.put(queue.name, queue)
    _by_id.put(queue.pk, queue)
