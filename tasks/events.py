"""A task's event chain, as `/events`, the dashboard and the SDK show it.

Three moves of a task are not stored as event rows of their own, because
other rows record them, and each would be a row per task in the events table
and in the work of a statement on the hot path (docs/operations.md, "Storage"):

- its creation (from nothing to `pending`, attempt 0, no worker), at
  `created_at` of the task row;
- for a task put into the dispatch buffer by its enqueue (a due task of a
  running queue with room, tasks.sql CREATE), that move (`pending` to
  `claimed`, attempt 0, no worker), at the same instant.  Such a task is
  known by the first move of the rest of its chain
  (`tasks.lifecycle.moves_of_row`);
- each attempt's hand-out (`claimed` to `executing`): the event row of the
  attempt's outcome (done, retry or dead: the one move out of `executing`)
  records it in `claimed_at`, with the outcome's worker and attempt; while
  the attempt runs, the task row records it (`claimed_at`, `claimed_by`,
  `attempts`).

Every other move has its row in `tasks_taskevent`, written in the statement
of the move (tasks.transitions).  Tasks moved by earlier versions have some
of these stored as rows; a chain reads both shapes.

Each event has a key, its place in the chain and the events list's cursor:
`(row id, CLAIM_HALF)` for the claim an outcome row records, `(row id, 1)`
for a row's own move, negative row ids for the task row's creation and
buffering, and for the running attempt's claim the row id after the last
stored one.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from tasks.lifecycle import CLAIM, moves_of_row
from tasks.models import Task, TaskEvent, TaskStatus

S = TaskStatus

# The keys of the task row's creation and buffering: below every stored row's
# (a sequence from 1).
CREATION_KEY = (-2, 1)
BUFFERED_KEY = (-1, 1)
CLAIM_HALF = 0
MOVE_HALF = 1

Key = tuple[int, int]


def _event(
    task: Task,
    key: Key,
    move: tuple[str | None, str],
    *,
    at: datetime | None = None,
    worker_id: str | None = None,
    attempt: int = 0,
) -> TaskEvent:
    event = TaskEvent(
        id=None,
        task=task,
        queue=None,
        at=task.created_at if at is None else at,
        from_status=move[0],
        to_status=move[1],
        worker_id=worker_id,
        attempt=attempt,
        error=None,
    )
    event.key = key
    return event


def _stored(task: Task, rows: Sequence[TaskEvent]) -> list[TaskEvent]:
    """The events of stored rows (in id order): a row of an attempt's outcome
    stands for its claim and itself."""
    events: list[TaskEvent] = []
    for row in rows:
        claim_stored = bool(events) and events[-1].to_status == S.EXECUTING
        if row.claimed_at is not None and not claim_stored:
            # (A claim stored as a row of its own, by a version before the
            # outcome rows recorded it, is not shown twice.)
            events.append(
                _event(
                    task,
                    (row.pk, CLAIM_HALF),
                    CLAIM,
                    at=row.claimed_at,
                    worker_id=row.worker_id,
                    attempt=row.attempt,
                )
            )
        row.key = (row.pk, MOVE_HALF)
        events.append(row)
    return events


def _running_claim(task: Task, rows: Sequence[TaskEvent]) -> TaskEvent | None:
    """The claim of the attempt `task` runs, which its row records, after `rows`,
    the last of its stored rows (or none).  None when the task is not executing
    or a row records that claim (a row of an earlier version's, or the
    attempt's outcome, committed after `task` was read)."""
    if task.status != S.EXECUTING or task.claimed_at is None:
        return None
    if rows and (
        rows[-1].to_status == S.EXECUTING
        or (rows[-1].from_status == S.EXECUTING and rows[-1].attempt == task.attempts)
    ):
        return None
    return _event(
        task,
        ((rows[-1].pk if rows else 0) + 1, CLAIM_HALF),
        CLAIM,
        at=task.claimed_at,
        worker_id=task.claimed_by,
        attempt=task.attempts,
    )


def events_of(
    task: Task, rows: Sequence[TaskEvent], *, head: bool = True, to_end: bool = True
) -> list[TaskEvent]:
    """The events that `rows`, stored rows of `task` in id order, stand for, oldest first.

    `head`: the rows are the first of the task's (none before them), and the
    events the task row records before them come first.  `to_end`: no row of
    the task follows them, and the claim of the attempt it runs, if any, ends
    the list.
    """
    events = _stored(task, rows)
    if to_end and (running := _running_claim(task, rows)) is not None:
        events.append(running)
    if not head:
        return events
    first = (events[0].from_status, events[0].to_status) if events else None
    unstored = [
        _event(task, key, move)
        for key, move in zip(
            (CREATION_KEY, BUFFERED_KEY), moves_of_row(task.status, first), strict=False
        )
    ]
    return unstored + events


def page(task: Task, after: tuple[int, ...] | None, limit: int) -> list[TaskEvent]:
    """Up to `limit` + 1 events of `task`'s chain after the key `after` (None:
    from the start), oldest first (taskevent_by_task_idx)."""
    rows = TaskEvent.objects.filter(task_id=task.pk)
    head = after is None or after[0] <= 0
    if after is not None and not head:
        # From the cursor's own row: a cursor on a claim half continues with
        # its row's move, and the last row read tells whether the running
        # attempt's claim is stored.
        rows = rows.filter(id__gte=after[0])
    stored = list(rows.order_by("id")[: limit + 2])
    events = events_of(task, stored, head=head, to_end=len(stored) <= limit + 1)
    if after is not None:
        events = [e for e in events if e.key > after]
    return events[: limit + 1]


def chain(task: Task, limit: int) -> list[TaskEvent]:
    """The first `limit` events of `task`'s chain."""
    return page(task, None, limit)[:limit]
