from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from queues.tests.factories import QueueFactory
from tasks import transitions
from tasks.models import Task, TaskStatus
from tasks.scheduler import SchedulerLoop
from tasks.tests.factories import TaskFactory

S = TaskStatus
pytestmark = pytest.mark.django_db


def test_tick__promotes_due_retries_only() -> None:
    due = TaskFactory(status=S.RETRY)
    later = TaskFactory(status=S.RETRY)
    Task.objects.filter(pk=due.pk).update(scheduled_at=timezone.now() - timedelta(seconds=1))
    Task.objects.filter(pk=later.pk).update(scheduled_at=timezone.now() + timedelta(hours=1))
    SchedulerLoop().tick()
    assert Task.objects.get(pk=due.pk).status == S.PENDING
    assert Task.objects.get(pk=later.pk).status == S.RETRY


@pytest.mark.django_db(transaction=True)
def test_tick__notifies_dispatchers_of_delayed_tasks_now_due() -> None:
    queue = QueueFactory()
    TaskFactory(queue=queue, scheduled_at=timezone.now() + timedelta(milliseconds=200))
    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    with psycopg.connect(**params, autocommit=True) as listener:
        listener.execute("LISTEN taskforge_dispatch")
        loop = SchedulerLoop()
        loop.tick()  # not due yet
        time.sleep(0.3)
        loop.tick()
        payloads = [n.payload for n in listener.notifies(timeout=1, stop_after=1)]
        assert payloads == [str(queue.id)]


def test_promote__is_a_transition_with_an_event() -> None:
    task = TaskFactory(status=S.RETRY)
    transitions.promote([task])
    last = task.events.order_by("-id").first()
    assert last is not None and last.to_status == S.PENDING
