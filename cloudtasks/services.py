"""What the Cloud Tasks methods do to TaskForge's queues and tasks.

Each goes through the domain's own services and verbs (`queues.services`,
`tasks.services`, `tasks.transitions`, `tasks.names`), with the audit entry
of the native action it is.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from cloudtasks import errors
from cloudtasks.taskbody import TaskBody
from queues import lookup
from queues.models import Queue
from taskforge.audit.log import Actor, record
from taskforge.audit.models import Action
from taskforge.lib.redisconn import REDIS_FAILURES
from tasks import lifecycle, names, transitions
from tasks import services as task_services
from tasks.buffer import RUN_LANE, get_buffer, score
from tasks.exceptions import NameTaken, NameUsedRecently
from tasks.models import Schedule, Task, TaskStatus

logger = logging.getLogger(__name__)

# Statuses in which a task is seen over /v2 (API-cloudtasks.md: finished ones are not).
VISIBLE = lifecycle.IN_PROGRESS


def create_task(
    queue_name: str, body: TaskBody, *, trace: tuple[str | None, str | None] = (None, None)
) -> Task:
    """Store a task with an HTTP target as `pending` in the queue of that name; a named
    one takes its name.

    The queue's row comes from this process's memory (`queues.lookup`), as the
    native enqueue's does: a row remembered from before the queue was deleted
    fails the insert's foreign key, and the queue is then read afresh once (it
    may have been made again under its name).

    `trace`: the W3C Trace Context of the request (API.md "Tracing (v1.2)").

    Raises:
        RpcError: ALREADY_EXISTS (name taken or used recently), NOT_FOUND (no such queue).
    """
    for fresh in (False, True):
        queue = queue_named(queue_name, fresh=fresh)
        try:
            return _create_task(queue, body, trace)
        except IntegrityError:
            lookup.forget(queue)
    raise errors.not_found("Queue does not exist.")


def _create_task(queue: Queue, body: TaskBody, trace: tuple[str | None, str | None]) -> Task:
    new = transitions.NewTask(
        queue=queue,
        payload=None,
        priority=5,
        scheduled_at=body.scheduled_at,
        max_retries=queue.max_retries,
        name=body.task_id,
        http_request=body.http_request,
        retry_config=body.retry_config,
        traceparent=trace[0],
        tracestate=trace[1],
    )
    if body.task_id is None:
        # One INSERT statement: atomic by itself, no transaction to open.
        [task] = transitions.create([new])
        return task
    try:
        with transaction.atomic():
            [task] = transitions.create([new])
            names.take(queue, body.task_id, task.pk, now=timezone.now())
    except NameUsedRecently as exc:
        raise errors.already_exists(exc.message) from exc
    except NameTaken as exc:
        raise errors.already_exists(exc.message) from exc
    return task


def find_task(queue: Queue, task_id: str, *, lock: bool = False) -> Task:
    """The task of that ID in the queue while it is visible over /v2 (not finished).

    A named task is found through its name (tasks_taskname); any other by its id.

    Raises:
        RpcError: NOT_FOUND.
    """
    tasks = Task.objects.filter(queue=queue, status__in=VISIBLE)
    if lock:
        tasks = tasks.select_for_update(no_key=True, of=("self",))
    holder = names.holder_of(queue, task_id)
    task = None
    if holder is not None:
        task = tasks.filter(pk=holder, name=task_id).first()
    if task is None and _is_uuid(task_id):
        task = tasks.filter(pk=task_id, name__isnull=True).first()
    if task is None:
        raise errors.not_found("Task does not exist.")
    task.queue = queue
    return task


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return len(text) == 36


def delete_task(queue: Queue, task_id: str, *, actor: Actor) -> None:
    """Cancel a visible task from any live status (audited `task.cancel`); an attempt
    in flight is cut short: its answer is discarded.

    Raises:
        RpcError: NOT_FOUND.
    """
    with transaction.atomic():
        task = find_task(queue, task_id, lock=True)
        if task.status == TaskStatus.EXECUTING:
            transitions.cancel_attempt(task)
        else:
            transitions.cancel([task])
        record(actor, Action.TASK_CANCEL, queue=queue.name, target=str(task.pk))


# How long RunTask waits for a push process to dispatch the task (the contract: 1 s).
RUN_WAIT_SECONDS = 2.0


def run_task(queue: Queue, task_id: str, *, actor: Actor) -> Task:
    """Dispatch a task now, whatever its queue's pause, rate, cap or its scheduleTime
    (audited `task.run`); answers it as dispatched, or as it is when no push process
    took it within RUN_WAIT_SECONDS.  An executing task is answered as it is.

    Raises:
        RpcError: NOT_FOUND; FAILED_PRECONDITION for a task made natively.
    """
    with transaction.atomic():
        task = find_task(queue, task_id, lock=True)
        if task.http_request is None:
            raise errors.failed_precondition(
                "RunTask needs a task created over /v2 (with an httpRequest)."
            )
        if task.status == TaskStatus.EXECUTING:
            return task
        if task.status == TaskStatus.RETRY:
            transitions.promote([task])
        if task.status == TaskStatus.PENDING:
            transitions.run_now(task)
        record(actor, Action.TASK_RUN, queue=queue.name, target=str(task.pk))
        item = (str(task.pk), score(task.priority, task.scheduled_at))
        transaction.on_commit(lambda: get_buffer().push(queue.id, [item], wake=True, lane=RUN_LANE))
    deadline = time.monotonic() + RUN_WAIT_SECONDS
    attempts = task.attempts
    while time.monotonic() < deadline:
        time.sleep(0.02)
        current = Task.objects.filter(pk=task.pk).first()
        if current is None or current.attempts > attempts:
            task = current or task
            break
    task.queue = queue
    return task


def purge_queue(queue: Queue, *, actor: Actor) -> Queue:
    """The native purge, then the queue's purgeTime."""
    task_services.purge_queue(queue, actor=actor)
    queue.purged_at = timezone.now()
    Queue.objects.filter(pk=queue.pk).update(purged_at=queue.purged_at)
    return queue


def delete_queue(queue: Queue, *, actor: Actor) -> None:
    """Delete the queue with every task of it, as Cloud Tasks does (audited
    `queue.delete` with `{"tasks_deleted": n}`); the name is free at once.

    An attempt in flight finds its task gone: its answer changes nothing.

    Raises:
        RpcError: NOT_FOUND (deleted meanwhile).
    """
    with transaction.atomic():
        # Lock order as tasks.services.delete_queue: schedules, then the queue.
        list(
            Schedule.objects.select_for_update()
            .filter(queue=queue)
            .order_by("id")
            .values_list("pk", flat=True)
        )
        if not Queue.objects.select_for_update().filter(pk=queue.pk).exists():
            raise errors.not_found("Queue does not exist.")
        count = Task.objects.filter(queue=queue).count()
        queue_id = queue.pk
        queue.delete()  # its tasks, events, names, schedules and DLQ entries cascade
        record(
            actor,
            Action.QUEUE_DELETE,
            queue=queue.name,
            target=queue.name,
            details={"tasks_deleted": count},
        )
        transaction.on_commit(lambda: _forget_buffer(queue_id))
    lookup.forget(queue)


def _forget_buffer(queue_id: Any) -> None:
    try:
        get_buffer().forget_queue(str(queue_id))
    except REDIS_FAILURES:
        logger.warning("queue.buffer_not_forgotten", extra={"queue_id": str(queue_id)})


def queue_named(name: str, *, fresh: bool = True) -> Queue:
    """The queue of that name (`fresh` False: as remembered by `queues.lookup`).

    Raises: RpcError NOT_FOUND."""
    queue = lookup.by_name(name, fresh=fresh)
    if queue is None:
        raise errors.not_found("Queue does not exist.")
    return queue
