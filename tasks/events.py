"""A task's event chain, as `/events`, the dashboard and the SDK show it.

Two moves of a task are not stored as event rows, because the task row
records them, and each would be a row per task in the events table and in
the work of an enqueue (docs/operations.md, "Storage"):

- its creation (from nothing to `pending`, attempt 0, no worker), at
  `created_at`;
- for a task put into the dispatch buffer by its enqueue (a due task of a
  running queue with room, tasks.sql CREATE), that move (`pending` to
  `claimed`, attempt 0, no worker), at the same instant.  Such a task is
  known by its first stored event (`tasks.lifecycle.moves_of_row`).

Every later move has its row in `tasks_taskevent`, written in the statement
of the move (tasks.transitions).  Tasks created by earlier versions of
TaskForge have these rows stored; their chain is their rows alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasks.lifecycle import moves_of_row
from tasks.models import Task, TaskEvent

# The ids of the unstored events in a chain: below every stored event's (a
# sequence from 1), so a cursor after either (taskforge.lib.keyset) continues
# with the events that follow it.
CREATION_ID = -2
BUFFERED_ID = -1


def _event(task: Task, pk: int, from_status: str | None, to_status: str) -> TaskEvent:
    return TaskEvent(
        id=pk,
        task=task,
        queue=None,
        at=task.created_at,
        from_status=from_status,
        to_status=to_status,
        worker_id=None,
        attempt=0,
        error=None,
    )


def unstored(task: Task, first: Sequence[TaskEvent]) -> list[TaskEvent]:
    """The events of `task` its row records, given its first stored events (or
    none: the first few, or all if fewer), oldest first."""
    first_stored = (first[0].from_status, first[0].to_status) if first else None
    return [
        _event(task, pk, *move)
        for pk, move in zip(
            (CREATION_ID, BUFFERED_ID), moves_of_row(task.status, first_stored), strict=False
        )
    ]


def with_unstored(
    task: Task, first: Sequence[TaskEvent], after: int | None = None
) -> list[TaskEvent]:
    """`first`, a page of stored events after the event id `after` (None: from
    the start), with the unstored events that come after `after` before them."""
    if after is not None and after >= 0:
        return list(first)
    return [e for e in unstored(task, first) if after is None or e.pk > after] + list(first)


def chain(task: Task, limit: int) -> list[TaskEvent]:
    """The first `limit` events of `task`'s chain (taskevent_by_task_idx)."""
    stored = TaskEvent.objects.filter(task_id=task.pk).order_by("id")[:limit]
    return with_unstored(task, list(stored))[:limit]
