from __future__ import annotations

import time
from datetime import timedelta

import psycopg
import pytest
from django.db import connection, transaction
from django.utils import timezone

from queues.tests.factories import QueueFactory
from taskforge.lib import pg
from tasks import services, transitions
from tasks.models import Schedule, Task, TaskStatus
from tasks.scheduler import SchedulerLoop
from tasks.tests.factories import ScheduleFactory, TaskFactory

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
    with pg.connect_own(autocommit=True) as listener:
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


def test_tick__fires_due_schedules() -> None:
    schedule = ScheduleFactory(cron="* * * * *")
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now())
    SchedulerLoop().tick()
    assert Task.objects.filter(queue=schedule.queue).count() == 1


def test_tick__with_nothing_due_is_one_query(django_assert_num_queries) -> None:
    """Issue 15: sleeping until the next due time costs no more Postgres work when idle."""
    ScheduleFactory(cron="0 0 1 1 *")
    TaskFactory(scheduled_at=timezone.now() + timedelta(hours=1))
    loop = SchedulerLoop()
    loop.tick()  # the first one also LISTENs
    with django_assert_num_queries(1):
        assert loop.tick() is False


def test_tick__remembers_the_next_due_time() -> None:
    later = timezone.now() + timedelta(minutes=5)
    TaskFactory(scheduled_at=later)
    loop = SchedulerLoop()
    loop.tick()
    assert loop._next_due == later


def _idle_loop() -> SchedulerLoop:
    """A scheduler that ticked once, with no NOTIFY left over from earlier tests."""
    loop = SchedulerLoop()
    loop.tick()
    list(connection.connection.notifies(timeout=0.0))
    return loop


def _wait_seconds(loop: SchedulerLoop, seconds: float) -> float:
    started = time.monotonic()
    loop.wait(seconds)
    return time.monotonic() - started


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_wait__ends_at_the_next_due_time() -> None:
    schedule = ScheduleFactory(cron="* * * * *")
    due = timezone.now() + timedelta(milliseconds=300)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=due)
    loop = SchedulerLoop()
    loop.tick()
    waited = _wait_seconds(loop, 5.0)
    assert 0.25 <= waited < 0.6
    loop.tick()
    assert timezone.now() - due < timedelta(milliseconds=300)
    assert Task.objects.filter(queue=schedule.queue).count() == 1


def _raw_connection() -> psycopg.Connection:
    """A connection of its own, outside Django's (and its pool's)."""
    return pg.connect_own(autocommit=True)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_wait__a_notify_of_an_earlier_time_wakes_it_then() -> None:
    loop = _idle_loop()  # nothing due: it would sleep the whole tick
    with _raw_connection() as other:
        at = time.time() + 0.3
        other.execute("SELECT pg_notify('taskforge_scheduler', %s)", [f"{at:.6f}"])
        waited = _wait_seconds(loop, 5.0)
    assert 0.25 <= waited < 0.6


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_wait__a_notify_of_a_later_time_does_not_wake_it_early() -> None:
    loop = _idle_loop()
    with _raw_connection() as other:
        other.execute("SELECT pg_notify('taskforge_scheduler', %s)", [f"{time.time() + 60:.6f}"])
        waited = _wait_seconds(loop, 0.4)
    assert 0.35 <= waited < 0.6


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("delay", [0.0, 0.5])
def test_enqueue__a_delayed_task_tells_the_schedulers_its_time(delay: float) -> None:
    queue = QueueFactory()
    with _raw_connection() as listener:
        listener.execute("LISTEN taskforge_scheduler")
        before = time.time()
        services.enqueue(queue, [services.TaskSpec(payload=1, delay_seconds=delay)])
        payloads = [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)]
    if delay:
        assert len(payloads) == 1 and before + delay <= float(payloads[0]) < time.time() + delay
    else:
        assert payloads == []  # due now: the dispatchers are told, not the schedulers


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_fail__tells_the_schedulers_when_the_retry_is_due() -> None:
    task = TaskFactory(status=S.EXECUTING)
    with _raw_connection() as listener:
        listener.execute("LISTEN taskforge_scheduler")
        with transaction.atomic():
            locked = Task.objects.select_for_update().select_related("queue").get(pk=task.pk)
            transitions.fail(locked, error="boom", retry_after_seconds=30)
        payloads = [n.payload for n in listener.notifies(timeout=0.5, stop_after=1)]
    due = Task.objects.get(pk=task.pk).scheduled_at
    assert payloads == [f"{due.timestamp():.6f}"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_tick__a_delayed_task_committed_after_its_time_is_still_announced() -> None:
    """Its NOTIFY names a time already past here; the tick looks back to it."""
    queue = QueueFactory()
    loop = _idle_loop()
    due = timezone.now() - timedelta(milliseconds=50)
    loop._checked_until = timezone.now()  # a tick ran after `due`, before the commit
    TaskFactory(queue=queue, scheduled_at=timezone.now())  # due: not what is looked for
    with _raw_connection() as listener:
        listener.execute("LISTEN taskforge_dispatch")
        Task.objects.filter(queue=queue).update(scheduled_at=due)
        with _raw_connection() as other:
            other.execute("SELECT pg_notify('taskforge_scheduler', %s)", [f"{due.timestamp():.6f}"])
        _wait_seconds(loop, 0.2)
        assert loop._late_since is not None
        loop.tick()
        payloads = [n.payload for n in listener.notifies(timeout=1, stop_after=1)]
    assert payloads == [str(queue.id)]


def test_tick__works_while_its_listen_url_is_unreachable(settings, caplog) -> None:
    """DATABASE_LISTEN_URL down (a session pool, say): the tick still does its work."""
    from tests.service import free_port

    settings.DATABASE_LISTEN_URL = f"postgres://nobody@127.0.0.1:{free_port()}/nowhere"
    due = TaskFactory(status=S.RETRY)
    Task.objects.filter(pk=due.pk).update(scheduled_at=timezone.now() - timedelta(seconds=1))
    loop = SchedulerLoop()
    loop.tick()
    assert Task.objects.get(pk=due.pk).status == S.PENDING
    assert "listen.unavailable" in caplog.text
    loop.wait(0.05)  # falls back to sleeping, no error
