"""Firing schedules: once per fire time, the latest missed one only, across DST."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI
from tasks import events, schedules
from tasks.models import Schedule, Task, TaskStatus
from tasks.tests.factories import ScheduleFactory

pytestmark = pytest.mark.django_db
S = TaskStatus


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0):
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


def point(schedule: Schedule, at: datetime) -> Schedule:
    """Set the schedule's next fire time (as if it was created long ago)."""
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=at)
    schedule.refresh_from_db()
    return schedule


def test_fire_due__enqueues_one_task_and_moves_the_pointer() -> None:
    queue = QueueFactory(max_retries=7)
    schedule = ScheduleFactory(queue=queue, cron="0 * * * *", payload={"p": 1}, priority=2)
    fire_at = utc(2030, 1, 1, 10)
    point(schedule, fire_at)

    assert schedules.fire_due(fire_at + timedelta(milliseconds=5)) == 1

    [task] = Task.objects.filter(queue=queue)
    assert (task.payload, task.priority, task.max_retries) == ({"p": 1}, 2, 7)
    assert task.idempotency_key == f"schedule:{schedule.pk}:2030-01-01T10:00:00Z"
    schedule.refresh_from_db()
    assert schedule.last_run_at == fire_at
    assert schedule.next_run_at == utc(2030, 1, 1, 11)


def test_fire_due__uses_the_schedules_max_retries_when_set() -> None:
    schedule = ScheduleFactory(max_retries=0)
    point(schedule, timezone.now())
    schedules.fire_due()
    assert Task.objects.get().max_retries == 0


def test_fire_due__nothing_before_the_fire_time() -> None:
    schedule = ScheduleFactory()
    point(schedule, utc(2030, 1, 1, 10))
    assert schedules.fire_due(utc(2030, 1, 1, 9, 59, 59)) == 0
    assert not Task.objects.exists()


def test_fire_due__paused_schedules_do_not_fire() -> None:
    schedule = ScheduleFactory(paused=True)
    point(schedule, utc(2030, 1, 1, 10))
    assert schedules.fire_due(utc(2030, 1, 1, 12)) == 0
    assert not Task.objects.exists()


def test_fire_due__missed_times_enqueue_only_the_latest_once() -> None:
    schedule = ScheduleFactory(cron="0 * * * *")
    point(schedule, utc(2030, 1, 1, 10))  # 10:00, 11:00, 12:00 were missed

    assert schedules.fire_due(utc(2030, 1, 1, 12, 30)) == 1
    assert schedules.fire_due(utc(2030, 1, 1, 12, 31)) == 0

    [task] = Task.objects.all()
    assert task.idempotency_key == f"schedule:{schedule.pk}:2030-01-01T12:00:00Z"
    schedule.refresh_from_db()
    assert (schedule.last_run_at, schedule.next_run_at) == (
        utc(2030, 1, 1, 12),
        utc(2030, 1, 1, 13),
    )


def test_resume__enqueues_the_latest_time_missed_while_paused_once() -> None:
    schedule = ScheduleFactory(cron="0 * * * *", paused=True)  # created paused
    point(schedule, utc(2030, 1, 1, 10))
    schedules.update_schedule(schedule.queue, schedule.name, paused=False, actor=CLI)

    assert schedules.fire_due(utc(2030, 1, 1, 14, 5)) == 1
    assert list(Task.objects.values_list("idempotency_key", flat=True)) == [
        f"schedule:{schedule.pk}:2030-01-01T14:00:00Z"
    ]


def test_pause_and_resume_with_no_time_between__fires_nothing_extra() -> None:
    schedule = ScheduleFactory(cron="0 * * * *")
    point(schedule, utc(2030, 1, 1, 10))
    schedules.update_schedule(schedule.queue, schedule.name, paused=True, actor=CLI)
    schedules.update_schedule(schedule.queue, schedule.name, paused=False, actor=CLI)
    assert schedules.fire_due(utc(2030, 1, 1, 9, 30)) == 0


def test_fire_due__a_repeated_hour_fires_once() -> None:
    # New York, 2024-11-03: 01:30 happens at 05:30Z (EDT) and again at 06:30Z (EST).
    schedule = ScheduleFactory(cron="30 1 * * *", timezone="America/New_York")
    point(schedule, utc(2024, 11, 3, 5, 30))

    assert schedules.fire_due(utc(2024, 11, 3, 5, 30, 1)) == 1
    assert schedules.fire_due(utc(2024, 11, 3, 6, 30, 1)) == 0
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2024, 11, 4, 6, 30)
    assert Task.objects.count() == 1


def test_fire_due__a_skipped_time_fires_once_after_the_gap() -> None:
    # New York, 2024-03-10: 02:00-03:00 does not exist; 02:30 fires at 03:00 EDT (07:00Z).
    schedule = ScheduleFactory(cron="30 2 * * *", timezone="America/New_York")
    point(schedule, utc(2024, 3, 10, 7))  # what the day before's fire moved it to

    assert schedules.fire_due(utc(2024, 3, 10, 7, 0, 1)) == 1
    assert schedules.fire_due(utc(2024, 3, 10, 7, 59)) == 0
    schedule.refresh_from_db()
    assert schedule.next_run_at == utc(2024, 3, 11, 6, 30)  # 02:30 EDT


def test_fire_due__a_change_of_cron_starts_afresh() -> None:
    schedule = ScheduleFactory(cron="0 * * * *")
    point(schedule, utc(2020, 1, 1))
    changed = schedules.update_schedule(
        schedule.queue, schedule.name, cron="*/5 * * * *", actor=CLI
    )
    assert timezone.now() < changed.next_run_at <= timezone.now() + timedelta(minutes=5)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_fire_due__many_schedulers_at_once_enqueue_one_task_per_fire_time() -> None:
    queue = QueueFactory()
    made = [ScheduleFactory(queue=queue, cron="0 0 1 1 *") for _ in range(40)]
    fire_at = utc(timezone.now().year, 1, 1)  # the next one is next year: no catch-up
    Schedule.objects.filter(pk__in=[s.pk for s in made]).update(next_run_at=fire_at)
    start = threading.Barrier(6)
    fired: list[int] = []
    errors: list[BaseException] = []

    def scheduler() -> None:
        try:
            start.wait(timeout=10)
            for _ in range(5):
                fired.append(schedules.fire_due(limit=7))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=scheduler) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)

    assert errors == []
    assert sum(fired) == 40
    keys = sorted(
        str(key)
        for key in Task.objects.filter(queue=queue).values_list("idempotency_key", flat=True)
    )
    assert keys == sorted(schedules.idempotency_key(s, fire_at) for s in made)
    assert not Schedule.objects.filter(next_run_at__lte=fire_at).exists()


def test_fire_due__the_key_keeps_a_second_fire_of_the_same_time_out() -> None:
    """Belt and braces: a pointer put back (a restored backup, say) makes no second task."""
    schedule = ScheduleFactory(cron="0 * * * *")
    point(schedule, utc(2030, 1, 1, 10))
    schedules.fire_due(utc(2030, 1, 1, 10, 0, 1))
    point(schedule, utc(2030, 1, 1, 10))
    schedules.fire_due(utc(2030, 1, 1, 10, 0, 2))
    assert Task.objects.count() == 1


def test_fire_due__tasks_are_ordinary_due_tasks_of_the_queue() -> None:
    schedule = ScheduleFactory()
    point(schedule, timezone.now())
    schedules.fire_due()
    task = Task.objects.get()
    assert task.status in (S.PENDING, S.CLAIMED)
    assert task.scheduled_at <= timezone.now()
    first = events.chain(task, 1)[0]
    assert (first.from_status, first.to_status, first.at) == (None, S.PENDING, task.created_at)


def test_fire_due__a_schedule_that_cannot_fire_does_not_stop_the_others() -> None:
    broken = ScheduleFactory(name="broken")
    healthy = ScheduleFactory(name="healthy")
    at = utc(2030, 1, 1, 10)
    Schedule.objects.filter(pk__in=[broken.pk, healthy.pk]).update(next_run_at=at)
    Schedule.objects.filter(pk=broken.pk).update(timezone="Gone/Away")

    assert schedules.fire_due(at) == 2

    assert list(Task.objects.values_list("idempotency_key", flat=True)) == [
        schedules.idempotency_key(healthy, at)
    ]
    broken.refresh_from_db()
    assert broken.next_run_at == at + schedules.RETRY_FAILED


def test_upcoming_run_at__a_schedule_that_cannot_fire_shows_its_pointer() -> None:
    schedule = ScheduleFactory()
    at = utc(2020, 1, 1)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=at, timezone="Gone/Away")
    schedule.refresh_from_db()
    assert schedule.upcoming_run_at(timezone.now()) == at


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_delete_queue__while_a_schedule_fires_waits_for_it_without_a_deadlock() -> None:
    from django.db import transaction

    from queues.exceptions import QueueNotEmpty
    from tasks import services

    schedule = ScheduleFactory()
    queue = schedule.queue
    holding = threading.Event()
    deleting = threading.Event()
    errors: list[BaseException] = []

    def scheduler() -> None:
        # What fire_due does: the schedule's row, then the enqueue into its queue.
        try:
            with transaction.atomic():
                Schedule.objects.select_for_update(no_key=True).get(pk=schedule.pk)
                holding.set()
                deleting.wait(5)
                time.sleep(0.3)  # the delete is waiting on us by now
                services.enqueue(queue, [services.TaskSpec(payload=1)])
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=scheduler)
    thread.start()
    assert holding.wait(5)
    deleting.set()
    started = time.monotonic()
    with pytest.raises(QueueNotEmpty):
        services.delete_queue(queue, actor=CLI)  # the fired task is live: 409, nothing deleted
    thread.join(10)
    assert errors == []
    assert time.monotonic() - started < 1.0  # no deadlock_timeout (1 s) was waited out
    assert Schedule.objects.filter(pk=schedule.pk).exists()
