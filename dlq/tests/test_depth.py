"""The per-queue DLQ depth (dlq.depth) stays the count of dead tasks, move by move."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection, connections, transaction
from django.db.migrations.executor import MigrationExecutor
from django.db.models import Count
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from dlq import depth as dlqdepth
from dlq import services as dlq
from dlq.models import DeadCount, DeadLetterTask
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.models import ApiKey
from taskforge.audit.log import CLI
from tasks import retention, services, transitions
from tasks.exceptions import InvalidTransition
from tasks.models import Task, TaskStatus
from tasks.stats import queue_stats
from tasks.tests.factories import TaskFactory, age_lease
from tests.test_metrics import scrape, unique, value
from workers.watchdog import WatchdogLoop

pytestmark = pytest.mark.django_db

S = TaskStatus
DAY = timedelta(days=1)


def counted() -> dict[Any, int]:
    """Every queue's depth as the counter has it."""
    return dlqdepth.depths(Queue.objects.values_list("pk", flat=True))


def actual() -> dict[Any, int]:
    """Every queue's depth as the dead tasks are."""
    dead = dict(
        Task.objects.filter(status=S.DEAD)
        .values("queue_id")
        .annotate(n=Count("pk"))
        .order_by()
        .values_list("queue_id", "n")
    )
    return {pk: dead.get(pk, 0) for pk in Queue.objects.values_list("pk", flat=True)}


def exact(expected: dict[Queue, int]) -> None:
    assert counted() == actual()
    # The DLQ lists exactly the dead tasks (DeadLetterTask.dead_now: deaths > replays).
    assert set(DeadLetterTask.objects.dead_now().values_list("task_id", flat=True)) == set(
        Task.objects.filter(status=S.DEAD).values_list("pk", flat=True)
    )
    assert {queue.pk: counted()[queue.pk] for queue in expected} == {
        queue.pk: n for queue, n in expected.items()
    }
    for queue, n in expected.items():
        assert queue_stats(queue)["dlq_depth"] == n


def test_depth__exact_across_die_replay_discard_purge_and_retention(settings: Any) -> None:
    a, b = QueueFactory(max_retries=0), QueueFactory(max_retries=0)
    exact({a: 0, b: 0})

    # Die: by a nack, and by an expired lease (the watchdog, several in one transaction).
    dead_a = [TaskFactory(queue=a, status=S.DEAD) for _ in range(4)]
    dead_b = [TaskFactory(queue=b, status=S.DEAD) for _ in range(2)]
    leased = [TaskFactory(queue=b, status=S.EXECUTING) for _ in range(3)]
    for task in leased:
        age_lease(task.pk, 3600)
    WatchdogLoop().expire_leases()
    exact({a: 4, b: 5})

    # A retry is not dead; a failure that retries leaves the depth alone.
    retried = QueueFactory(max_retries=3)
    TaskFactory(queue=retried, status=S.RETRY)
    exact({a: 4, b: 5, retried: 0})

    # Replay: one, several (some not dead: skipped), all.
    dlq.replay_one(a, str(dead_a[0].pk), actor=CLI)
    exact({a: 3, b: 5})
    assert dlq.replay_many(a, [str(dead_a[1].pk), str(dead_a[0].pk)], actor=CLI) == 1
    exact({a: 2, b: 5})
    assert dlq.replay_all(b, actor=CLI) == 5
    exact({a: 2, b: 0})

    # The replayed tasks die again (a second DLQ stay counts once more).
    transitions.buffer_due(b, limit=10)
    handed = transitions.hand_out([str(t.pk) for t in Task.objects.filter(queue=b)], worker_id="w")
    with transaction.atomic():
        for one in handed:
            transitions.fail(one, error="again", retry=False)
    exact({a: 2, b: 5})
    assert Task.objects.get(pk=dead_b[0].pk).status == S.DEAD

    # Discard: a dead task; one that is not dead changes nothing.
    dlq.discard(a, str(dead_a[2].pk), actor=CLI)
    exact({a: 1, b: 5})
    with pytest.raises(dlq.NotDead):
        dlq.discard(a, str(dead_a[0].pk), actor=CLI)  # replayed: pending now
    assert dlq.discard_selected([str(dead_b[1].pk), str(dead_a[1].pk)], actor=CLI) == 1
    exact({a: 1, b: 4})

    # Purge cancels what is on its way, never the dead ones.
    TaskFactory(queue=a)
    assert services.purge_queue(a, actor=CLI) == 3  # two replayed, one new
    exact({a: 1, b: 4})

    # Retention: dead tasks past the DLQ retention go with the done ones.
    TaskFactory(queue=a, status=S.DONE)
    settings.TASKFORGE_DLQ_RETENTION_SECONDS = 30 * 86400
    assert retention.delete_expired(now=timezone.now() + 29 * DAY) == 4  # done, cancelled
    exact({a: 1, b: 4})
    assert retention.delete_expired(now=timezone.now() + 31 * DAY) == 5
    exact({a: 0, b: 0})

    # Nothing to correct: every move kept the depths.
    assert dlqdepth.reconcile() == {}


def test_depth__rolled_back_moves_leave_it_alone() -> None:
    queue = QueueFactory(max_retries=0)
    task = TaskFactory(queue=queue, status=S.EXECUTING)
    with pytest.raises(RuntimeError), transaction.atomic():
        transitions.fail(task, error="e", retry=False)
        assert counted()[queue.pk] == 1
        raise RuntimeError("roll back")
    exact({queue: 0})


def test_delete__refuses_a_task_on_its_way() -> None:
    task = TaskFactory(status=S.PENDING)
    with pytest.raises(InvalidTransition), transaction.atomic():
        transitions.delete([(task.pk, task.queue_id, task.status)])
    assert Task.objects.filter(pk=task.pk).exists()


def test_compact__folds_each_queue_into_one_row_keeping_the_sums() -> None:
    a, b, empty = QueueFactory(max_retries=0), QueueFactory(max_retries=0), QueueFactory()
    for _ in range(3):
        TaskFactory(queue=a, status=S.DEAD)
    gone = TaskFactory(queue=b, status=S.DEAD)
    dlq.discard(b, str(gone.pk), actor=CLI)
    TaskFactory(queue=b, status=S.DEAD)
    before = counted()
    assert DeadCount.objects.count() == 6

    assert dlqdepth.compact() == 6
    assert counted() == before == actual()
    rows = DeadCount.objects.values_list("queue_id", "dead")
    assert sorted(rows) == sorted([(a.pk, 3), (b.pk, 1)])
    assert dlqdepth.compact() == 0  # one row a queue: nothing to fold
    assert counted()[empty.pk] == 0


def test_reconcile__sets_a_drifted_depth_right_and_logs_it(caplog: Any) -> None:
    queue = QueueFactory(max_retries=0)
    TaskFactory(queue=queue, status=S.DEAD)
    TaskFactory(queue=queue, status=S.DEAD)
    # What a process without the counter would leave: a move not counted.
    DeadCount.objects.filter(queue=queue).first().delete()  # type: ignore[union-attr]
    assert counted()[queue.pk] == 1

    assert dlqdepth.reconcile() == {queue.pk: 1}
    exact({queue: 2})
    assert "dlq_depth.corrected" in caplog.text
    assert dlqdepth.reconcile() == {}


def test_delete_queue__takes_its_rows() -> None:
    queue = QueueFactory(max_retries=0)
    dead = TaskFactory(queue=queue, status=S.DEAD)
    dlq.replay_one(queue, str(dead.pk), actor=CLI)
    services.cancel(dead.pk, actor=CLI, queue=queue)
    assert DeadCount.objects.filter(queue=queue).count() == 2  # +1, -1
    services.delete_queue(queue, actor=CLI)
    assert not DeadCount.objects.filter(queue_id=queue.pk).exists()


def test_depth__stats_dashboard_and_metrics_read_it() -> None:
    queue = QueueFactory(name=unique("dlq-depth"), max_retries=0)
    for _ in range(3):
        TaskFactory(queue=queue, status=S.DEAD)
    DeadCount.objects.create(queue=queue, dead=4)  # a depth only the counter knows
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {ApiKey.issue(name='r', role='admin')[1]}")

    assert client.get(f"/queues/{queue.name}/stats").json()["dlq_depth"] == 7
    assert value(scrape(Client()), "taskforge_dlq_depth", queue=queue.name) == 7
    browser = Client()
    browser.force_login(User.objects.create_superuser("root"))
    page = browser.get(reverse("dashboard:dlq"))
    assert {"name": queue.name, "dlq_depth": 7, "text": "7"} in page.context["depths"]


@pytest.mark.django_db(transaction=True)
def test_depth__deaths_in_one_queue_never_wait_on_each_other() -> None:
    """A death whose transaction stays open delays neither another death of its queue, a
    replay, nor the watchdog's fold; each counts once it commits."""
    queue = QueueFactory(max_retries=0)
    first, second = (TaskFactory(queue=queue, status=S.EXECUTING) for _ in range(2))
    older = TaskFactory(queue=queue, status=S.DEAD)
    TaskFactory(queue=queue, status=S.DEAD)
    dlqdepth.compact()
    held, release = threading.Event(), threading.Event()

    def die_and_hold() -> None:
        try:
            with transaction.atomic():
                task = Task.objects.select_for_update().get(pk=first.pk)
                transitions.fail(task, error="e", retry=False)
                held.set()
                release.wait(10)
        finally:
            connections.close_all()

    holder = threading.Thread(target=die_and_hold)
    holder.start()
    try:
        assert held.wait(10)
        began = time.monotonic()
        with transaction.atomic():
            task = Task.objects.select_for_update().get(pk=second.pk)
            transitions.fail(task, error="e", retry=False)
        dlq.replay_one(queue, str(older.pk), actor=CLI)
        dlqdepth.compact()
        assert time.monotonic() - began < 2
        assert counted()[queue.pk] == 2  # 2 dead + 1 - 1: the held death is not in yet
    finally:
        release.set()
        holder.join(10)
    exact({queue: 3})
    dlqdepth.compact()
    exact({queue: 3})


def test_watchdog__folds_the_rows_and_checks_the_depths_each_round() -> None:
    """The watchdog keeps the depths through tasks.signals.upkeep, knowing nothing of dlq."""
    queue = QueueFactory(max_retries=0)
    for _ in range(3):
        TaskFactory(queue=queue, status=S.DEAD)
    DeadCount.objects.create(queue=queue, dead=-1)  # drifted
    dlqdepth._checked_at[0] = None  # this process has not checked yet
    WatchdogLoop().tick()
    assert sorted(DeadCount.objects.filter(queue=queue).values_list("dead", flat=True)) == [1, 2]
    WatchdogLoop().tick()  # checked a round ago: folded only
    assert list(DeadCount.objects.filter(queue=queue).values_list("dead", flat=True)) == [3]
    exact({queue: 3})


@pytest.mark.django_db(transaction=True)
def test_migration__the_depth_rows_written_under_tasks_are_the_dlqs() -> None:
    """DeadCount moved from tasks to dlq; its table and rows stay (a rolling upgrade's
    processes of the version before write it still)."""
    queue = QueueFactory()
    executor = MigrationExecutor(connection)
    executor.migrate([("dlq", "0003_deaths"), ("tasks", "0013_task_fillfactor")])
    try:
        before = executor.loader.project_state(("tasks", "0013_task_fillfactor")).apps
        before.get_model("tasks", "DeadCount").objects.create(queue_id=queue.pk, dead=5)
    finally:
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    assert list(DeadCount.objects.values_list("queue_id", "dead")) == [(queue.pk, 5)]
    assert counted()[queue.pk] == 5
