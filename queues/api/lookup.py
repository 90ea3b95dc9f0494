"""Resolving the queue named in a URL, for every view under /queues/:name."""

from __future__ import annotations

from typing import Any

from queues import lookup
from queues.exceptions import UnknownQueue
from queues.models import Queue, is_queue_name


def queue_named(name: str, *, fresh: bool = True) -> Queue:
    """The queue named `name` in a URL; `fresh=False` (enqueue) may answer from
    `queues.lookup`'s cache.

    Raises: UnknownQueue (404).
    """
    # A name no queue can have (NUL, say) is not sent to Postgres at all.
    if not is_queue_name(name):
        raise UnknownQueue()
    queue = lookup.by_name(name, fresh=fresh)
    if queue is None:
        raise UnknownQueue()
    return queue


class QueueLookupMixin:
    """Resolves the `name` URL argument to a queue, or 404."""

    kwargs: dict[str, Any]

    def get_queue(self, *, fresh: bool = True) -> Queue:
        """The queue; `fresh=False` (enqueue) may answer from `queues.lookup`'s cache."""
        return queue_named(self.kwargs["name"], fresh=fresh)
