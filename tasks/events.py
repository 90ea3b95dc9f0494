"""A task's event chain, as `/events`, the dashboard and the SDK show it.

The chain's first event, the creation (from nothing to `pending`, attempt 0,
no worker, at `created_at`), is not stored: the task row records it, and a
row of its own would be a quarter of the events table and of the work of an
enqueue (docs/operations.md, "Storage").  Every later move has its row in
`tasks_taskevent`, written in the statement of the move (tasks.transitions).

Tasks created by earlier versions of TaskForge have their creation stored;
their chain is their rows alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from tasks.models import Task, TaskEvent, TaskStatus

# The id of the creation in a chain: below every stored event's, so a cursor
# after it (taskforge.lib.keyset) continues with the stored ones.
CREATION_ID = 0


def creation(task: Task) -> TaskEvent:
    """The creation event of `task`, as its row records it."""
    return TaskEvent(
        id=CREATION_ID,
        task=task,
        queue=None,
        at=task.created_at,
        from_status=None,
        to_status=TaskStatus.PENDING,
        worker_id=None,
        attempt=0,
        error=None,
    )


def with_creation(task: Task, first: Sequence[TaskEvent]) -> list[TaskEvent]:
    """The start of `task`'s chain from its first stored events, oldest first."""
    if first and first[0].from_status is None:  # stored by an earlier version
        return list(first)
    return [creation(task), *first]


def chain(task: Task, limit: int) -> list[TaskEvent]:
    """The first `limit` events of `task`'s chain (taskevent_by_task_idx)."""
    stored = TaskEvent.objects.filter(task_id=task.pk).order_by("id")[:limit]
    return with_creation(task, list(stored))[:limit]
