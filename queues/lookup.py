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

from collections.abc import Callable, Iterable
from typing import Any

from queues.models import Queue
from taskforge.lib.ttlcache import TTLCache

QUEUE_CACHE_SECONDS = 1.0

_by_name: TTLCache[Queue] = TTLCache(QUEUE_CACHE_SECONDS)
_by_id: TTLCache[Queue] = TTLCache(QUEUE_CACHE_SECONDS)


def by_names(names: Iterable[str], *, fresh: bool = False) -> dict[str, Queue]:
    """The queues of those names that exist, in one query for the ones not remembered
    (`fresh`: for all of them)."""
    return _lookup(
        _by_name,
        names,
        lambda missing: Queue.objects.filter(name__in=missing),
        "name",
        fresh=fresh,
    )


def by_name(name: str, *, fresh: bool = False) -> Queue | None:
    return by_names([name], fresh=fresh).get(name)


def by_ids(ids: Iterable[Any], *, fresh: bool = False) -> dict[Any, Queue]:
    """The queues of those ids that exist, keyed by id; `fresh` reads them all anew."""
    return _lookup(
        _by_id, ids, lambda missing: Queue.objects.filter(pk__in=missing), "pk", fresh=fresh
    )


def forget(queue: Queue) -> None:
    _by_name.forget(queue.name)
    _by_id.forget(queue.pk)


def clear() -> None:
    _by_name.clear()
    _by_id.clear()


def _lookup(
    cache: TTLCache[Queue],
    keys: Iterable[Any],
    fetch: Callable[[set[Any]], Iterable[Queue]],
    key_attribute: str,
    *,
    fresh: bool = False,
) -> dict[Any, Queue]:
    found: dict[Any, Queue] = {}
    missing = set()
    for key in keys:
        queue = None if fresh else cache.get(key)
        if queue is None:
            missing.add(key)
        else:
            found[key] = queue
    if missing:
        for queue in fetch(missing):
            _remember(queue)
            found[getattr(queue, key_attribute)] = queue
    return found


def _remember(queue: Queue) -> None:
    _by_name.put(queue.name, queue)
    _by_id.put(queue.pk, queue)
