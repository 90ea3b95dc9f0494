"""Queue settings: creating a queue and changing it.

Deleting and purging a queue act on its tasks: `tasks.services` has them.
"""

from __future__ import annotations

from typing import Any

from django.db import IntegrityError, transaction

from queues.exceptions import QueueExists
from queues.models import Queue
from queues.notify import wake_dispatchers


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
                wake_dispatchers([queue.id])
    return queue
