"""Read queries of the task inspector and the DLQ browser.

Both lists are newest first and keyset-paginated, so a page costs one index
range scan however deep it is and nothing ever counts the matching rows:

- tasks, one queue: task_queue_created_idx (queue, -created_at, -id), or
  task_not_done_idx (queue, status, -created_at, -id; every status but done)
  with a status other than done (with sorting off: pg.ORDERED_BY_INDEX);
- tasks, one worker: task_claimed_by_idx (claimed_by, -created_at);
- tasks, all queues: one `LIMIT n` branch per queue on the same indexes, glued
  with UNION ALL and cut to n again (Postgres cannot merge an index across the
  queue prefix by itself, and sorting all tasks of every queue would read the
  whole table);
- DLQ entries: dlq_queue_died_idx (queue, -died_at), the same way.

Cursors and the cut after them are `taskforge.lib.keyset`'s, as in the API.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db.models import Model, Q, QuerySet

from dlq import depth
from dlq.models import DeadLetterTask
from queues.models import Queue
from taskforge.lib import keyset, pg
from tasks.models import Task

PAGE_SIZE = 50
# Columns the task list shows; payload and result can be large and stay out.
TASK_LIST_FIELDS = (
    "id",
    "queue",
    "status",
    "priority",
    "attempts",
    "max_retries",
    "claimed_by",
    "last_error",
    "created_at",
    "updated_at",
    "scheduled_at",
)
DLQ_LIST_FIELDS = (
    "task",
    "queue",
    "last_error",
    "attempts",
    "died_at",
    "replayed_at",
    "replay_count",
)


BadCursor = keyset.BadCursor


@dataclass(frozen=True, slots=True)
class TaskFilter:
    queue: Queue | None = None
    status: str | None = None
    worker_id: str | None = None
    created_after: datetime | None = None  # exclusive, as the API's filters
    created_before: datetime | None = None
    cursor: str | None = None
    fairness_key: str | None = None


@dataclass(frozen=True, slots=True)
class Page:
    rows: list[Any]
    next_cursor: str | None


def _after(time_field: str, pk_field: str, cursor: str | None) -> Q:
    """Raises: BadCursor."""
    if cursor is None:
        return Q()
    ordering = [f"-{time_field}", f"-{pk_field}"]
    at, pk = keyset.decode(cursor, 2)
    if not isinstance(at, datetime) or not isinstance(pk, str):
        raise BadCursor()
    try:
        return keyset.after(ordering, [at, uuid.UUID(pk)])
    except ValueError as exc:
        raise BadCursor() from exc


def _newest_first(
    per_queue: QuerySet[Any],
    queue_ids: Sequence[uuid.UUID],
    order: Sequence[str],
    limit: int,
) -> list[Any]:
    """The newest `limit` rows of `per_queue` over `queue_ids`, one branch per queue."""
    branches = [per_queue.filter(queue_id=qid).order_by(*order)[:limit] for qid in queue_ids]
    if not branches:
        return []
    if len(branches) == 1:
        return list(branches[0])
    return list(branches[0].union(*branches[1:], all=True).order_by(*order)[:limit])


def _page(rows: Sequence[Model], limit: int, time_field: str, pk_field: str) -> Page:
    shown = list(rows[:limit])
    if len(rows) <= limit:
        return Page(shown, None)
    return Page(shown, keyset.cursor_of(shown[-1], [f"-{time_field}", f"-{pk_field}"]))


def task_page(filters: TaskFilter, *, limit: int | None = None) -> Page:
    """One page of tasks matching `filters`, newest first.

    Raises: BadCursor.
    """
    limit = limit or PAGE_SIZE
    tasks = Task.objects.only(*TASK_LIST_FIELDS)
    if filters.status:
        tasks = tasks.filter(status=filters.status)
    if filters.created_after:
        tasks = tasks.filter(created_at__gt=filters.created_after)
    if filters.created_before:
        tasks = tasks.filter(created_at__lt=filters.created_before)
    if filters.fairness_key:
        tasks = tasks.filter(fairness_key=filters.fairness_key)
    tasks = tasks.filter(_after("created_at", "id", filters.cursor))
    order = ("-created_at", "-id")
    if filters.worker_id:
        tasks = tasks.filter(claimed_by=filters.worker_id)
        if filters.queue is not None:
            tasks = tasks.filter(queue=filters.queue)
        rows = list(tasks.order_by(*order)[: limit + 1])
    else:
        queue_ids = (
            [filters.queue.pk]
            if filters.queue is not None
            else list(Queue.objects.order_by("name").values_list("id", flat=True))
        )
        with pg.planned_without(pg.ORDERED_BY_INDEX if filters.status else ()):
            rows = _newest_first(tasks, queue_ids, order, limit + 1)
    return _page(rows, limit, "created_at", "id")


@dataclass(frozen=True, slots=True)
class DlqFilter:
    queue: Queue | None = None
    died_after: datetime | None = None  # exclusive
    died_before: datetime | None = None
    cursor: str | None = None


def dlq_entries(filters: DlqFilter) -> QuerySet[DeadLetterTask]:
    """Entries of tasks dead now (a replayed task keeps its entry) matching `filters`."""
    entries = DeadLetterTask.objects.dead_now().died_between(
        filters.died_after, filters.died_before
    )
    if filters.queue is not None:
        entries = entries.filter(queue=filters.queue)
    return entries


def dlq_page(filters: DlqFilter, *, limit: int | None = None) -> Page:
    """One page of DLQ entries, most recent death first.

    Raises: BadCursor.
    """
    limit = limit or PAGE_SIZE
    entries = (
        dlq_entries(filters)
        .only(*DLQ_LIST_FIELDS)
        .filter(_after("died_at", "task_id", filters.cursor))
    )
    queue_ids = (
        [filters.queue.pk]
        if filters.queue is not None
        else list(Queue.objects.order_by("name").values_list("id", flat=True))
    )
    rows = _newest_first(entries, queue_ids, ("-died_at", "-task_id"), limit + 1)
    return _page(rows, limit, "died_at", "task_id")


def dlq_depths() -> list[tuple[Queue, int]]:
    """Every queue with its number of dead tasks: the per-queue depths dlq.depth
    keeps, a few rows each, whatever the size of the DLQ."""
    queues = list(Queue.objects.order_by("name"))
    depths = depth.depths(queue.pk for queue in queues)
    return [(queue, depths[queue.pk]) for queue in queues]
