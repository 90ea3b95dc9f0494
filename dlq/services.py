"""Operator actions on the dead-letter queue: replay and discard."""

from __future__ import annotations

from collections.abc import Sequence

from django.db import transaction
from django.db.models import QuerySet
from django.http import Http404

from queues.models import Queue
from tasks import transitions
from tasks.models import Task, TaskStatus

BATCH = 1000


def replay_one(queue: Queue, task_id: str) -> Task:
    """dead -> pending with attempts reset.

    Raises:
        Http404: the task is not dead in this queue.
    """
    with transaction.atomic():
        task = (
            Task.objects.select_for_update(no_key=True)
            .filter(queue=queue, status=TaskStatus.DEAD, pk=task_id)
            .first()
        )
        if task is None:
            raise Http404("No dead task with this id in this queue.")
        task.queue = queue
        transitions.replay([task])
    return task


def replay_many(queue: Queue, task_ids: Sequence[str]) -> int:
    """Replay the dead ones among `task_ids`; others are skipped. Returns how many."""
    replayed = 0
    for start in range(0, len(task_ids), BATCH):
        chunk = list(task_ids[start : start + BATCH])
        with transaction.atomic():
            replayed += _replay_locked(
                queue,
                Task.objects.select_for_update(no_key=True, skip_locked=True)
                .filter(queue=queue, status=TaskStatus.DEAD, pk__in=chunk)
                .order_by("id"),
            )
    return replayed


def replay_all(queue: Queue) -> int:
    """Replay every task dead in the queue, in batches of short transactions."""
    replayed = 0
    while True:
        with transaction.atomic():
            count = _replay_locked(
                queue,
                Task.objects.select_for_update(no_key=True, skip_locked=True)
                .filter(queue=queue, status=TaskStatus.DEAD)
                .order_by("id")[:BATCH],
            )
        replayed += count
        if count < BATCH:
            return replayed


def _replay_locked(queue: Queue, locked: QuerySet[Task]) -> int:
    tasks = list(locked)
    for task in tasks:
        task.queue = queue
    transitions.replay(tasks)
    return len(tasks)


def discard(queue: Queue, task_id: str) -> None:
    """Delete a dead task for good, with its events and DLQ entry.

    Raises:
        Http404: the task is not dead in this queue.
    """
    with transaction.atomic():
        deleted, _ = (
            Task.objects.filter(queue=queue, status=TaskStatus.DEAD, pk=task_id)
            .select_for_update()
            .delete()
        )
        if not deleted:
            raise Http404("No dead task with this id in this queue.")
