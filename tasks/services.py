"""What producers and operators do with tasks: enqueue, cancel, purge a queue, delete it.

Each moves tasks through `tasks.transitions`; the API, the dashboard and the
admin call these, never the transitions' locking themselves.  The operator
actions (cancel, purge, delete) take the `actor` and write its audit entry in
the action's transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.db import IntegrityError, transaction
from django.utils import timezone

from queues import lookup
from queues.exceptions import QueueNotEmpty, UnknownQueue
from queues.models import Queue
from taskforge.audit.log import Actor, record, record_each
from taskforge.audit.models import Action
from taskforge.errors import NotFound
from taskforge.lib.redisconn import REDIS_FAILURES
from tasks import transitions
from tasks.buffer import Admission, get_buffer, score
from tasks.models import Schedule, Task, TaskStatus

logger = logging.getLogger(__name__)

# The foreign key a task insert breaks when its queue was deleted meanwhile.
_QUEUE_FK = "tasks_task_queue_id"

# Concurrent enqueues with the same idempotency key: the loser of the insert
# race rolls back and retries, and then finds the winner's task.
_IDEMPOTENCY_RETRIES = 3

PURGE_BATCH = 1000
CANCEL_BATCH = 1000


class UnknownTask(NotFound):
    """No such task in this queue."""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One validated enqueue body."""

    payload: Any
    priority: int = 5
    scheduled_at: datetime | None = None
    delay_seconds: float | None = None
    idempotency_key: str | None = None
    max_retries: int | None = None
    # The enqueue's W3C Trace Context, as `taskforge.tracing.context_of` kept it.
    traceparent: str | None = None
    tracestate: str | None = None
    fairness_key: str | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    """One enqueued spec: the task as stored, and whether this call created it."""

    task: Task
    created: bool


def enqueue(queue: Queue, specs: Sequence[TaskSpec]) -> list[Enqueued]:
    """Store tasks as `pending` in one short transaction, all or none.

    A spec whose idempotency key exists in the queue (or appears earlier in the
    same call) yields the existing task instead of a new one.  `scheduled_at`
    is always set: the enqueue time unless a later time or a delay is given.

    Raises:
        UnknownQueue: the queue was deleted while the request was under way.
    """
    for attempt in range(_IDEMPOTENCY_RETRIES):
        try:
            if all(spec.idempotency_key is None for spec in specs):
                # One INSERT statement: atomic by itself, no transaction to open.
                return _enqueue(queue, specs)
            with transaction.atomic():
                return _enqueue(queue, specs)
        except IntegrityError as exc:
            if _QUEUE_FK in str(exc):
                lookup.forget(queue)  # remembered, but deleted meanwhile
                raise UnknownQueue() from exc
            if "task_idempotency_key_per_queue" not in str(exc):
                raise
            if attempt == _IDEMPOTENCY_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


def _enqueue(queue: Queue, specs: Sequence[TaskSpec]) -> list[Enqueued]:
    now = timezone.now()
    keys = {spec.idempotency_key for spec in specs if spec.idempotency_key is not None}
    known: dict[str, Task] = {}
    if keys:
        known = {
            task.idempotency_key: task
            for task in Task.objects.filter(queue=queue, idempotency_key__in=keys)
            if task.idempotency_key is not None
        }
    # Each spec's task: an existing one (key seen) or the index of a new one.
    picks: list[Task | int] = []
    new: list[transitions.NewTask] = []
    fresh_keys: dict[str, int] = {}
    for spec in specs:
        key = spec.idempotency_key
        if key is not None and key in known:
            picks.append(known[key])
            continue
        if key is not None and key in fresh_keys:
            picks.append(fresh_keys[key])  # the same key earlier in this call
            continue
        if key is not None:
            fresh_keys[key] = len(new)
        picks.append(len(new))
        new.append(
            transitions.NewTask(
                queue=queue,
                payload=spec.payload,
                priority=spec.priority,
                scheduled_at=_due_time(spec, now),
                max_retries=queue.max_retries if spec.max_retries is None else spec.max_retries,
                idempotency_key=key,
                traceparent=spec.traceparent,
                tracestate=spec.tracestate,
                fairness_key=spec.fairness_key or None,
            )
        )
    # Due tasks of a running queue go straight into the buffer when they fit:
    # no wait for the dispatcher's hop.  A batch that would overflow the
    # buffer (a backlog) is left to the dispatcher, which keeps hand-out order.
    due = [task for task in new if task.scheduled_at <= now]
    admission = _admission(queue, [task for task in due if task.fairness_key is None])
    stored = transitions.create(
        new,
        now=now,
        buffer=admission is Admission.BUFFER,
        wake=admission is not Admission.QUIET,
        buffer_keys=_admitted_keys(queue, [task for task in due if task.fairness_key is not None]),
    )
    buffered = [task for task in stored if task.status == TaskStatus.CLAIMED]
    if buffered:
        transaction.on_commit(lambda: _push_buffered(queue, buffered))
    results = []
    seen: set[int] = set()
    for pick in picks:
        if isinstance(pick, int):
            results.append(Enqueued(stored[pick], created=pick not in seen))
            seen.add(pick)
        else:
            pick.queue = queue  # serializers read the name; spare them a query each
            results.append(Enqueued(pick, created=False))
    return results


def _admission(queue: Queue, due: Sequence[transitions.NewTask]) -> Admission:
    """Where the due tasks go (tasks.buffer.Buffer.admit); a paused queue's stay pending."""
    if queue.paused or not due:
        return Admission.WAKE
    # score() is monotonic in (priority, scheduled_at): one call, not one per task of a batch.
    best = score(*min((task.priority, task.scheduled_at) for task in due))
    try:
        return get_buffer().admit(queue.id, len(due), best)
    except REDIS_FAILURES:
        return Admission.WAKE  # Redis is down: the tasks wait as pending, the dispatcher retries


def _admitted_keys(queue: Queue, due: Sequence[transitions.NewTask]) -> set[str]:
    """The fairness keys whose due tasks go straight into their ready sets (room for
    them all, queue running); the others wait as pending for the dispatcher."""
    if queue.paused or not due:
        return set()
    counts: dict[str, int] = {}
    for task in due:
        key = cast(str, task.fairness_key)
        counts[key] = counts.get(key, 0) + 1
    try:
        return get_buffer().admit_keyed(queue.id, counts)
    except REDIS_FAILURES:
        return set()


def _push_buffered(queue: Queue, tasks: Sequence[Task]) -> None:
    """Push tasks created `claimed` to Redis; a failure leaves them to the reconcile."""
    keyed = [t for t in tasks if t.fairness_key is not None]
    try:
        if keyed:
            get_buffer().push_keyed(
                queue.id,
                [
                    (str(t.pk), score(t.priority, t.scheduled_at), cast(str, t.fairness_key))
                    for t in keyed
                ],
                wake=True,
            )
            if len(keyed) == len(tasks):
                return
            tasks = [t for t in tasks if t.fairness_key is None]
        get_buffer().push(
            queue.id, [(str(t.pk), score(t.priority, t.scheduled_at)) for t in tasks], wake=True
        )
    except REDIS_FAILURES:
        logger.warning(
            "enqueue.buffer_push_failed", extra={"queue": queue.name, "count": len(tasks)}
        )


def _due_time(spec: TaskSpec, now: datetime) -> datetime:
    if spec.delay_seconds is not None:
        return now + timedelta(seconds=spec.delay_seconds)
    if spec.scheduled_at is not None and spec.scheduled_at > now:
        return spec.scheduled_at
    return now


def get_task(task_id: Any, *, queue: Queue | None = None, lock: bool = False) -> Task:
    """The task of that id (in `queue`, when given); `lock` takes its row lock
    (inside atomic()).

    Raises:
        UnknownTask: no such task (in this queue).
    """
    tasks = Task.objects.filter(pk=task_id)
    if queue is not None:
        tasks = tasks.filter(queue=queue)
    else:
        tasks = tasks.select_related("queue")
    if lock:
        tasks = tasks.select_for_update(no_key=True, of=("self",))
    task = tasks.first()
    if task is None:
        raise UnknownTask()
    if queue is not None:
        task.queue = queue
    return task


def cancel(task_id: Any, *, actor: Actor, queue: Queue | None = None) -> Task:
    """Cancel one pending, claimed or retry task (of `queue`, when given).

    Raises:
        UnknownTask: no such task (in this queue).
        InvalidTransition: the task is executing or finished.
    """
    with transaction.atomic():
        task = get_task(task_id, queue=queue, lock=True)
        transitions.cancel([task])
        record(actor, Action.TASK_CANCEL, queue=task.queue.name, target=str(task.pk))
    return task


def cancel_many(task_ids: Sequence[Any], *, actor: Actor) -> int:
    """Cancel the cancellable ones among `task_ids` (any queues); others are skipped.

    Returns how many were cancelled, in batches of short transactions; each
    batch writes one audit entry per task it cancelled.
    """
    cancelled = 0
    for start in range(0, len(task_ids), CANCEL_BATCH):
        with transaction.atomic():
            batch = list(
                # Lock order: by id, as every multi-row lock of tasks.
                Task.objects.cancellable()
                .select_for_update(no_key=True, of=("self",))
                .select_related("queue")
                .filter(pk__in=task_ids[start : start + CANCEL_BATCH])
                .order_by("id")
            )
            transitions.cancel(batch)
            record_each(
                actor, Action.TASK_CANCEL, ((task.queue.name, str(task.pk)) for task in batch)
            )
        cancelled += len(batch)
    return cancelled


def purge_queue(queue: Queue, *, actor: Actor) -> int:
    """Cancel every pending, claimed and retry task of the queue; return how many.

    Works in batches of short transactions so a large purge does not hold a
    lock on every task of a big queue at once.  One audit entry,
    `{"cancelled": n}`, is written in the last batch's transaction: the one
    that finishes the purge.
    """
    cancelled = 0
    while True:
        with transaction.atomic():
            batch = list(
                # Lock order: by id, so two purges cannot deadlock.
                Task.objects.cancellable()
                .select_for_update()
                .filter(queue=queue)
                .order_by("id")[:PURGE_BATCH]
            )
            for task in batch:
                task.queue = queue
            transitions.cancel(batch)
            cancelled += len(batch)
            if len(batch) < PURGE_BATCH:
                record(
                    actor,
                    Action.QUEUE_PURGE,
                    queue=queue.name,
                    target=queue.name,
                    details={"cancelled": cancelled},
                )
                return cancelled


def delete_queue(queue: Queue, *, actor: Actor) -> None:
    """Delete a queue with no live task; its done and cancelled tasks go with it.

    Raises:
        QueueNotEmpty: a live task (lifecycle.LIVE) remains.
    """
    with transaction.atomic():
        # The queue's schedules go with it.  Lock them before the queue: a
        # scheduler firing one holds its row while the enqueue references the
        # queue, so the other order could deadlock with it.
        list(
            Schedule.objects.select_for_update()
            .filter(queue=queue)
            .order_by("id")
            .values_list("pk", flat=True)
        )
        # Lock the queue first (lock order: queue, then tasks) so no enqueue
        # slips in between the check and the delete.
        Queue.objects.select_for_update().get(pk=queue.pk)
        if Task.objects.filter(queue=queue).live().exists():
            raise QueueNotEmpty()
        queue_id = queue.pk
        queue.delete()
        record(actor, Action.QUEUE_DELETE, queue=queue.name, target=queue.name)
        transaction.on_commit(lambda: _forget_buffer(queue_id))


def _forget_buffer(queue_id: object) -> None:
    """Drop the deleted queue's Redis keys (its token bucket); Redis down: they expire."""
    try:
        get_buffer().forget_queue(str(queue_id))
    except REDIS_FAILURES:
        logger.warning("queue.buffer_not_forgotten", extra={"queue_id": str(queue_id)})
