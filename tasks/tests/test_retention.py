"""Retention (tasks.retention, API.md v1.1): old finished tasks go, with their events."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.db import connections, transaction
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from dlq.models import DeadLetterTask
from queues.tests.factories import QueueFactory
from tasks import retention, transitions
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory
from tests.test_metrics import scrape, unique, value
from workers import protocol
from workers.tests.test_protocol import _buffered

S = TaskStatus
DAY = timedelta(days=1)


def _exists(task: Any) -> bool:
    return Task.objects.filter(pk=task.pk).exists()


@pytest.mark.django_db
def test_delete_expired__old_done_and_cancelled_go_with_their_events() -> None:
    done = TaskFactory(status=S.DONE)
    cancelled = TaskFactory(status=S.CANCELLED)
    assert retention.delete_expired(now=timezone.now() + 6 * DAY) == 0  # not 7 days yet
    assert retention.delete_expired(now=timezone.now() + 8 * DAY) == 2
    assert not _exists(done) and not _exists(cancelled)
    assert not TaskEvent.objects.filter(task_id__in=[done.pk, cancelled.pk]).exists()


@pytest.mark.django_db
def test_delete_expired__live_tasks_stay_however_old() -> None:
    live = [TaskFactory(status=s) for s in (S.PENDING, S.CLAIMED, S.EXECUTING, S.RETRY)]
    assert retention.delete_expired(now=timezone.now() + 400 * DAY) == 0
    assert all(_exists(task) for task in live)


@pytest.mark.django_db
def test_delete_expired__dead_tasks_keep_the_longer_dlq_retention() -> None:
    dead = TaskFactory(status=S.DEAD)
    assert DeadLetterTask.objects.filter(task_id=dead.pk).exists()
    assert retention.delete_expired(now=timezone.now() + 8 * DAY) == 0
    assert retention.delete_expired(now=timezone.now() + 31 * DAY) == 1
    assert not _exists(dead)
    assert not DeadLetterTask.objects.filter(task_id=dead.pk).exists()


@pytest.mark.django_db
def test_delete_expired__zero_keeps_them_forever(settings: Any) -> None:
    settings.TASKFORGE_RETENTION_SECONDS = 0
    settings.TASKFORGE_DLQ_RETENTION_SECONDS = 0
    kept = [TaskFactory(status=S.DONE), TaskFactory(status=S.DEAD)]
    assert retention.delete_expired(now=timezone.now() + 4000 * DAY) == 0
    assert all(_exists(task) for task in kept)


@pytest.mark.django_db
def test_delete_expired__works_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(retention, "BATCH", 2)
    tasks = [TaskFactory(status=S.DONE) for _ in range(5)]
    assert retention.delete_expired(now=timezone.now() + 8 * DAY, max_batches=2) == 4
    assert sum(_exists(task) for task in tasks) == 1
    assert retention.delete_expired(now=timezone.now() + 8 * DAY) == 1


@pytest.mark.django_db
def test_deleted_task__answers_404_and_counters_stay(
    make_client: Any, django_capture_on_commit_callbacks: Any
) -> None:
    queue = QueueFactory(name=unique("retention"))
    before = scrape(Client())
    with django_capture_on_commit_callbacks(execute=True):  # counters count on commit
        done = TaskFactory(queue=queue, status=S.DONE)
    counted = scrape(Client())
    completed = value(counted, "taskforge_tasks_completed_total", queue=queue.name, status="done")
    retention.delete_expired(now=timezone.now() + 8 * DAY)
    after = scrape(Client())
    assert (
        value(after, "taskforge_tasks_completed_total", queue=queue.name, status="done")
        == completed
    )
    assert (
        value(before, "taskforge_tasks_completed_total", queue=queue.name, status="done")
        != completed
    )
    producer: APIClient = make_client("producer")
    response = producer.get(f"/queues/{queue.name}/tasks/{done.pk}")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.django_db(transaction=True)
@pytest.mark.postgres
@pytest.mark.usefixtures("redis_client")
def test_delete_expired__claims_and_acks_never_wait_on_it() -> None:
    """A retention batch holding its row locks delays no claim, ack or repeated ack."""
    _buffered(count=2)
    [old] = transitions.ack(
        [(str(t.pk), None, None) for t in protocol.claim(protocol.ClaimRequest("w", ["q"]))],
        worker_id="w",
    )
    locked = threading.Event()
    release = threading.Event()

    def hold_a_batch() -> None:
        # What a retention batch does first: lock old finished rows, SKIP LOCKED.
        try:
            with transaction.atomic():
                ids = list(
                    Task.objects.filter(status__in=[S.DONE], finished_at__isnull=False)
                    .select_for_update(skip_locked=True)
                    .values_list("id", flat=True)
                )
                assert ids == [old.pk]
                locked.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=hold_a_batch)
    holder.start()
    try:
        assert locked.wait(10)
        began = time.monotonic()
        [task] = protocol.claim(protocol.ClaimRequest("w", ["q"]))
        [acked] = protocol.ack("w", [protocol.Item(str(task.pk), task.attempts)])
        [again] = protocol.ack("w", [protocol.Item(str(old.pk), old.attempts)])
        assert time.monotonic() - began < 2.0
        assert acked.error is None and again.error is None
    finally:
        release.set()
        holder.join(10)
