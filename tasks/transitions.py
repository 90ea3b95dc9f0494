"""Every change of a task's status goes through this module.

The lifecycle (API.md, "Task status"):

    (new) ─> pending ─> claimed ─> executing ─> done
               ^  │        │           ├──────> retry ─> pending (when due)
               │  │        └─> pending └──────> dead ──> pending (replay)
               │  └──────> cancelled  (also from claimed and retry)

Each verb takes rows the caller has locked inside `transaction.atomic()`,
checks every move against `ALLOWED`, writes the new status guarded by the old
one (`UPDATE ... WHERE status = <from>`), adds one `TaskEvent` per task in the
same transaction, and logs one JSON line per task once the transaction commits.
Nothing else in TaskForge writes `Task.status`.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from dlq.models import DeadLetterTask
from queues import lookup
from queues.models import Queue
from taskforge import metrics
from taskforge.lib import jsonutil, pg
from tasks import sql
from tasks.exceptions import InvalidTransition
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.retry import next_attempt_at

logger = logging.getLogger("taskforge.transitions")

S = TaskStatus

ALLOWED: dict[str | None, frozenset[str]] = {
    None: frozenset({S.PENDING}),
    S.PENDING: frozenset({S.CLAIMED, S.CANCELLED}),
    S.CLAIMED: frozenset({S.EXECUTING, S.PENDING, S.CANCELLED}),
    S.EXECUTING: frozenset({S.DONE, S.RETRY, S.DEAD}),
    S.RETRY: frozenset({S.PENDING, S.CANCELLED}),
    S.DEAD: frozenset({S.PENDING}),
    S.DONE: frozenset(),
    S.CANCELLED: frozenset(),
}

LEASE_EXPIRED_ERROR = "lease expired: no heartbeat within the heartbeat timeout"

# Per-task field values for one transition, computed from the locked row.
Changes = Callable[[Task], dict[str, Any]]


def is_allowed(from_status: str | None, to_status: str) -> bool:
    return to_status in ALLOWED.get(from_status, frozenset())


def create(
    tasks: Sequence[Task], *, now: datetime | None = None, buffer: bool = False
) -> list[Task]:
    """Insert new tasks as `pending` (the transition from nothing).

    One statement per queue writes the tasks and their events.  With
    `buffer`, tasks already due go on to `claimed` in the same statement
    (the caller pushes them to Redis after commit); otherwise due tasks wake
    the dispatchers (NOTIFY, on commit).  The tasks are left as enqueued
    (`pending`: what API.md says an enqueue answers); returns those that went
    on to `claimed`, for the caller to push.  Caller contract: the
    tasks are unsaved and carry their queue, payload, priority, scheduled_at,
    max_retries and idempotency key; inside `atomic()` when several
    statements must stand or fall together.

    Raises:
        IntegrityError: an idempotency key already exists in the queue.
    """
    now = now or timezone.now()
    by_queue: dict[Any, list[Task]] = {}
    for task in tasks:
        by_queue.setdefault(task.queue_id, []).append(task)
    buffered: list[Task] = []
    with connection.cursor() as cursor:
        for queue_id, group in by_queue.items():
            flags = [buffer and task.scheduled_at <= now for task in group]
            cursor.execute(
                sql.CREATE,
                {
                    "queue_id": queue_id,
                    "now": now,
                    "ids": [task.pk for task in group],
                    "payloads": [jsonutil.dumps(task.payload).decode() for task in group],
                    "priorities": [task.priority for task in group],
                    "scheduled": [task.scheduled_at for task in group],
                    "max_retries": [task.max_retries for task in group],
                    "keys": [task.idempotency_key for task in group],
                    "buffer": flags,
                    "notify": any(
                        task.scheduled_at <= now and not flag
                        for task, flag in zip(group, flags, strict=True)
                    ),
                },
            )
            buffered += [task for task, flag in zip(group, flags, strict=True) if flag]
    for task in tasks:
        task.status = S.PENDING
        task.attempts = 0
        task.created_at = task.updated_at = task.status_changed_at = now
        task._state.adding = False
        task._state.db = "default"
    _log_on_commit("task.created", tasks, [None] * len(tasks), [None] * len(tasks), None)
    if buffered:
        buffered_lines = [
            _line(task.pk, task.queue.name, None, S.PENDING, S.CLAIMED, 0, timedelta(0))
            for task in buffered
        ]
        transaction.on_commit(lambda: _log("task.buffered", buffered_lines))
    return buffered


def buffer_due(
    queue: Queue, *, limit: int, better_than: int | None = None, now: datetime | None = None
) -> list[tuple[str, int, datetime]]:
    """pending -> claimed for up to `limit` of the queue's due tasks, in one statement.

    Takes them in hand-out order, skipping rows other dispatchers hold, and
    only those scoring below `better_than` when it is given.  Returns
    `(id, priority, scheduled_at)` of the buffered tasks, best first.
    Caller contract: autocommit (the statement is its own transaction) or
    inside `atomic()`.
    """
    now = now or timezone.now()
    with pg.cursor() as cursor:
        cursor.execute(
            sql.BUFFER_DUE,
            {"queue_id": queue.id, "now": now, "limit": limit, "better_than": better_than},
        )
        rows = cursor.fetchall()
    lines = [
        _line(task_id, queue.name, None, S.PENDING, S.CLAIMED, attempts, now - previous)
        for task_id, _, _, attempts, previous in rows
    ]
    transaction.on_commit(lambda: _log("task.buffered", lines))
    return [
        (str(task_id), priority, scheduled_at) for task_id, priority, scheduled_at, _, _ in rows
    ]


def buffer(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """pending -> claimed: the dispatcher put the tasks into the dispatch buffer."""
    _move(tasks, S.CLAIMED, verb="buffered", now=now)


def unbuffer(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """claimed -> pending: back out of the buffer (queue paused, shutdown, lost push)."""
    _move(tasks, S.PENDING, verb="unbuffered", now=now)


def promote(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """retry -> pending: the scheduler found the next attempt due."""
    _move(tasks, S.PENDING, verb="promoted", now=now)


def hand_out(tasks: Sequence[Task], *, worker_id: str, now: datetime | None = None) -> None:
    """claimed -> executing: a worker claimed the tasks; its lease starts now."""
    now = now or timezone.now()
    _move(
        tasks,
        S.EXECUTING,
        verb="handed_out",
        now=now,
        worker_id=worker_id,
        changes=lambda t: {
            "attempts": t.attempts + 1,
            "claimed_by": worker_id,
            "claimed_at": now,
            "heartbeat_at": now,
        },
    )


def hand_out_ids(
    ids: Sequence[str],
    *,
    worker_id: str,
    queues: dict[Any, Queue],
    now: datetime | None = None,
) -> list[Task]:
    """claimed -> executing for buffered ids a claim popped, in one statement.

    Ids that are no longer `claimed` are skipped (the status guard is the
    fence against duplicates in the buffer).  Returns the handed-out tasks in
    the order of `ids`.  Caller contract: autocommit or inside `atomic()`;
    `queues` maps queue ids to queues (for names in log lines).
    """
    if not ids:
        return []
    now = now or timezone.now()
    moved = _run(sql.HAND_OUT, {"ids": list(ids), "worker_id": worker_id, "now": now}, queues)
    order = {str(task_id): index for index, task_id in enumerate(ids)}
    moved.sort(key=lambda task: order[str(task.pk)])
    _log_rows(moved, S.CLAIMED, verb="handed_out", now=now, worker_id=worker_id)
    return moved


def ack_many(
    items: Sequence[tuple[str, int | None, str | None]],
    *,
    worker_id: str,
    queues: dict[Any, Queue] | None = None,
    now: datetime | None = None,
) -> list[Task]:
    """executing -> done for `(task_id, attempt or None, result JSON text or None)` items.

    Each item is guarded by holder (`claimed_by == worker_id`) and attempt;
    items that fail the guard are skipped, and the caller tells why.  Returns
    the acked tasks (any order), in one statement.
    """
    if not items:
        return []
    now = now or timezone.now()
    params = {
        "worker_id": worker_id,
        "now": now,
        "ids": [item[0] for item in items],
        "attempts": [item[1] for item in items],
        "results": [item[2] for item in items],
    }
    moved = _run(sql.ACK, params, queues)
    _log_rows(moved, S.EXECUTING, verb="acked", now=now, worker_id=worker_id)
    return moved


def ack(task: Task, *, result: Any = None, now: datetime | None = None) -> None:
    """executing -> done: the worker finished the task."""
    now = now or timezone.now()
    _move(
        [task],
        S.DONE,
        verb="acked",
        now=now,
        worker_id=task.claimed_by,
        changes={"result": result, "finished_at": now},
    )


def fail(
    task: Task,
    *,
    error: str,
    retry: bool = True,
    retry_after_seconds: float | None = None,
    now: datetime | None = None,
) -> None:
    """executing -> retry, or -> dead once attempts are spent or `retry` is False.

    A dead task gets its dead-letter entry in the same transaction.
    """
    now = now or timezone.now()
    exhausted = task.attempts >= task.max_retries + 1
    if not retry or exhausted:
        _dead_letter([task], error=error, now=now)
        return
    if retry_after_seconds is not None:
        due = now + timedelta(seconds=retry_after_seconds)
    else:
        due = next_attempt_at(now, task.attempts)
    _move(
        [task],
        S.RETRY,
        verb="failed",
        now=now,
        worker_id=task.claimed_by,
        error=error,
        changes={"last_error": error, "scheduled_at": due},
    )


def expire_lease(task: Task, *, now: datetime | None = None) -> None:
    """executing -> retry or dead: the worker stopped heartbeating (the watchdog)."""
    fail(task, error=LEASE_EXPIRED_ERROR, now=now)


def cancel(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """pending, claimed or retry -> cancelled.

    Raises:
        InvalidTransition: a task is executing or already finished.
    """
    now = now or timezone.now()
    _move(tasks, S.CANCELLED, verb="cancelled", now=now, changes={"finished_at": now})


def replay(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """dead -> pending with a fresh attempt budget; the DLQ entry records the replay.

    Raises:
        InvalidTransition: a task is not dead.
    """
    now = now or timezone.now()
    _move(
        tasks,
        S.PENDING,
        verb="replayed",
        now=now,
        changes={"attempts": 0, "finished_at": None, "scheduled_at": now},
    )
    DeadLetterTask.objects.filter(task__in=[t.pk for t in tasks]).update(
        replayed_at=now, replay_count=F("replay_count") + 1
    )


def _dead_letter(tasks: Sequence[Task], *, error: str, now: datetime) -> None:
    _move(
        tasks,
        S.DEAD,
        verb="dead_lettered",
        now=now,
        worker_id=tasks[0].claimed_by if len(tasks) == 1 else None,
        error=error,
        changes={"last_error": error, "finished_at": now},
    )
    for task in tasks:
        # One entry per task: a replayed task that dies again updates its entry.
        DeadLetterTask.objects.update_or_create(
            task=task,
            defaults={
                "queue_id": task.queue_id,
                "payload": task.payload,
                "last_error": error,
                "attempts": task.attempts,
                "died_at": now,
            },
        )


def _move(
    tasks: Sequence[Task],
    to_status: str,
    *,
    verb: str,
    now: datetime | None = None,
    worker_id: str | None = None,
    error: str | None = None,
    changes: dict[str, Any] | Changes | None = None,
) -> None:
    """Move locked tasks to `to_status`, all or none.

    Raises:
        InvalidTransition: a task's status does not allow the move, or changed
            under us (the caller did not hold the lock); nothing is written.
    """
    if not tasks:
        return
    now = now or timezone.now()
    for task in tasks:
        if not is_allowed(task.status, to_status):
            raise InvalidTransition(
                f"Task {task.pk} is {task.status}; it cannot become {to_status}."
            )
    from_statuses: list[str | None] = [task.status for task in tasks]
    durations = [now - task.status_changed_at for task in tasks]
    common = {"status": to_status, "updated_at": now, "status_changed_at": now}
    if changes is None or isinstance(changes, dict):
        # The same values for every task: one guarded UPDATE per from-status.
        fields = {**common, **(changes or {})}
        by_status: dict[str, list[Task]] = {}
        for task in tasks:
            by_status.setdefault(task.status, []).append(task)
        for from_status, group in by_status.items():
            ids = [task.pk for task in group]
            updated = Task.objects.filter(pk__in=ids, status=from_status).update(**fields)
            if updated != len(set(ids)):
                raise InvalidTransition("A task changed status concurrently.")
        for task in tasks:
            for name, value in fields.items():
                setattr(task, name, value)
    else:
        for task in tasks:
            fields = {**common, **changes(task)}
            updated = Task.objects.filter(pk=task.pk, status=task.status).update(**fields)
            if updated != 1:
                raise InvalidTransition(f"Task {task.pk} changed status concurrently.")
            for name, value in fields.items():
                setattr(task, name, value)
    _record(
        tasks,
        from_statuses=from_statuses,
        verb=verb,
        now=now,
        worker_id=worker_id,
        error=error,
        durations=durations,
    )


def _record(
    tasks: Sequence[Task],
    *,
    from_statuses: Sequence[str | None],
    verb: str,
    now: datetime,
    worker_id: str | None = None,
    error: str | None = None,
    durations: Iterable[timedelta | None] | None = None,
) -> None:
    """Write one event per task now, and one log line per task on commit."""
    TaskEvent.objects.bulk_create(
        TaskEvent(
            task_id=task.pk,
            queue_id=task.queue_id,
            at=now,
            from_status=from_status,
            to_status=task.status,
            worker_id=worker_id,
            attempt=task.attempts,
            error=error,
        )
        for task, from_status in zip(tasks, from_statuses, strict=True)
    )
    durations = list(durations) if durations is not None else [None] * len(tasks)
    _log_on_commit(f"task.{verb}", tasks, from_statuses, durations, worker_id)
    if tasks and tasks[0].status == S.PENDING:
        _wake_dispatchers(tasks, now)


def _run(query: str, params: dict[str, Any], queues: dict[Any, Queue] | None) -> list[Task]:
    """Run one of tasks.sql's statements and build Tasks from the rows it returns."""
    with pg.cursor() as cursor:
        cursor.execute(query, params)
        names = [column.name for column in cursor.description]
        rows = cursor.fetchall()
    tasks = _tasks_from_rows(names, rows)
    missing = {task.queue_id for task in tasks} - set(queues or {})
    if missing:
        queues = {**(queues or {}), **lookup.by_ids(missing)}
    for task in tasks:
        task.queue = queues[task.queue_id]  # type: ignore[index]
    return tasks


def _tasks_from_rows(names: list[str], rows: list[tuple[Any, ...]]) -> list[Task]:
    """Task instances from rows of sql.TASK_COLUMNS plus extra columns (set as attributes).

    What Task.objects.raw does, without its per-query setup: the hot paths
    run this for every claim and ack.
    """
    attnames, positions, converters, extras = _row_layout(tuple(names))
    db = connection.alias
    tasks = []
    for row in rows:
        values = [row[i] for i in positions]
        for k, convert in converters:
            values[k] = convert(values[k], None, connection)
        task = Task.from_db(db, attnames, values)
        for name, i in extras:
            setattr(task, name, row[i])
        tasks.append(task)
    return tasks


@functools.lru_cache(maxsize=32)
def _row_layout(
    names: tuple[str, ...],
) -> tuple[list[str], list[int], list[tuple[int, Any]], list[tuple[str, int]]]:
    """For rows with these columns: Task's attnames, the row index of each, the
    fields' from_db_value converters, and the extra columns.  The same few
    statements run over and over: worked out once per column list."""
    index = {name: i for i, name in enumerate(names)}
    fields = Task._meta.concrete_fields
    attnames = [field.attname for field in fields]
    converters = [
        (k, field.from_db_value)
        for k, field in enumerate(fields)
        if hasattr(field, "from_db_value")
    ]
    known = set(attnames)
    extras = [(name, i) for name, i in index.items() if name not in known]
    return attnames, [index[name] for name in attnames], converters, extras


def _log_rows(
    tasks: Sequence[Task], from_status: str, *, verb: str, now: datetime, worker_id: str | None
) -> None:
    """Log lines for tasks moved by one SQL statement (it wrote their events)."""
    _log_on_commit(
        f"task.{verb}",
        tasks,
        [from_status] * len(tasks),
        [now - task.previous_changed_at for task in tasks],
        worker_id,
    )


def _log_on_commit(
    event: str,
    tasks: Sequence[Task],
    from_statuses: Sequence[str | None],
    durations: Sequence[timedelta | None],
    worker_id: str | None,
) -> None:
    lines = [
        _line(
            task.pk, task.queue.name, worker_id, from_status, task.status, task.attempts, duration
        )
        for task, from_status, duration in zip(tasks, from_statuses, durations, strict=True)
    ]
    transaction.on_commit(lambda: _log(event, lines))


def _line(
    task_id: Any,
    queue: str,
    worker_id: str | None,
    from_status: str | None,
    to_status: str,
    attempt: int,
    duration: timedelta | None,
) -> dict[str, Any]:
    """The fields of a transition's JSON log line (API.md, Operations)."""
    return {
        "task_id": str(task_id),
        "queue": queue,
        "worker_id": worker_id,
        "from_status": from_status,
        "to_status": to_status,
        "attempt": attempt,
        "duration_ms": None if duration is None else round(duration.total_seconds() * 1000, 3),
    }


def _wake_dispatchers(tasks: Sequence[Task], now: datetime) -> None:
    """NOTIFY the dispatchers of queues that got due pending tasks (sent on commit)."""
    queue_ids = sorted({str(task.queue_id) for task in tasks if task.scheduled_at <= now})
    if queue_ids:
        with connection.cursor() as cursor:
            for queue_id in queue_ids:
                cursor.execute(sql.NOTIFY_DISPATCH, {"queue_id": queue_id})


def _log(event: str, lines: list[dict[str, Any]]) -> None:
    for line in lines:
        logger.info(event, extra=line)
    metrics.on_transitions(event, lines)
