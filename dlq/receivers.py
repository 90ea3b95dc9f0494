"""The DLQ's own records of a task's moves, kept through `tasks.signals`.

Both receivers run inside the transaction of the move, so an entry exists
exactly when the move committed.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db.models import F

from dlq.models import DeadLetterTask
from tasks.models import Task


def on_dead_lettered(
    sender: Any, *, tasks: Sequence[Task], error: str, now: datetime, **kwargs: Any
) -> None:
    """One entry per task: a replayed task that dies again updates its entry."""
    for task in tasks:
        fields = {
            "queue_id": task.queue_id,
            "payload": task.payload,
            "last_error": error,
            "attempts": task.attempts,
            "died_at": now,
        }
        died_again = DeadLetterTask.objects.filter(task=task).update(
            deaths=F("deaths") + 1, **fields
        )
        if not died_again:
            DeadLetterTask.objects.create(task=task, deaths=1, **fields)


def on_replayed(sender: Any, *, tasks: Sequence[Task], now: datetime, **kwargs: Any) -> None:
    """The entry records each replay."""
    DeadLetterTask.objects.filter(task__in=[task.pk for task in tasks]).update(
        replayed_at=now, replay_count=F("replay_count") + 1
    )
