"""Every change of a task's status goes through this module, each move one way.

The lifecycle and its one table of moves live in `tasks.lifecycle`.  Each
verb here is the only implementation of the moves it declares (`@verb`); a
test holds every declared edge to `lifecycle.ALLOWED`, and every allowed edge
to a verb.  The hot verbs (`create`, `buffer_due`, `hand_out`, `ack`) run one
statement of `tasks.sql` each, which locks the rows, writes the new status
guarded by the old one and inserts the events in one round trip; the others
take rows the caller has locked inside `transaction.atomic()`, check each
move against their edges, write it guarded by the old status
(`UPDATE ... WHERE status = <from>`) and add one `TaskEvent` per task.  Either way
one JSON line per task is logged, and its span built, once the transaction commits
(`taskforge.tracing`: exporting only).  Nothing else writes `Task.status` (a test walks the tree).

Apps above `tasks` keep their own records of a move through `tasks.signals`
(the dead-letter queue's entries and each queue's DLQ depth), sent inside the
mover's transaction: each move into or out of `dead`, and each delete of dead
tasks (`delete`).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

from django.db import transaction
from django.utils import timezone

from queues.models import Queue
from queues.notify import wake_dispatchers, wake_scheduler
from taskforge import tracing
from taskforge.lib import internals, pg
from tasks import concurrency, names, signals, sql
from tasks import transitionlog as tlog
from tasks.exceptions import InvalidTransition
from tasks.lifecycle import FINISHED, Edge
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.retry import after_failure
from tasks.rows import ATTNAMES, create_params, run_statement, stored_task
from tasks.rows import Buffered as Buffered  # what `buffer_due` answers
from tasks.rows import NewTask as NewTask  # what `create` takes, named here for its callers

logger = logging.getLogger("taskforge.transitions")

S = TaskStatus

LEASE_EXPIRED_ERROR = "lease expired: no heartbeat within the heartbeat timeout"

# Every verb of this module and the edges it may take (the test reads this).
VERBS: dict[str, frozenset[Edge]] = {}

F = TypeVar("F", bound=Callable[..., Any])


def verb(edges: Iterable[Edge]) -> Callable[[F], F]:
    """Declare a function as the implementation of these moves."""

    def register(function: F) -> F:
        VERBS[function.__name__] = frozenset(edges)
        return function

    return register


_UNBUFFER: frozenset[Edge] = frozenset({(S.CLAIMED, S.PENDING)})
_PROMOTE: frozenset[Edge] = frozenset({(S.RETRY, S.PENDING)})
_RETRY: frozenset[Edge] = frozenset({(S.EXECUTING, S.RETRY)})
_DEAD: frozenset[Edge] = frozenset({(S.EXECUTING, S.DEAD)})
_CANCEL: frozenset[Edge] = frozenset((s, S.CANCELLED) for s in (S.PENDING, S.CLAIMED, S.RETRY))
_REPLAY: frozenset[Edge] = frozenset({(S.DEAD, S.PENDING)})
_CANCEL_ATTEMPT: frozenset[Edge] = frozenset({(S.EXECUTING, S.CANCELLED)})
_RUN_NOW: frozenset[Edge] = frozenset({(S.PENDING, S.CLAIMED)})


@verb(sql.CREATE.edges)
def create(
    new: Sequence[NewTask],
    *,
    now: datetime | None = None,
    buffer: bool = False,
    wake: bool = True,
    buffer_keys: Collection[str] = (),
) -> list[Task]:
    """Insert new tasks as `pending` (the move from nothing); return them as stored.

    One statement per queue writes the tasks (their creation events are
    their rows, tasks.events) and the events of those buffered.  With
    `buffer`, tasks already due go on to `claimed` in the same statement
    (the caller pushes those to Redis after commit); otherwise due tasks wake
    the dispatchers (NOTIFY, on commit), unless `wake` is False: the caller
    learnt that a dispatcher watches the queue's full buffer and that none of
    them is more urgent than what it holds (tasks.buffer.Admission.QUIET), so
    they wait in the backlog it refills from.  `buffer` and `wake` are of the
    tasks without a fairness key; a due task with one goes to `claimed` when
    its key is in `buffer_keys`, and else always wakes the dispatchers.
    Returns the tasks in the order given, each with the status its row has,
    built as a query would load them.  Caller contract: inside `atomic()` when
    several statements must stand or fall together.

    Raises:
        IntegrityError: an idempotency key already exists in the queue, or the
            queue is gone.
    """
    now = now or timezone.now()
    started = tracing.now_ns()
    build = internals.builder(Task, ATTNAMES)
    stored = [
        stored_task(
            build,
            item,
            S.CLAIMED
            if item.scheduled_at <= now
            and (buffer if item.fairness_key is None else item.fairness_key in buffer_keys)
            else S.PENDING,
            now,
        )
        for item in new
    ]
    by_queue: dict[Any, list[Task]] = {}
    for task in stored:
        by_queue.setdefault(task.queue_id, []).append(task)
    with pg.cursor() as cursor:
        for queue_id, group in by_queue.items():
            cursor.execute(sql.CREATE.text, create_params(queue_id, group, now, wake=wake))
    created = [tlog.line(t.pk, t.queue.name, None, None, S.PENDING, 0, None) for t in stored]
    moved = [
        tlog.line(t.pk, t.queue.name, None, S.PENDING, S.CLAIMED, 0, timedelta(0))
        for t in stored
        if t.status == S.CLAIMED
    ]
    transaction.on_commit(lambda: tlog.log("task.created", created))
    if moved:
        transaction.on_commit(lambda: tlog.log("task.buffered", moved))
    tracing.after_commit(tracing.enqueued, stored, started)
    return stored


@verb(sql.BUFFER_DUE.edges | sql.BUFFER_DUE_KEYS.edges)
def buffer_due(
    queue: Queue,
    *,
    limit: int = 0,
    better_than: int | None = None,
    rooms: dict[str, int] | None = None,
    now: datetime | None = None,
) -> list[Buffered]:
    """pending -> claimed for up to `limit` of the queue's due tasks, in one statement.

    Takes them in hand-out order, skipping rows other dispatchers hold, and
    only those scoring below `better_than` when it is given.  With `rooms`,
    instead up to `rooms[key]` due tasks of each fairness key named, each
    key's in hand-out order (tasks without a key are the other form's).
    Returns `Buffered(id, priority, scheduled_at, http, key)` of the buffered
    tasks (`http`: the task has an HTTP target and goes to the push lane;
    `key`: its fairness key).  Caller contract: autocommit (the statement is
    its own transaction) or inside `atomic()`.
    """
    now = now or timezone.now()
    params: dict[str, Any] = {"limit": limit, "better_than": better_than}
    statement = sql.BUFFER_DUE
    if rooms is not None:
        statement, params = (
            sql.BUFFER_DUE_KEYS,
            {"keys": pg.array(rooms), "rooms": pg.array(rooms.values())},
        )
    with transaction.atomic(), pg.cursor() as cursor, pg.planner_off(cursor, statement.off):
        cursor.execute(statement.text, {"queue_id": queue.id, "now": now, **params})
        rows = cursor.fetchall()
    lines = [
        tlog.line(row[0], queue.name, None, S.PENDING, S.CLAIMED, row[3], now - row[4])
        for row in rows
    ]
    transaction.on_commit(lambda: tlog.log("task.buffered", lines))
    return [Buffered(str(row[0]), row[1], row[2], row[5], row[6]) for row in rows]


@verb(_RUN_NOW)
def run_now(task: Task, *, now: datetime | None = None) -> None:
    """pending -> claimed, due now, for one task (a Cloud Tasks RunTask: the caller
    pushes it to the run lane).  Caller contract: row lock inside `atomic()`."""
    now = now or timezone.now()
    changes = {"scheduled_at": now}
    _move([task], S.CLAIMED, _RUN_NOW, event="buffered", now=now, changes=changes)


@verb(_UNBUFFER)
def unbuffer(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """claimed -> pending: back out of the buffer (queue paused, shutdown, lost push).

    Raises:
        InvalidTransition: a task is not claimed.
    """
    _move(tasks, S.PENDING, _UNBUFFER, event="unbuffered", now=now)


@verb(_PROMOTE)
def promote(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """retry -> pending: the scheduler found the next attempt due.

    Raises:
        InvalidTransition: a task is not waiting for a retry.
    """
    _move(tasks, S.PENDING, _PROMOTE, event="promoted", now=now)


@verb(sql.HAND_OUT.edges)
def hand_out(
    ids: Sequence[str],
    *,
    worker_id: str,
    key_id: int | None = None,
    queues: dict[Any, Queue] | None = None,
    now: datetime | None = None,
    push: bool = False,
    run: bool = False,
) -> list[Task]:
    """claimed -> executing for buffered ids a claim popped, in one statement.

    `run`: ids of the run lane (a RunTask's), handed out even from a paused queue.

    The attempt counts up and the lease starts now.  For a push process
    (`push`), which does not heartbeat, it starts the target's
    `timeout_seconds` later (`heartbeat_at` is then in the future), and each
    task's `push_target` is its queue's target as the statement read it (JSON
    text): where to send it.  Ids that are no longer `claimed` are skipped
    (the status guard is the fence against duplicates in the buffer), and so
    are ids of a paused queue, and of a queue whose delivery is not the
    caller's (a push queue's for a claim, a pulled one's for a push process).
    Returns the handed-out tasks in the order of `ids`.  The lease is held by
    `worker_id` with the API key `key_id`.  Caller contract: autocommit or
    inside `atomic()`; `queues` maps queue ids to queues (for names in log lines).
    """
    if not ids:
        return []
    now = now or timezone.now()
    params = {
        "ids": pg.array(ids),
        "worker_id": worker_id,
        "key_id": key_id,
        "now": now,
        "push": push,
        "run": run,
    }
    started = tracing.now_ns()
    moved = run_statement(sql.HAND_OUT.text, params, queues)
    order = {str(task_id): index for index, task_id in enumerate(ids)}
    moved.sort(key=lambda task: order[str(task.pk)])
    tlog.log_rows(moved, S.CLAIMED, event="handed_out", now=now, worker_id=worker_id)
    if tracing.ENABLED and not push:  # a push's span ends with the answer (workers.pusher)
        tracing.after_commit(tracing.dispatched, moved, started)
    return moved


@verb(sql.ACK.edges)
def ack(
    items: Sequence[tuple[str, int | None, str | None]],
    *,
    worker_id: str,
    key_id: int | None = None,
    queues: dict[Any, Queue] | None = None,
    now: datetime | None = None,
    brief: bool = False,
) -> list[Task]:
    """executing -> done for `(task_id, attempt or None, result JSON text or None)` items.

    Each item is guarded by holder (`claimed_by == worker_id`, and the claiming
    key when `key_id` is given) and attempt;
    items that fail the guard are skipped, and the caller tells why.  Returns
    the acked tasks (any order), in one statement.  Their concurrency slots
    are freed once it commits.  `brief` tasks hold only their id, queue,
    status and attempts (every other field deferred: read one and it costs a
    query), for callers that answer no more than that.
    """
    if not items:
        return []
    now = now or timezone.now()
    params = {
        "worker_id": worker_id,
        "key_id": key_id,
        "now": now,
        "ids": pg.array(item[0] for item in items),
        "attempts": pg.array(item[1] for item in items),
        "results": pg.array(item[2] for item in items),
    }
    started = tracing.now_ns()
    moved = run_statement(sql.ACK_BRIEF_TEXT if brief else sql.ACK.text, params, queues)
    tlog.log_rows(moved, S.EXECUTING, event="acked", now=now, worker_id=worker_id)
    tracing.after_commit(tracing.settled, moved, started, outcome=tracing.ACK)
    concurrency.release_on_commit(moved)
    return moved


@verb(_RETRY | _DEAD)
def fail(
    task: Task,
    *,
    error: str,
    retry: bool = True,
    retry_after_seconds: float | None = None,
    now: datetime | None = None,
    traced_as: str = tracing.NACK,
) -> None:
    """executing -> retry, or -> dead once attempts are spent or `retry` is False.

    A retry is due after the backoff, or the task's attempts are spent
    (`tasks.retry.after_failure`); `retry_after_seconds` replaces the backoff.
    The task's concurrency slot is freed once the move commits; `traced_as` names its span.
    Caller contract: holds the row lock inside `atomic()`.

    Raises:
        InvalidTransition: the task is not executing.
    """
    now = now or timezone.now()
    tracing.after_commit(tracing.settled, [task], tracing.now_ns(), outcome=traced_as, error=error)
    next_at = after_failure(task, now)  # None: no attempts left
    if not retry or next_at is None:
        _move(
            [task],
            S.DEAD,
            _DEAD,
            event="dead_lettered",
            now=now,
            worker_id=task.claimed_by,
            error=error,
            changes={"last_error": error, "finished_at": now},
        )
        signals.dead_lettered.send(sender=Task, tasks=[task], error=error, now=now)
        concurrency.release_on_commit([task])
        return
    due = next_at
    if retry_after_seconds is not None:
        wait = now + timedelta(seconds=retry_after_seconds)
        # A /v2 task waits at least its Retry-After, never less than its policy says.
        due = max(wait, next_at) if task.http_request is not None else wait
    wake_scheduler(due)  # the retry is due then: the scheduler promotes it on time
    _move(
        [task],
        S.RETRY,
        _RETRY,
        event="failed",
        now=now,
        worker_id=task.claimed_by,
        error=error,
        changes={"last_error": error, "scheduled_at": due},
    )
    concurrency.release_on_commit([task])


@verb(_RETRY | _DEAD)
def expire_lease(task: Task, *, now: datetime | None = None) -> None:
    """executing -> retry or dead: the worker stopped heartbeating (the watchdog).

    The same rule as a nack; caller contract as `fail`.
    """
    fail(task, error=LEASE_EXPIRED_ERROR, now=now, traced_as=tracing.LEASE_EXPIRED)


@verb(_CANCEL)
def cancel(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """pending, claimed or retry -> cancelled.

    Caller contract: holds the row locks inside `atomic()`.

    Raises:
        InvalidTransition: a task is executing or already finished.
    """
    now = now or timezone.now()
    _move(tasks, S.CANCELLED, _CANCEL, event="cancelled", now=now, changes={"finished_at": now})


@verb(_CANCEL_ATTEMPT)
def cancel_attempt(task: Task, *, now: datetime | None = None) -> None:
    """executing -> cancelled (a Cloud Tasks DeleteTask): the attempt's answer is then
    discarded, its slot freed on commit.  Caller contract: row lock inside `atomic()`.

    Raises:
        InvalidTransition: the task is not executing.
    """
    now = now or timezone.now()
    error = "deleted while its attempt was in flight"
    changes = {"finished_at": now}
    _move([task], S.CANCELLED, _CANCEL_ATTEMPT, event="cancelled", now=now, error=error,
          worker_id=task.claimed_by, changes=changes)  # fmt: skip
    concurrency.release_on_commit([task])


@verb(_REPLAY)
def replay(tasks: Sequence[Task], *, now: datetime | None = None) -> None:
    """dead -> pending with a fresh attempt budget, due now.

    Caller contract: holds the row locks inside `atomic()`.

    Raises:
        InvalidTransition: a task is not dead.
    """
    now = now or timezone.now()
    _move(
        tasks,
        S.PENDING,
        _REPLAY,
        event="replayed",
        now=now,
        changes={
            "attempts": 0,
            "finished_at": None,
            "scheduled_at": now,
            "first_claimed_at": None,
            "http_attempts": None,
        },
    )
    signals.replayed.send(sender=Task, tasks=tasks, now=now)


def delete(tasks: Sequence[tuple[Any, Any, str]]) -> int:
    """Delete finished tasks for good, given `(id, queue_id, status)` of rows the caller holds
    locked inside `atomic()`; returns how many.

    A move out of the lifecycle, not along it: done, cancelled or dead tasks
    only, each with its events and DLQ entry (their foreign keys cascade).
    Dead ones leave their queue's DLQ depth in the same transaction.

    Raises:
        InvalidTransition: a task is still on its way; nothing is deleted.
    """
    if not tasks:
        return 0
    for task_id, _, status in tasks:
        if status not in (*FINISHED, S.DEAD):
            raise InvalidTransition(f"Task {task_id} is {status}; it cannot be deleted.")
    ids = [task_id for task_id, _, _ in tasks]
    names.forget(ids)  # a named task's name outlives its row (API-cloudtasks.md)
    Task.objects.filter(pk__in=ids).delete()
    dead = Counter(queue_id for _, queue_id, status in tasks if status == S.DEAD)
    if dead:
        signals.dead_deleted.send(sender=Task, dead=dict(dead))
    return len({task_id for task_id, _, _ in tasks})


def _move(
    tasks: Sequence[Task],
    to_status: str,
    edges: frozenset[Edge],
    *,
    event: str,
    now: datetime | None = None,
    worker_id: str | None = None,
    error: str | None = None,
    changes: dict[str, Any] | None = None,
) -> None:
    """Move locked tasks to `to_status` along one of `edges`, all or none.

    One guarded UPDATE per from-status writes the same values for every task.

    Raises:
        InvalidTransition: a task's status does not allow the move, or changed
            under us (the caller did not hold the lock); nothing is written.
    """
    if not tasks:
        return
    now = now or timezone.now()
    for task in tasks:
        if (task.status, to_status) not in edges:
            raise InvalidTransition(
                f"Task {task.pk} is {task.status}; it cannot become {to_status}."
            )
    from_statuses: list[str | None] = [task.status for task in tasks]
    durations = [now - task.status_changed_at for task in tasks]
    fields = {"status": to_status, "updated_at": now, "status_changed_at": now, **(changes or {})}
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
    TaskEvent.objects.bulk_create(
        TaskEvent(
            task_id=task.pk,
            queue_id=task.queue_id if from_status == S.EXECUTING else None,
            at=now,
            from_status=from_status,
            to_status=task.status,
            worker_id=worker_id,
            attempt=task.attempts,
            error=error,
            # An attempt's outcome records its claim too (tasks.events).
            claimed_at=task.claimed_at if from_status == S.EXECUTING else None,
        )
        for task, from_status in zip(tasks, from_statuses, strict=True)
    )
    tlog.log_on_commit(f"task.{event}", tasks, from_statuses, durations, worker_id)
    if to_status == S.PENDING:
        wake_dispatchers({task.queue_id for task in tasks if task.scheduled_at <= now})
