from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
import redis
from django.utils import timezone

from dlq.models import DeadLetterTask
from queues.tests.factories import QueueFactory
from tasks.buffer import get_buffer
from tasks.models import Task, TaskStatus
from tasks.tests.factories import TaskFactory, age_lease
from tasks.transitions import LEASE_EXPIRED_ERROR
from workers.models import Worker
from workers.watchdog import WatchdogLoop

S = TaskStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client")]


def test_expire_leases__failed_attempt_then_dead() -> None:
    queue = QueueFactory(max_retries=1)
    retrying = TaskFactory(queue=queue, status=S.EXECUTING)
    fresh = TaskFactory(queue=queue, status=S.EXECUTING)
    age_lease(retrying.pk, 31)
    WatchdogLoop().expire_leases()
    retrying.refresh_from_db()
    assert (retrying.status, retrying.last_error) == (S.RETRY, LEASE_EXPIRED_ERROR)
    assert Task.objects.get(pk=fresh.pk).status == S.EXECUTING

    last = TaskFactory(queue=queue, status=S.EXECUTING, max_retries=0)
    age_lease(last.pk, 60)
    WatchdogLoop().expire_leases()
    assert Task.objects.get(pk=last.pk).status == S.DEAD
    assert DeadLetterTask.objects.get(task=last).last_error == LEASE_EXPIRED_ERROR


def test_expire_leases__a_long_task_that_heartbeats_keeps_its_lease() -> None:
    """Handed out long before the cutoff but heartbeated since: not expired (the
    watchdog reads tasks by hand-out time, then checks each one's heartbeat)."""
    long_running = TaskFactory(status=S.EXECUTING)
    age_lease(long_running.pk, 3600)
    Task.objects.filter(pk=long_running.pk).update(heartbeat_at=timezone.now())
    assert WatchdogLoop().expire_leases() is False
    assert Task.objects.get(pk=long_running.pk).status == S.EXECUTING


def test_expire_leases__marks_the_worker_that_lost_them() -> None:
    """The dashboard tells a crashed worker (stale) from one that left cleanly."""
    seen = timezone.now() - timedelta(seconds=40)
    Worker.objects.create(worker_id="crashed", last_seen_at=seen)
    Worker.objects.create(worker_id="drained", last_seen_at=seen)
    expired = TaskFactory(status=S.EXECUTING, worker_id="crashed")
    age_lease(expired.pk, 31)

    WatchdogLoop().expire_leases()

    crashed = Worker.objects.get(pk="crashed")
    assert crashed.lost_tasks_at is not None and crashed.lost_tasks()
    assert crashed.state(timezone.now(), holding=False) == "stale"
    drained = Worker.objects.get(pk="drained")
    assert drained.lost_tasks_at is None
    assert drained.state(timezone.now(), holding=False) == "left"


def test_reconcile__restores_claimed_tasks_missing_from_redis(settings) -> None:
    settings.TASKFORGE_BUFFER_RECONCILE_SECONDS = 3
    queue = QueueFactory()
    lost = TaskFactory(queue=queue, status=S.CLAIMED)  # never pushed to Redis
    recent = TaskFactory(queue=queue, status=S.CLAIMED)
    Task.objects.filter(pk=lost.pk).update(status_changed_at=timezone.now() - timedelta(seconds=2))
    assert WatchdogLoop().reconcile() == 1
    assert get_buffer().take(queue.id, 10, None).ids == [str(lost.pk)]
    assert Task.objects.get(pk=recent.pk).status == S.CLAIMED


def test_reconcile__leaves_present_entries_alone(redis_client: redis.Redis, settings) -> None:
    settings.TASKFORGE_BUFFER_RECONCILE_SECONDS = 3
    queue = QueueFactory()
    task = TaskFactory(queue=queue, status=S.CLAIMED)
    Task.objects.filter(pk=task.pk).update(status_changed_at=timezone.now() - timedelta(seconds=5))
    get_buffer().push(queue.id, [(str(task.pk), 7)])
    assert WatchdogLoop().reconcile() == 0
    assert redis_client.zscore(f"tf:{{{queue.id}}}:ready", str(task.pk)) == 7


def test_forget_workers__after_a_day() -> None:
    Worker.objects.create(worker_id="old", last_seen_at=timezone.now() - timedelta(days=2))
    Worker.objects.create(worker_id="new", last_seen_at=timezone.now())
    WatchdogLoop().forget_workers()
    assert list(Worker.objects.values_list("worker_id", flat=True)) == ["new"]


def test_interval__reconciles_well_within_the_reconcile_delay(settings) -> None:
    settings.TASKFORGE_WATCHDOG_INTERVAL_SECONDS = 15
    settings.TASKFORGE_BUFFER_RECONCILE_SECONDS = 30
    assert WatchdogLoop().interval == 10


def test_tick__deletes_finished_tasks_past_their_retention(settings: Any) -> None:
    settings.TASKFORGE_RETENTION_SECONDS = 60
    old, recent = TaskFactory(status=S.DONE), TaskFactory(status=S.DONE)
    Task.objects.filter(pk=old.pk).update(finished_at=timezone.now() - timedelta(minutes=2))
    WatchdogLoop().tick()
    assert not Task.objects.filter(pk=old.pk).exists()
    assert Task.objects.filter(pk=recent.pk).exists()
