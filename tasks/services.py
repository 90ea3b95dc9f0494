"""Writes on tasks that are not status transitions of an existing row."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.http import Http404
from django.utils import timezone
from redis.exceptions import RedisError

from queues import lookup
from queues.models import Queue
from taskforge.conf import conf
from tasks import transitions
from tasks.buffer import get_buffer, score
from tasks.models import Task

logger = logging.getLogger(__name__)

# The foreign key a task insert breaks when its queue was deleted meanwhile.
_QUEUE_FK = "tasks_task_queue_id"

# Concurrent enqueues with the same idempotency key: the loser of the insert
# race rolls back and retries, and then finds the winner's task.
_IDEMPOTENCY_RETRIES = 3


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One validated enqueue body."""

    payload: Any
    priority: int = 5
    scheduled_at: datetime | None = None
    delay_seconds: float | None = None
    idempotency_key: str | None = None
    max_retries: int | None = None


@dataclass(frozen=True, slots=True)
class Enqueued:
    task: Task
    created: bool


def enqueue(queue: Queue, specs: Sequence[TaskSpec]) -> list[Enqueued]:
    """Store tasks as `pending` in one short transaction, all or none.

    A spec whose idempotency key exists in the queue (or appears earlier in the
    same call) yields the existing task instead of a new one.  `scheduled_at`
    is always set: the enqueue time unless a later time or a delay is given.

    Raises:
        Http404: the queue was deleted while the request was under way.
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
                raise Http404("No such queue.") from exc
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
    results: list[tuple[Task, bool]] = []
    new: list[Task] = []
    for spec in specs:
        key = spec.idempotency_key
        if key is not None and key in known:
            results.append((known[key], False))
            continue
        task = Task(
            queue=queue,
            payload=spec.payload,
            priority=spec.priority,
            scheduled_at=_due_time(spec, now),
            max_retries=queue.max_retries if spec.max_retries is None else spec.max_retries,
            idempotency_key=key,
        )
        if key is not None:
            known[key] = task
        new.append(task)
        results.append((task, True))
    # Due tasks of a running queue go straight into the buffer when they fit:
    # no wait for the dispatcher's hop.  A batch that would overflow the
    # buffer (a backlog) is left to the dispatcher, which keeps hand-out order.
    due = sum(task.scheduled_at <= now for task in new)
    fast = not queue.paused and _buffer_has_room(queue, due)
    buffered = transitions.create(new, now=now, buffer=fast)
    if buffered:
        transaction.on_commit(lambda: _push_buffered(queue, buffered))
    for task, _ in results:
        task.queue = queue  # serializers read the name; spare them a query each
    return [Enqueued(task, created) for task, created in results]


def _buffer_has_room(queue: Queue, count: int) -> bool:
    if count == 0:
        return False
    try:
        return get_buffer().size(queue.id) + count <= conf.BUFFER_SIZE
    except RedisError:
        return False  # Redis is down: the tasks wait as pending, the dispatcher retries


def _push_buffered(queue: Queue, tasks: Sequence[Task]) -> None:
    """Push tasks created `claimed` to Redis; a failure leaves them to the reconcile."""
    try:
        get_buffer().push(
            queue.id, [(str(t.pk), score(t.priority, t.scheduled_at)) for t in tasks], wake=True
        )
    except RedisError:
        logger.warning(
            "enqueue.buffer_push_failed", extra={"queue": queue.name, "count": len(tasks)}
        )


def _due_time(spec: TaskSpec, now: datetime) -> datetime:
    if spec.delay_seconds is not None:
        return now + timedelta(seconds=spec.delay_seconds)
    if spec.scheduled_at is not None and spec.scheduled_at > now:
        return spec.scheduled_at
    return now
