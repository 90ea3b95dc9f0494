"""Queue administration: the writes behind the /queues endpoints."""

from __future__ import annotations

import logging
from typing import Any

from django.db import IntegrityError, connection, transaction
from redis.exceptions import RedisError

from queues.exceptions import QueueExists, QueueNotEmpty
from queues.models import Queue
from tasks import sql, transitions
from tasks.buffer import get_buffer
from tasks.models import LIVE_STATUSES, Task, TaskStatus

logger = logging.getLogger(__name__)

PURGE_BATCH = 1000


def create_queue(name: str, **fields: Any) -> Queue:
    """Raises: QueueExists."""
    try:
        with transaction.atomic():
            return Queue.objects.create(name=name, **fields)
    except IntegrityError as exc:
        raise QueueExists(f"A queue named {name!r} exists already.") from exc


def update_queue(queue: Queue, **fields: Any) -> Queue:
    """Change a queue's settings; resuming it wakes the dispatchers at once."""
    if fields:
        for name, value in fields.items():
            setattr(queue, name, value)
        with transaction.atomic():
            queue.save(update_fields=list(fields))
            if fields.get("paused") is False:
                with connection.cursor() as cursor:
                    cursor.execute(sql.NOTIFY_DISPATCH, {"queue_id": str(queue.id)})
    return queue


def delete_queue(queue: Queue) -> None:
    """Delete a queue with no live task; its done and cancelled tasks go with it.

    Raises: QueueNotEmpty.
    """
    with transaction.atomic():
        # Lock the queue first (lock order: queue, then tasks) so no enqueue
        # slips in between the check and the delete.
        Queue.objects.select_for_update().get(pk=queue.pk)
        if Task.objects.filter(queue=queue, status__in=LIVE_STATUSES).exists():
            raise QueueNotEmpty()
        queue_id = queue.pk
        queue.delete()
        transaction.on_commit(lambda: _forget_buffer(queue_id))


def _forget_buffer(queue_id: object) -> None:
    """Drop the deleted queue's Redis keys (its token bucket); Redis down: they expire."""
    try:
        get_buffer().forget_queue(str(queue_id))
    except RedisError:
        logger.warning("queue.buffer_not_forgotten", extra={"queue_id": str(queue_id)})


def purge_queue(queue: Queue) -> int:
    """Cancel every pending, claimed and retry task; return how many.

    Works in batches of short transactions so a large purge does not hold a
    lock on every task of a big queue at once.
    """
    cancelled = 0
    while True:
        with transaction.atomic():
            batch = list(
                # Lock order: by id, so two purges cannot deadlock.
                Task.objects.select_for_update()
                .filter(
                    queue=queue,
                    status__in=[TaskStatus.PENDING, TaskStatus.CLAIMED, TaskStatus.RETRY],
                )
                .order_by("id")[:PURGE_BATCH]
            )
            for task in batch:
                task.queue = queue
            transitions.cancel(batch)
        cancelled += len(batch)
        if len(batch) < PURGE_BATCH:
            return cancelled
