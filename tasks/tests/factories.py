"""Tasks built the way TaskForge builds them: created, then walked through transitions.

`TaskFactory(status="dead")` creates a pending task and moves it along the
lifecycle (pending -> claimed -> executing -> ... -> dead), so every factory
task has the event history a real one would.
"""

from __future__ import annotations

from typing import Any

import factory
from django.db import transaction
from django.utils import timezone

from queues.tests.factories import QueueFactory
from tasks import transitions
from tasks.models import Task, TaskStatus

S = TaskStatus

# How to reach each status from pending, one transition verb at a time.
_PATHS: dict[str, list[str]] = {
    S.PENDING: [],
    S.CLAIMED: ["buffer"],
    S.EXECUTING: ["buffer", "hand_out"],
    S.DONE: ["buffer", "hand_out", "ack"],
    S.RETRY: ["buffer", "hand_out", "fail"],
    S.DEAD: ["buffer", "hand_out", "kill"],
    S.CANCELLED: ["cancel"],
}


def walk(task: Task, to_status: str, *, worker_id: str = "worker-1") -> Task:
    """Move a pending task to `to_status` through the transitions module."""
    with transaction.atomic():
        for step in _PATHS[to_status]:
            if step == "buffer":
                transitions.buffer([task])
            elif step == "hand_out":
                transitions.hand_out([task], worker_id=worker_id)
            elif step == "ack":
                transitions.ack(task, result={"ok": True})
            elif step == "fail":
                transitions.fail(task, error="boom")
            elif step == "kill":
                transitions.fail(task, error="boom", retry=False)
            elif step == "cancel":
                transitions.cancel([task])
    return task


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
        kwargs.setdefault("scheduled_at", timezone.now())
        task = model_class(*args, **kwargs)
        with transaction.atomic():
            transitions.create([task])
        return walk(task, status, worker_id=worker_id)
