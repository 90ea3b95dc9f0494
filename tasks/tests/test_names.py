"""Named tasks' IDs (API-cloudtasks.md "Names and de-duplication")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from dlq import services as dlq_services
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI
from tasks import names, retention, transitions
from tasks.exceptions import InvalidTransition, NameTaken, NameUsedRecently
from tasks.models import Task, TaskName, TaskStatus
from tasks.tests.factories import TaskFactory

S = TaskStatus


def _take(queue: Queue, name: str, task: Task) -> None:
    with transaction.atomic():
        names.take(queue, name, task.pk, now=timezone.now())


@pytest.mark.django_db
def test_take__a_live_holder_keeps_the_name() -> None:
    queue = QueueFactory()
    first = TaskFactory(queue=queue, name="a")
    _take(queue, "a", first)
    with pytest.raises(NameTaken) as caught:
        _take(queue, "a", TaskFactory(queue=queue))
    assert not isinstance(caught.value, NameUsedRecently)
    _take(QueueFactory(), "a", TaskFactory())  # another queue: its own names


@pytest.mark.django_db
def test_take__a_finished_holder_keeps_it_for_the_window(settings) -> None:
    queue = QueueFactory()
    first = TaskFactory(queue=queue, name="a")
    _take(queue, "a", first)
    with transaction.atomic():
        transitions.cancel([Task.objects.select_for_update().get(pk=first.pk)])
    with pytest.raises(NameUsedRecently):
        _take(queue, "a", TaskFactory(queue=queue))
    settings.TASKFORGE_CLOUDTASKS_DEDUP_SECONDS = 0
    second = TaskFactory(queue=queue)
    _take(queue, "a", second)
    assert TaskName.objects.get(queue=queue, name="a").task_id == second.pk


@pytest.mark.django_db
def test_take__the_memory_outlives_the_task_row(settings) -> None:
    """Retention deletes the finished task; its name stays taken for the window."""
    settings.TASKFORGE_RETENTION_SECONDS = 1
    settings.TASKFORGE_CLOUDTASKS_DEDUP_SECONDS = 3600
    queue = QueueFactory()
    first = TaskFactory(queue=queue, name="a")
    _take(queue, "a", first)
    with transaction.atomic():
        transitions.cancel([Task.objects.select_for_update().get(pk=first.pk)])
    Task.objects.filter(pk=first.pk).update(finished_at=timezone.now() - timedelta(seconds=60))
    assert retention.delete_expired() == 1
    assert not Task.objects.filter(pk=first.pk).exists()
    with pytest.raises(NameUsedRecently):
        _take(queue, "a", TaskFactory(queue=queue))


@pytest.mark.django_db
def test_take__names_go_with_their_queue() -> None:
    queue = QueueFactory()
    _take(queue, "a", TaskFactory(queue=queue))
    queue.delete()
    assert not TaskName.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_take__concurrent_creates_take_a_name_once() -> None:
    """Two connections taking one name at once: the unique row decides, one wins."""
    queue = QueueFactory()
    tasks = [TaskFactory(queue=queue), TaskFactory(queue=queue)]
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def create(task: Task) -> None:
        try:
            with transaction.atomic():
                barrier.wait(timeout=10)
                names.take(queue, "same", task.pk, now=timezone.now())
                # Hold the row a moment: the other insert waits on it, then conflicts.
                with connection.cursor() as cursor:
                    cursor.execute("SELECT pg_sleep(0.2)")
            outcomes.append("created")
        except NameTaken:
            outcomes.append("taken")
        finally:
            connection.close()

    threads = [threading.Thread(target=create, args=(task,)) for task in tasks]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(outcomes) == ["created", "taken"]
    assert TaskName.objects.filter(queue=queue, name="same").count() == 1


@pytest.mark.django_db
def test_replay__waits_while_another_live_task_holds_the_name(settings) -> None:
    """A dead named task replayed: 409 invalid_state while a new task holds its name,
    replayed (and holding it again) once that one finished."""
    settings.TASKFORGE_CLOUDTASKS_DEDUP_SECONDS = 0
    queue = QueueFactory()
    dead = TaskFactory(queue=queue, name="n", status=S.DEAD)
    _take(queue, "n", dead)
    other = TaskFactory(queue=queue, name="n")
    _take(queue, "n", other)  # the dead one released it (no window)
    with pytest.raises(InvalidTransition):
        dlq_services.replay_one(queue, str(dead.pk), actor=CLI)
    assert dlq_services.replay_many(queue, [str(dead.pk)], actor=CLI) == 0
    with transaction.atomic():
        transitions.cancel([Task.objects.select_for_update().get(pk=other.pk)])
    assert dlq_services.replay_one(queue, str(dead.pk), actor=CLI).status == S.PENDING
    assert TaskName.objects.get(queue=queue, name="n").task_id == dead.pk
