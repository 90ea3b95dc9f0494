"""Operator actions on the dead-letter queue: replay and discard.

The API, the dashboard and the admin all act through these.  Each takes the
`actor` and writes its audit entry in the action's transaction: one per task
replayed or discarded by id, one `{"count": n}` per queue for a bulk replay.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import QuerySet

from dlq.models import DeadLetterTask
from queues.models import Queue
from taskforge.audit.log import Actor, record
from taskforge.audit.models import Action
from taskforge.errors import NotFound
from tasks import names, transitions
from tasks.exceptions import InvalidTransition
from tasks.models import Task, TaskStatus

BATCH = 1000


class NotDead(NotFound):
    """No dead task with this id in this queue."""


def replay_one(queue: Queue, task_id: str, *, actor: Actor) -> Task:
    """dead -> pending with attempts reset.

    Raises:
        NotDead: the task is not dead in this queue.
    """
    with transaction.atomic():
        task = _dead(queue).select_for_update(no_key=True).filter(pk=task_id).first()
        if task is None:
            raise NotDead()
        task.queue = queue
        if not names.reclaim(task):
            raise InvalidTransition(
                f"Another task named {task.name!r} is on its way in this queue."
            )
        transitions.replay([task])
        record(actor, Action.DLQ_REPLAY, queue=queue.name, target=str(task.pk))
    return task


def replay_many(queue: Queue, task_ids: Sequence[str], *, actor: Actor) -> int:
    """Replay the dead ones among `task_ids`; others are skipped. Returns how many.

    Batches of short transactions; the last one writes the audit entry.
    """
    chunks = [task_ids[start : start + BATCH] for start in range(0, len(task_ids), BATCH)]
    replayed = 0
    for index, chunk in enumerate(chunks or [[]]):
        with transaction.atomic():
            replayed += _replay_locked(
                queue,
                _dead(queue)
                .select_for_update(no_key=True, skip_locked=True)
                .filter(pk__in=list(chunk))
                .order_by("id"),
            )
            if index >= len(chunks) - 1:
                _record_bulk(actor, queue, replayed)
    return replayed


def replay_all(queue: Queue, *, actor: Actor) -> int:
    """Replay every task dead in the queue, in batches of short transactions;
    the last one writes the audit entry."""
    replayed = 0
    while True:
        with transaction.atomic():
            count = _replay_locked(
                queue,
                _dead(queue)
                .select_for_update(no_key=True, skip_locked=True)
                .order_by("id")[:BATCH],
            )
            replayed += count
            if count < BATCH:
                _record_bulk(actor, queue, replayed)
                return replayed


def replay_matching(
    queues: Iterable[Queue],
    *,
    died_after: datetime | None,
    died_before: datetime | None,
    actor: Actor,
) -> int:
    """Replay every task dead in `queues` that died in (died_after, died_before).

    Without a time bound this is `replay_all` per queue; with one, the
    matching ids are read first, then replayed in batches.  A queue with no
    dead task is skipped (no audit entry).
    """
    replayed = 0
    for queue in queues:
        if not DeadLetterTask.objects.dead_now().filter(queue=queue).exists():
            continue
        if died_after is None and died_before is None:
            replayed += replay_all(queue, actor=actor)
            continue
        ids = [
            str(pk)
            for pk in DeadLetterTask.objects.dead_now()
            .filter(queue=queue)
            .died_between(died_after, died_before)
            .order_by("-died_at", "-task_id")
            .values_list("task_id", flat=True)
        ]
        replayed += replay_many(queue, ids, actor=actor)
    return replayed


def replay_selected(task_ids: Iterable[str], *, actor: Actor) -> int:
    """Replay the dead ones among `task_ids`, whatever their queues (a bulk
    replay per queue)."""
    return sum(replay_many(queue, ids, actor=actor) for queue, ids in _by_queue(task_ids).items())


def discard(queue: Queue, task_id: str, *, actor: Actor) -> None:
    """Delete a dead task for good, with its events and DLQ entry.

    Raises:
        NotDead: the task is not dead in this queue.
    """
    with transaction.atomic():
        rows = list(
            _dead(queue)
            .filter(pk=task_id)
            .select_for_update()
            .values_list("id", "queue_id", "status")
        )
        if not transitions.delete(rows):
            raise NotDead()
        record(actor, Action.DLQ_DISCARD, queue=queue.name, target=task_id)


def discard_selected(task_ids: Iterable[str], *, actor: Actor) -> int:
    """Discard the dead ones among `task_ids`, whatever their queues; return how many."""
    discarded = 0
    for queue, ids in _by_queue(task_ids).items():
        for task_id in ids:
            try:
                discard(queue, task_id, actor=actor)
            except NotDead:
                continue
            discarded += 1
    return discarded


def _dead(queue: Queue) -> QuerySet[Task]:
    return Task.objects.filter(queue=queue, status=TaskStatus.DEAD)


def _replay_locked(queue: Queue, locked: QuerySet[Task]) -> int:
    # A named task (the Cloud Tasks API's) whose name another live task holds is skipped.
    tasks = [task for task in locked if names.reclaim(task)]
    for task in tasks:
        task.queue = queue
    transitions.replay(tasks)
    return len(tasks)


def _record_bulk(actor: Actor, queue: Queue, replayed: int) -> None:
    record(actor, Action.DLQ_REPLAY, queue=queue.name, details={"count": replayed})


def _by_queue(task_ids: Iterable[str]) -> dict[Queue, list[str]]:
    """The DLQ entries among `task_ids`, grouped by queue."""
    found: dict[object, list[str]] = {}
    for task_id, queue_id in DeadLetterTask.objects.filter(task_id__in=list(task_ids)).values_list(
        "task_id", "queue_id"
    ):
        found.setdefault(queue_id, []).append(str(task_id))
    queues = Queue.objects.in_bulk(list(found))
    return {queues[queue_id]: ids for queue_id, ids in found.items()}
