"""Named tasks' IDs (API-cloudtasks.md "Names and de-duplication"): taking one, and
remembering it once its task is gone.

A name is taken while its task is not finished, and for
TASKFORGE_CLOUDTASKS_DEDUP_SECONDS after the task finished.  `tasks_taskname`
holds one row per (queue, name): `take` inserts it in the creating
transaction, so two API processes creating the same name meet at its unique
constraint (the second waits for the first to commit, then sees its row).
`forget` copies a task's `finished_at` into its name row before the task row
is deleted, so retention and discards do not shorten the memory.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection

from queues.models import Queue
from taskforge.conf import conf
from tasks import lifecycle, sql
from tasks.exceptions import NameTaken, NameUsedRecently
from tasks.models import Task, TaskName


def take(queue: Queue, name: str, task_id: Any, *, now: datetime) -> None:
    """Take `name` in `queue` for the task `task_id` being created.

    Caller contract: inside the `atomic()` that creates the task.

    Raises:
        NameTaken: a task of that name is not finished.
        NameUsedRecently: one finished less than the de-duplication window ago.
    """
    with connection.cursor() as cursor:
        cursor.execute(sql.TAKE_NAME, [queue.pk, name, task_id])
        if cursor.fetchone() is not None:
            return
    row = TaskName.objects.select_for_update().get(queue=queue, name=name)
    holder = Task.objects.filter(pk=row.task_id).values_list("status", "finished_at").first()
    if holder is not None and holder[0] in lifecycle.IN_PROGRESS:
        raise NameTaken()
    finished_at = holder[1] if holder is not None else row.released_at
    if finished_at is not None and now - finished_at < timedelta(
        seconds=conf.CLOUDTASKS_DEDUP_SECONDS
    ):
        raise NameUsedRecently()
    TaskName.objects.filter(pk=row.pk).update(task_id=task_id, released_at=None)


def holder_of(queue: Queue, name: str) -> Any:
    """The id of the task that last took `name` in `queue`, or None."""
    return TaskName.objects.filter(queue=queue, name=name).values_list("task_id", flat=True).first()


def reclaim(task: Task) -> bool:
    """Take a replayed task's name back for it; False when another live task holds it.

    Caller contract: inside `atomic()`, holding the task's row lock.
    """
    if task.name is None:
        return True
    row = (
        TaskName.objects.select_for_update().filter(queue_id=task.queue_id, name=task.name).first()
    )
    if row is None:
        TaskName.objects.create(queue_id=task.queue_id, name=task.name, task_id=task.pk)
        return True
    if row.task_id != task.pk:
        status = Task.objects.filter(pk=row.task_id).values_list("status", flat=True).first()
        if status is not None and status in lifecycle.IN_PROGRESS:
            return False
    TaskName.objects.filter(pk=row.pk).update(task_id=task.pk, released_at=None)
    return True


def forget(task_ids: Sequence[Any]) -> None:
    """Before these tasks' rows are deleted: keep on each one's name when it finished.

    Caller contract: inside the deleting `atomic()`.
    """
    with connection.cursor() as cursor:
        cursor.execute(sql.FORGET_NAMES, [list(task_ids)])
