"""Tasks built the way TaskForge builds them: through the production verbs only.

`TaskFactory(status="dead")` enqueues a task the way an enqueue does (straight
into `claimed` when it is to go further, as the enqueue's fast path does),
hands it out as a claim does and fails it as a nack does, so every factory
task has the event history a real one would and no factory runs code that
production does not.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import factory
from django.db import transaction
from django.utils import timezone

from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI
from tasks import schedules, transitions
from tasks.models import Schedule, Task, TaskStatus

S = TaskStatus

# The steps after the enqueue to reach each status.
_PATHS: dict[str, list[str]] = {
    S.PENDING: [],
    S.CLAIMED: [],
    S.EXECUTING: ["hand_out"],
    S.DONE: ["hand_out", "ack"],
    S.RETRY: ["hand_out", "fail"],
    S.DEAD: ["hand_out", "kill"],
    S.CANCELLED: ["cancel"],
}
# Statuses reached through `claimed`: the enqueue buffers the task at once.
_BUFFERED = {S.CLAIMED, S.EXECUTING, S.DONE, S.RETRY, S.DEAD}


def walk(task: Task, to_status: str, *, worker_id: str = "worker-1") -> Task:
    """Move a pending or claimed task to `to_status`; returns the task as its row now is.

    A pending task is buffered as the dispatcher does (`buffer_due`): it must
    be the first due task of its queue.
    """
    with transaction.atomic():
        if task.status == S.PENDING and to_status in _BUFFERED:
            picked = transitions.buffer_due(task.queue, limit=1)
            assert [row[0] for row in picked] == [str(task.pk)], "not the queue's next task"
            task.refresh_from_db()
        for step in _PATHS[to_status]:
            if step == "hand_out":
                # A task with an HTTP target is a push process's to take.
                push = task.http_request is not None
                [task] = transitions.hand_out([str(task.pk)], worker_id=worker_id, push=push)
            elif step == "ack":
                [task] = transitions.ack(
                    [(str(task.pk), None, '{"ok": true}')], worker_id=worker_id
                )
            elif step == "fail":
                transitions.fail(task, error="boom")
            elif step == "kill":
                transitions.fail(task, error="boom", retry=False)
            elif step == "cancel":
                transitions.cancel([task])
    return task


def age_lease(task_id: Any, seconds: float) -> None:
    """The executing task was handed out, and last heartbeated, `seconds` ago (the
    watchdog looks for leases among tasks handed out before its cutoff)."""
    then = timezone.now() - timedelta(seconds=seconds)
    Task.objects.filter(pk=task_id).update(claimed_at=then, heartbeat_at=then)


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    queue = factory.SubFactory(QueueFactory)
    payload = factory.Sequence(lambda n: {"n": n})
    priority = 5
    max_retries = factory.LazyAttribute(lambda o: o.queue.max_retries)

    # Not model fields: _create walks the task to `status` as `worker_id`.
    status = S.PENDING
    worker_id = "worker-1"

    @classmethod
    def _create(cls, model_class: type[Task], *args: Any, **kwargs: Any) -> Task:
        status = kwargs.pop("status", S.PENDING)
        worker_id = kwargs.pop("worker_id", "worker-1")
        now = timezone.now()
        kwargs.setdefault("scheduled_at", now)
        buffered = status in _BUFFERED
        if buffered and kwargs["scheduled_at"] > now:
            raise ValueError(f"A task due later cannot be {status} yet.")
        with transaction.atomic():
            key = kwargs.get("fairness_key")
            [task] = transitions.create(
                [transitions.NewTask(**kwargs)],
                now=now,
                buffer=buffered,
                buffer_keys={key} if buffered and key is not None else (),
            )
        return walk(task, status, worker_id=worker_id)


class ScheduleFactory(factory.django.DjangoModelFactory):
    """A schedule as the API creates it (`tasks.schedules.create_schedule`)."""

    class Meta:
        model = Schedule

    queue = factory.SubFactory(QueueFactory)
    name = factory.Sequence(lambda n: f"schedule-{n}")
    cron = "0 * * * *"
    payload = factory.Sequence(lambda n: {"schedule": n})

    @classmethod
    def _create(cls, model_class: type[Schedule], *args: Any, **kwargs: Any) -> Schedule:
        return schedules.create_schedule(kwargs.pop("queue"), actor=CLI, **kwargs)
