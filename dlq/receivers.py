"""The DLQ's own records of a task's moves, kept through `tasks.signals`.

The receivers of moves run inside the transaction of the move, so an entry
exists, and a queue's depth counts it, exactly when the move committed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from django.db.models import F, JSONField, Value

from dlq import depth
from dlq.models import DeadLetterTask
from tasks.models import Task


def on_dead_lettered(
    sender: Any, *, tasks: Sequence[Task], error: str, now: datetime, **kwargs: Any
) -> None:
    """One entry per task: a replayed task that dies again updates its entry."""
    for task in tasks:
        fields = {
            "queue_id": task.queue_id,
            # A Cloud Tasks task has no payload: JSON null, not SQL NULL.
            "payload": Value(None, JSONField()) if task.payload is None else task.payload,
            "last_error": error,
            "attempts": task.attempts,
            "died_at": now,
        }
        died_again = DeadLetterTask.objects.filter(task=task).update(
            deaths=F("deaths") + 1, **fields
        )
        if not died_again:
            DeadLetterTask.objects.create(task=task, deaths=1, **fields)
    depth.record(Counter(task.queue_id for task in tasks))


def on_replayed(sender: Any, *, tasks: Sequence[Task], now: datetime, **kwargs: Any) -> None:
    """The entry records each replay; the tasks leave their queues' depths."""
    DeadLetterTask.objects.filter(task__in=[task.pk for task in tasks]).update(
        replayed_at=now, replay_count=F("replay_count") + 1
    )
    depth.record({queue_id: -n for queue_id, n in Counter(t.queue_id for t in tasks).items()})


def on_dead_deleted(sender: Any, *, dead: Mapping[Any, int], **kwargs: Any) -> None:
    """Deleted dead tasks leave their queues' depths (their entries cascade)."""
    depth.record({queue_id: -n for queue_id, n in dead.items()})


def on_upkeep(sender: Any, **kwargs: Any) -> None:
    """The watchdog's round: the depth rows folded, and now and then checked."""
    depth.keep()


def on_dlq_depths(
    sender: Any, *, queue_ids: Sequence[uuid.UUID], **kwargs: Any
) -> dict[uuid.UUID, int]:
    """The DLQ depth of each queue, for tasks.stats."""
    return depth.depths(queue_ids)
