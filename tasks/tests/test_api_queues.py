from __future__ import annotations

from typing import Any

import pytest
from rest_framework import status
from rest_framework.test import APIClient

from queues.models import Queue
from queues.tests.factories import QueueFactory
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db
S = TaskStatus


def test_create__defaults(admin_client: APIClient) -> None:
    response = admin_client.post("/queues", {"name": "emails"}, format="json")
    assert response.status_code == status.HTTP_201_CREATED
    body = response.json()
    assert set(body) == {
        "id",
        "name",
        "max_retries",
        "rate_limit",
        "max_concurrency",
        "push",
        "paused",
        "retry_policy",
        "key_weights",
        "key_max_concurrency",
        "key_rate_limit",
        "created_at",
    }
    assert (
        body["name"],
        body["max_retries"],
        body["rate_limit"],
        body["max_concurrency"],
        body["push"],
        body["paused"],
        body["retry_policy"],
        body["key_weights"],
        body["key_max_concurrency"],
        body["key_rate_limit"],
    ) == ("emails", 3, None, None, None, False, None, {}, None, None)
    assert body["created_at"].endswith("Z")


def test_create__all_fields(admin_client: APIClient) -> None:
    response = admin_client.post(
        "/queues",
        {
            "name": "a.b_c-1",
            "max_retries": 0,
            "rate_limit": 50,
            "max_concurrency": 100_000,
            "paused": True,
        },
        format="json",
    )
    assert response.status_code == status.HTTP_201_CREATED
    assert response.json()["max_concurrency"] == 100_000
    queue = Queue.objects.get(name="a.b_c-1")
    assert (queue.max_retries, queue.rate_limit, queue.max_concurrency, queue.paused) == (
        0,
        50,
        100_000,
        True,
    )


def test_create__existing_name_is_409(admin_client: APIClient) -> None:
    QueueFactory(name="emails")
    response = admin_client.post("/queues", {"name": "emails"}, format="json")
    assert response.status_code == status.HTTP_409_CONFLICT
    assert response.json()["error"]["code"] == "queue_exists"


@pytest.mark.parametrize(
    "body",
    [
        {"name": ""},
        {"name": "-leading-dash"},
        {"name": "has space"},
        # Regression for issue 14: names were trimmed before validation.
        {"name": " a"},
        {"name": "abc\n"},
        {"name": "x" * 101},
        {"name": "ok", "max_retries": 101},
        {"name": "ok", "max_retries": -1},
        {"name": "ok", "rate_limit": 0},
        {"name": "ok", "max_concurrency": 0},
        {"name": "ok", "max_concurrency": 100_001},
        {"name": "ok", "max_concurrency": "5"},
        {"name": "ok", "max_concurrency": 5.5},
        {"name": "ok", "max_concurrency": True},
    ],
)
def test_create__invalid_fields_are_400_with_fields(
    admin_client: APIClient, body: dict[str, Any]
) -> None:
    response = admin_client.post("/queues", body, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert set(error["fields"]) <= set(body)
    assert not Queue.objects.exists()


def test_create__name_of_100_characters_is_fine(admin_client: APIClient) -> None:
    response = admin_client.post("/queues", {"name": "q" * 100}, format="json")
    assert response.status_code == status.HTTP_201_CREATED


def test_list__paginates_by_name(admin_client: APIClient) -> None:
    for name in ["c", "a", "b"]:
        QueueFactory(name=name)
    first = admin_client.get("/queues?limit=2").json()
    assert [q["name"] for q in first["results"]] == ["a", "b"]
    second = admin_client.get(first["next"]).json()
    assert [q["name"] for q in second["results"]] == ["c"]
    assert second["next"] is None


def test_get__unknown_is_404(producer_client: APIClient) -> None:
    response = producer_client.get("/queues/nope")
    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json()["error"]["code"] == "not_found"


def test_patch__changes_only_given_fields(admin_client: APIClient) -> None:
    QueueFactory(name="q", max_retries=5, rate_limit=10)
    response = admin_client.patch("/queues/q", {"rate_limit": None}, format="json")
    assert response.status_code == status.HTTP_200_OK
    assert (response.json()["max_retries"], response.json()["rate_limit"]) == (5, None)


def test_patch__sets_and_removes_the_cap(admin_client: APIClient) -> None:
    QueueFactory(name="q")
    response = admin_client.patch("/queues/q", {"max_concurrency": 1}, format="json")
    assert response.status_code == status.HTTP_200_OK
    assert response.json()["max_concurrency"] == 1
    assert admin_client.get("/queues/q").json()["max_concurrency"] == 1
    response = admin_client.patch("/queues/q", {"max_concurrency": None}, format="json")
    assert response.json()["max_concurrency"] is None
    assert Queue.objects.get(name="q").max_concurrency is None
    response = admin_client.patch("/queues/q", {"max_concurrency": 0}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert set(response.json()["error"]["fields"]) == {"max_concurrency"}


def test_patch__name_is_not_patchable(admin_client: APIClient) -> None:
    QueueFactory(name="q")
    response = admin_client.patch("/queues/q", {"name": "other"}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["fields"] == {"name": ["Unknown field."]}


def test_pause_and_resume(admin_client: APIClient) -> None:
    QueueFactory(name="q")
    assert admin_client.post("/queues/q/pause").json()["paused"] is True
    assert Queue.objects.get(name="q").paused is True
    assert admin_client.post("/queues/q/resume").json()["paused"] is False


def test_pause__paused_queue_still_accepts_tasks(admin_client: APIClient) -> None:
    QueueFactory(name="q", paused=True)
    response = admin_client.post("/queues/q/tasks", {"payload": 1}, format="json")
    assert response.status_code == status.HTTP_201_CREATED


@pytest.mark.parametrize("live", [S.PENDING, S.CLAIMED, S.EXECUTING, S.RETRY, S.DEAD])
def test_delete__refused_while_a_task_is_live_or_dead(admin_client: APIClient, live: str) -> None:
    queue = QueueFactory(name="q")
    TaskFactory(queue=queue, status=live)
    response = admin_client.delete("/queues/q")
    assert response.status_code == status.HTTP_409_CONFLICT
    assert response.json()["error"]["code"] == "queue_not_empty"
    assert Queue.objects.filter(name="q").exists()


def test_delete__takes_finished_tasks_with_it(admin_client: APIClient) -> None:
    queue = QueueFactory(name="q")
    TaskFactory(queue=queue, status=S.DONE)
    TaskFactory(queue=queue, status=S.CANCELLED)
    response = admin_client.delete("/queues/q")
    assert response.status_code == status.HTTP_204_NO_CONTENT
    assert response.content == b""
    assert not Queue.objects.filter(name="q").exists()
    assert not Task.objects.exists()
    assert not TaskEvent.objects.exists()


def test_purge__cancels_pending_claimed_and_retry_only(admin_client: APIClient) -> None:
    queue = QueueFactory(name="q")
    for state in [S.PENDING, S.PENDING, S.CLAIMED, S.RETRY, S.EXECUTING, S.DONE, S.DEAD]:
        TaskFactory(queue=queue, status=state)
    other = TaskFactory(status=S.PENDING)
    response = admin_client.post("/queues/q/purge")
    assert response.status_code == status.HTTP_200_OK
    assert response.json() == {"cancelled": 4}
    statuses = sorted(Task.objects.filter(queue=queue).values_list("status", flat=True))
    assert statuses == sorted([S.CANCELLED] * 4 + [S.EXECUTING, S.DONE, S.DEAD])
    assert Task.objects.get(pk=other.pk).status == S.PENDING


def test_purge__works_across_batches(admin_client: APIClient, monkeypatch) -> None:
    from tasks import services

    monkeypatch.setattr(services, "PURGE_BATCH", 2)
    queue = QueueFactory(name="q")
    for _ in range(5):
        TaskFactory(queue=queue)
    assert admin_client.post("/queues/q/purge").json() == {"cancelled": 5}


def test_delete__drops_the_queues_redis_keys(
    admin_client: APIClient, redis_client, django_capture_on_commit_callbacks
) -> None:
    queue = QueueFactory(name="q", rate_limit=5)
    redis_client.hset(f"tf:{{{queue.id}}}:bucket", mapping={"tokens": 5, "ts": 1})
    with django_capture_on_commit_callbacks(execute=True):
        assert admin_client.delete("/queues/q").status_code == status.HTTP_204_NO_CONTENT
    assert not redis_client.exists(f"tf:{{{queue.id}}}:bucket")
