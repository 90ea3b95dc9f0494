"""The dead-letter browser and its actions."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dashboard import queries
from dashboard.tests.pages import ANY_ID, D, flashed
from dlq import services as dlq_services
from dlq.models import DeadLetterTask
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI, Actor
from tasks.models import Task, TaskStatus
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

S = TaskStatus


# Dead-letter queue -------------------------------------------------------------------


def test_dlq__lists_dead_tasks_only_with_their_replay_count(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    dead = TaskFactory(queue=queue, status="dead")
    twice = TaskFactory(queue=queue, status="dead")
    dlq_services.replay_one(queue, str(twice.pk), actor=CLI)
    twice.refresh_from_db()
    from tasks.tests.factories import walk

    walk(twice, "dead")  # died again
    replayed = TaskFactory(queue=queue, status="dead")
    dlq_services.replay_one(queue, str(replayed.pk), actor=CLI)

    response = staff_client.get(f"{D}/dlq/")

    entries = [row["entry"] for row in response.context["rows"]]
    assert {e.task_id for e in entries} == {dead.pk, twice.pk}
    assert {e.task_id: e.replay_count for e in entries} == {dead.pk: 0, twice.pk: 1}


def test_dlq__filters_by_queue_and_time(staff_client: Client) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    old = TaskFactory(queue=a, status="dead")
    new = TaskFactory(queue=a, status="dead")
    other = TaskFactory(queue=b, status="dead")
    DeadLetterTask.objects.filter(task_id=old.pk).update(
        died_at=timezone.now() - timedelta(hours=2)
    )
    hour_ago = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")

    def listed(query: str) -> set[uuid.UUID]:
        response = staff_client.get(f"{D}/dlq/?{query}")
        return {row["entry"].task_id for row in response.context["rows"]}

    assert listed("") == {old.pk, new.pk, other.pk}
    assert listed("queue=a") == {old.pk, new.pk}
    assert listed(f"queue=a&died_after={hour_ago}") == {new.pk}
    assert listed(f"died_before={hour_ago}") == {old.pk}


def test_dlq__keyset_pages(staff_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    dead = [TaskFactory(queue=a if n % 2 else b, status="dead") for n in range(5)]

    seen: list[uuid.UUID] = []
    url: str | None = f"{D}/dlq/"
    while url:
        response = staff_client.get(url)
        seen += [row["entry"].task_id for row in response.context["rows"]]
        url = response.context["next_url"]
    assert seen == [t.pk for t in reversed(dead)]


def test_dlq_replay__selected_ids_across_queues(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    first, second = TaskFactory(queue=a, status="dead"), TaskFactory(queue=b, status="dead")
    kept = TaskFactory(queue=a, status="dead")
    calls: list[tuple[str, list[str]]] = []
    real = dlq_services.replay_many

    def spy(queue: Queue, ids: Any, *, actor: Actor) -> int:
        calls.append((queue.name, sorted(ids)))
        return real(queue, ids, actor=actor)

    monkeypatch.setattr(dlq_services, "replay_many", spy)

    response = staff_client.post(
        f"{D}/dlq/replay",
        {"ids": [str(first.pk), str(second.pk), "not-an-id", ANY_ID], "next": f"{D}/dlq/"},
        follow=True,
    )

    assert flashed(response) == ["Replayed 2 tasks."]
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert statuses[first.pk] == statuses[second.pk] == S.PENDING
    assert statuses[kept.pk] == S.DEAD
    assert sorted(calls) == [("a", [str(first.pk)]), ("b", [str(second.pk)])]
    assert DeadLetterTask.objects.get(task_id=first.pk).replay_count == 1


def test_dlq_replay__nothing_selected_is_a_warning(staff_client: Client) -> None:
    response = staff_client.post(f"{D}/dlq/replay", follow=True)

    assert "Select the tasks to replay first." in flashed(response)


def test_dlq_replay__all_of_one_queue(staff_client: Client) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    in_a = [TaskFactory(queue=a, status="dead") for _ in range(3)]
    in_b = TaskFactory(queue=b, status="dead")

    response = staff_client.post(f"{D}/dlq/replay", {"all": "1", "queue": "a"}, follow=True)

    assert flashed(response) == ["Replayed 3 tasks."]
    assert set(Task.objects.filter(status=S.PENDING).values_list("pk", flat=True)) == {
        t.pk for t in in_a
    }
    in_b.refresh_from_db()
    assert in_b.status == S.DEAD


def test_dlq_replay__all_matching_a_time_range(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    old = TaskFactory(queue=queue, status="dead")
    new = TaskFactory(queue=queue, status="dead")
    DeadLetterTask.objects.filter(task_id=old.pk).update(
        died_at=timezone.now() - timedelta(hours=2)
    )
    hour_ago = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")

    staff_client.post(f"{D}/dlq/replay", {"all": "1", "died_after": hour_ago})

    statuses = dict(Task.objects.values_list("pk", "status"))
    assert statuses == {old.pk: S.DEAD, new.pk: S.PENDING}


def test_dlq_replay_one__and_a_task_no_longer_dead(staff_client: Client) -> None:
    task = TaskFactory(status="dead")

    first = staff_client.post(f"{D}/dlq/{task.pk}/replay", follow=True)
    again = staff_client.post(f"{D}/dlq/{task.pk}/replay", follow=True)

    task.refresh_from_db()
    assert task.status == S.PENDING and task.attempts == 0
    assert "Task replayed" in flashed(first)[0]
    assert "not dead any more" in flashed(again)[0]


def test_dlq_discard__selected_dead_tasks_are_gone_for_good(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    dead = [TaskFactory(queue=queue, status="dead") for _ in range(2)]
    alive = TaskFactory(queue=queue)

    response = staff_client.post(
        f"{D}/dlq/discard", {"ids": [str(t.pk) for t in dead] + [str(alive.pk)]}, follow=True
    )

    assert flashed(response) == ["Discarded 2 tasks for good."]
    assert list(Task.objects.values_list("pk", flat=True)) == [alive.pk]
    assert not DeadLetterTask.objects.exists()


def test_dlq_discard_one(staff_client: Client) -> None:
    task = TaskFactory(status="dead")

    response = staff_client.post(f"{D}/dlq/{task.pk}/discard")

    assert response.status_code == 302
    assert not Task.objects.filter(pk=task.pk).exists()
    assert staff_client.get(f"{D}/tasks/{task.pk}").status_code == 404


def test_dlq_discard_one__refuses_a_task_that_is_not_dead(staff_client: Client) -> None:
    task = TaskFactory(status="dead")
    dlq_services.replay_one(task.queue, str(task.pk), actor=CLI)

    response = staff_client.post(f"{D}/dlq/{task.pk}/discard", follow=True)

    assert Task.objects.filter(pk=task.pk).exists()
    assert "nothing was discarded" in flashed(response)[0]
