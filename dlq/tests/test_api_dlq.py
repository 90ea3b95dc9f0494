from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from rest_framework import status
from rest_framework.test import APIClient

from dlq.models import DeadLetterTask
from queues.tests.factories import QueueFactory
from taskforge.lib.timeutil import isoformat
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory

S = TaskStatus
pytestmark = pytest.mark.django_db

ENTRY_FIELDS = {
    "id", "queue", "payload", "last_error", "attempts", "died_at", "replayed_at", "replay_count",
}  # fmt: skip


@pytest.fixture
def queue():
    return QueueFactory(name="q")


def test_list__dead_tasks_only_newest_first(admin_client: APIClient, queue) -> None:
    first = TaskFactory(queue=queue, status=S.DEAD, payload={"n": 1})
    second = TaskFactory(queue=queue, status=S.DEAD)
    TaskFactory(queue=queue, status=S.RETRY)
    TaskFactory(status=S.DEAD)  # another queue
    response = admin_client.get("/queues/q/dlq")
    assert response.status_code == status.HTTP_200_OK
    results = response.json()["results"]
    assert [r["id"] for r in results] == [str(second.pk), str(first.pk)]
    assert set(results[1]) == ENTRY_FIELDS
    assert results[1]["payload"] == {"n": 1}
    assert (results[1]["last_error"], results[1]["attempts"]) == ("boom", 1)
    assert (results[1]["replayed_at"], results[1]["replay_count"]) == (None, 0)


def test_list__time_filters_are_exclusive(admin_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.DEAD)
    died = isoformat(DeadLetterTask.objects.get(task=task).died_at).replace("+", "%2B")
    assert admin_client.get(f"/queues/q/dlq?died_after={died}").json()["results"] == []
    assert admin_client.get(f"/queues/q/dlq?died_before={died}").json()["results"] == []
    assert len(admin_client.get("/queues/q/dlq?died_after=2000-01-01T00:00:00Z").json()["results"])


def test_replay_one(admin_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.DEAD)
    response = admin_client.post(f"/queues/q/dlq/{task.pk}/replay")
    assert response.status_code == status.HTTP_200_OK
    body = response.json()
    assert (body["status"], body["attempts"], body["finished_at"]) == ("pending", 0, None)
    assert admin_client.get("/queues/q/dlq").json()["results"] == []
    entry = DeadLetterTask.objects.get(task=task)
    assert entry.replay_count == 1
    assert entry.replayed_at is not None


@pytest.mark.parametrize("state", [S.PENDING, S.DONE, S.RETRY])
def test_replay_one__not_dead_is_404(admin_client: APIClient, queue, state: str) -> None:
    task = TaskFactory(queue=queue, status=state)
    response = admin_client.post(f"/queues/q/dlq/{task.pk}/replay")
    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json()["error"]["code"] == "not_found"
    assert Task.objects.get(pk=task.pk).status == state


def test_replay_one__other_queue_is_404(admin_client: APIClient, queue) -> None:
    task = TaskFactory(status=S.DEAD)
    assert admin_client.post(f"/queues/q/dlq/{task.pk}/replay").status_code == 404


def test_replay_bulk__ids_skip_unknown_and_live(admin_client: APIClient, queue) -> None:
    dead = [TaskFactory(queue=queue, status=S.DEAD) for _ in range(3)]
    live = TaskFactory(queue=queue)
    ids = [str(dead[0].pk), str(dead[1].pk), str(live.pk), "01a22a4b-0000-7000-8000-000000000000"]
    response = admin_client.post("/queues/q/dlq/replay", {"ids": ids}, format="json")
    assert response.status_code == status.HTTP_200_OK
    assert response.json() == {"replayed": 2}
    assert Task.objects.get(pk=dead[2].pk).status == S.DEAD


def test_replay_bulk__all(admin_client: APIClient, queue, monkeypatch) -> None:
    from dlq import services

    monkeypatch.setattr(services, "BATCH", 2)
    for _ in range(5):
        TaskFactory(queue=queue, status=S.DEAD)
    other = TaskFactory(status=S.DEAD)
    response = admin_client.post("/queues/q/dlq/replay", {"all": True}, format="json")
    assert response.json() == {"replayed": 5}
    assert Task.objects.get(pk=other.pk).status == S.DEAD


@pytest.mark.parametrize("body", [{}, {"all": False}, {"ids": ["x"]}, {"ids": [], "all": True}])
def test_replay_bulk__needs_one_form(admin_client: APIClient, queue, body) -> None:
    response = admin_client.post("/queues/q/dlq/replay", body, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "invalid"


def test_discard__gone_for_good(admin_client: APIClient, producer_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.DEAD)
    response = admin_client.delete(f"/queues/q/dlq/{task.pk}")
    assert response.status_code == status.HTTP_204_NO_CONTENT
    assert producer_client.get(f"/queues/q/tasks/{task.pk}").status_code == 404
    assert not TaskEvent.objects.filter(task_id=task.pk).exists()
    assert not DeadLetterTask.objects.filter(task_id=task.pk).exists()
    assert admin_client.delete(f"/queues/q/dlq/{task.pk}").status_code == 404


def test_discard__live_task_is_404(admin_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.EXECUTING)
    assert admin_client.delete(f"/queues/q/dlq/{task.pk}").status_code == 404
    assert Task.objects.filter(pk=task.pk).exists()


def test_dead_again_after_replay_updates_the_entry(admin_client: APIClient, queue) -> None:
    from tasks.tests.factories import walk

    task = TaskFactory(queue=queue, status=S.DEAD)
    admin_client.post(f"/queues/q/dlq/{task.pk}/replay")
    task.refresh_from_db()
    walk(task, S.DEAD)
    [entry] = admin_client.get("/queues/q/dlq").json()["results"]
    assert (entry["id"], entry["replay_count"]) == (str(task.pk), 1)
    assert entry["replayed_at"] is not None


def test_list__reads_the_entries_alone(admin_client: APIClient, queue) -> None:
    """Whether an entry's task is dead now is on the entry (deaths > replays): a page
    walks dlq_queue_died_idx and stops, with no join to every dead task of every queue."""
    for _ in range(3):
        TaskFactory(queue=queue, status=S.DEAD)
    with CaptureQueriesContext(connection) as queries:
        assert len(admin_client.get("/queues/q/dlq").json()["results"]) == 3
    [listing] = [q["sql"] for q in queries.captured_queries if "dlq_deadlettertask" in q["sql"]]
    assert "tasks_task" not in listing


def test_migration_0003__counts_the_deaths_of_replayed_entries(queue) -> None:
    """The entries of replayed tasks get their death count from their task's status now."""
    from importlib import import_module

    migration = import_module("dlq.migrations.0003_deaths")
    dead_again = TaskFactory(queue=queue, status=S.DEAD)
    running = TaskFactory(queue=queue, status=S.DEAD)
    DeadLetterTask.objects.filter(task__in=[dead_again, running]).update(replay_count=1, deaths=1)
    Task.objects.filter(pk=running.pk).update(status=S.PENDING)  # as after its replay
    with connection.cursor() as cursor:
        cursor.execute(migration.SET_REPLAYED)
    deaths = dict(DeadLetterTask.objects.values_list("task_id", "deaths"))
    assert (deaths[dead_again.pk], deaths[running.pk]) == (2, 1)
