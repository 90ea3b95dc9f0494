from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework import status
from rest_framework.test import APIClient

from queues import lookup
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.lib import keyset
from taskforge.lib.timeutil import isoformat, parse_time
from tasks import events, transitions
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db
S = TaskStatus

TASK_FIELDS = {
    "id", "queue", "payload", "status", "priority", "scheduled_at", "claimed_at", "claimed_by",
    "heartbeat_at", "attempts", "max_retries", "last_error", "result", "idempotency_key",
    "created_at", "updated_at", "finished_at", "name", "http_request", "fairness_key",
}  # fmt: skip


@pytest.fixture
def queue():
    return QueueFactory(name="q", max_retries=4)


def enqueue(client: APIClient, body: dict[str, Any], queue: str = "q"):
    return client.post(f"/queues/{queue}/tasks", body, format="json")


@pytest.mark.usefixtures("redis_client")
def test_enqueue__defaults(producer_client: APIClient, queue) -> None:
    before = timezone.now()
    response = enqueue(producer_client, {"payload": {"to": "a@b.c"}})
    assert response.status_code == status.HTTP_201_CREATED
    body = response.json()
    assert set(body) == TASK_FIELDS
    assert body["queue"] == "q"
    assert body["status"] == "pending"
    assert (body["priority"], body["attempts"], body["max_retries"]) == (5, 0, 4)
    assert body["payload"] == {"to": "a@b.c"}
    assert parse_time(body["scheduled_at"]) >= before
    assert body["scheduled_at"] == body["created_at"]
    # Due, in a running queue: it went straight into the dispatch buffer.
    assert Task.objects.get(pk=body["id"]).status == S.CLAIMED
    chain = events.chain(Task.objects.get(pk=body["id"]), 10)
    assert [(e.from_status, e.to_status) for e in chain] == [
        (None, S.PENDING),
        (S.PENDING, S.CLAIMED),
    ]


@pytest.mark.parametrize("payload", [0, "text", [1, 2], {"nested": {"a": [None, True]}}, 1.5])
def test_enqueue__any_json_but_null(producer_client: APIClient, queue, payload) -> None:
    response = enqueue(producer_client, {"payload": payload})
    assert response.status_code == status.HTTP_201_CREATED
    assert response.json()["payload"] == payload


def test_enqueue__null_or_missing_payload_is_400(producer_client: APIClient, queue) -> None:
    for body in [{"payload": None}, {}]:
        response = enqueue(producer_client, body)
        assert response.status_code == status.HTTP_400_BAD_REQUEST
        assert list(response.json()["error"]["fields"]) == ["payload"]
    assert not Task.objects.exists()


def test_enqueue__future_scheduled_at_is_kept(producer_client: APIClient, queue) -> None:
    when = datetime(2099, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    body = enqueue(
        producer_client, {"payload": 1, "scheduled_at": "2099-01-02T05:04:05.123456+02:00"}
    )
    assert body.json()["scheduled_at"] == isoformat(when) == "2099-01-02T03:04:05.123456Z"


def test_enqueue__past_scheduled_at_becomes_now(producer_client: APIClient, queue) -> None:
    body = enqueue(producer_client, {"payload": 1, "scheduled_at": "2001-01-01T00:00:00Z"}).json()
    assert body["scheduled_at"] == body["created_at"]


def test_enqueue__delay_seconds(producer_client: APIClient, queue) -> None:
    body = enqueue(producer_client, {"payload": 1, "delay_seconds": 90.5}).json()
    delay = parse_time(body["scheduled_at"]) - parse_time(body["created_at"])
    assert delay == timedelta(seconds=90.5)


def test_enqueue__scheduled_at_and_delay_together_is_400(producer_client: APIClient, queue) -> None:
    response = enqueue(
        producer_client, {"payload": 1, "delay_seconds": 1, "scheduled_at": "2099-01-01T00:00:00Z"}
    )
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "invalid"


def test_enqueue__priority_and_max_retries(producer_client: APIClient, queue) -> None:
    body = enqueue(producer_client, {"payload": 1, "priority": 1, "max_retries": 0}).json()
    assert (body["priority"], body["max_retries"]) == (1, 0)
    for bad in [{"priority": 0}, {"priority": 11}, {"max_retries": 101}]:
        response = enqueue(producer_client, {"payload": 1, **bad})
        assert response.status_code == status.HTTP_400_BAD_REQUEST
        assert list(response.json()["error"]["fields"]) == list(bad)


def test_enqueue__unknown_queue_is_404(producer_client: APIClient) -> None:
    response = enqueue(producer_client, {"payload": 1}, queue="nope")
    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json()["error"]["code"] == "not_found"


def test_enqueue__idempotency_key_returns_the_existing_task(
    producer_client: APIClient, queue
) -> None:
    first = enqueue(producer_client, {"payload": 1, "idempotency_key": "k1"})
    again = enqueue(producer_client, {"payload": 2, "idempotency_key": "k1"})
    assert first.status_code == status.HTTP_201_CREATED
    assert again.status_code == status.HTTP_200_OK
    assert again.json()["id"] == first.json()["id"]
    assert again.json()["payload"] == 1
    assert Task.objects.count() == 1


def test_enqueue__idempotency_key_is_per_queue(producer_client: APIClient, queue) -> None:
    QueueFactory(name="other")
    a = enqueue(producer_client, {"payload": 1, "idempotency_key": "k"})
    b = enqueue(producer_client, {"payload": 1, "idempotency_key": "k"}, queue="other")
    assert b.status_code == status.HTTP_201_CREATED
    assert a.json()["id"] != b.json()["id"]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_enqueue__concurrent_same_key_creates_one_task(make_client) -> None:
    QueueFactory(name="q")
    client = make_client("producer")
    answers: list[int] = []
    ids: list[str] = []
    barrier = threading.Barrier(6)

    def post() -> None:
        try:
            barrier.wait(timeout=10)
            response = enqueue(client, {"payload": 1, "idempotency_key": "race"})
            answers.append(response.status_code)
            ids.append(response.json()["id"])
        finally:
            connection.close()

    threads = [threading.Thread(target=post) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert sorted(answers) == [200] * 5 + [201]
    assert len(set(ids)) == 1
    assert Task.objects.count() == 1


def test_batch__creates_all_in_order(producer_client: APIClient, queue) -> None:
    items = [{"payload": i, "priority": 1 + i % 10} for i in range(1000)]
    response = producer_client.post("/queues/q/tasks/batch", {"tasks": items}, format="json")
    assert response.status_code == status.HTTP_201_CREATED
    results = response.json()["results"]
    assert [r["payload"] for r in results] == list(range(1000))
    assert Task.objects.count() == 1000
    # Each created and buffered: the task rows record both moves (tasks.events).
    assert not TaskEvent.objects.exists()
    chain = events.chain(Task.objects.get(pk=results[0]["id"]), 10)
    assert [(e.from_status, e.to_status) for e in chain] == [
        (None, S.PENDING),
        (S.PENDING, S.CLAIMED),
    ]


def test_batch__one_invalid_item_stores_nothing(producer_client: APIClient, queue) -> None:
    items = [{"payload": 1}, {"payload": 2}, {"payload": 3}, {"payload": 4, "priority": 99}]
    response = producer_client.post("/queues/q/tasks/batch", {"tasks": items}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert list(response.json()["error"]["fields"]) == ["tasks[3].priority"]
    assert not Task.objects.exists()


@pytest.mark.parametrize("tasks", [[], [{"payload": 1}] * 1001, "nope", None])
def test_batch__size_and_shape_limits(producer_client: APIClient, queue, tasks) -> None:
    response = producer_client.post("/queues/q/tasks/batch", {"tasks": tasks}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert "tasks" in response.json()["error"]["fields"]
    assert not Task.objects.exists()


def test_batch__idempotency_keys(producer_client: APIClient, queue) -> None:
    existing = TaskFactory(queue=queue, idempotency_key="old")
    items = [
        {"payload": 1, "idempotency_key": "old"},
        {"payload": 2, "idempotency_key": "new"},
        {"payload": 3, "idempotency_key": "new"},
        {"payload": 4},
    ]
    response = producer_client.post("/queues/q/tasks/batch", {"tasks": items}, format="json")
    assert response.status_code == status.HTTP_201_CREATED
    ids = [r["id"] for r in response.json()["results"]]
    assert ids[0] == str(existing.pk)
    assert ids[1] == ids[2] != ids[3]
    assert Task.objects.count() == 3
    again = producer_client.post("/queues/q/tasks/batch", {"tasks": items[:3]}, format="json")
    assert again.status_code == status.HTTP_200_OK
    assert [r["id"] for r in again.json()["results"]] == ids[:3]


def test_get__task_of_another_queue_is_404(producer_client: APIClient, queue) -> None:
    task = TaskFactory(queue=QueueFactory(name="other"))
    assert producer_client.get(f"/queues/other/tasks/{task.pk}").status_code == 200
    response = producer_client.get(f"/queues/q/tasks/{task.pk}")
    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json()["error"]["code"] == "not_found"


def test_get__shows_execution_fields(producer_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.DONE, worker_id="w-7")
    body = producer_client.get(f"/queues/q/tasks/{task.pk}").json()
    assert (body["status"], body["claimed_by"], body["attempts"]) == ("done", "w-7", 1)
    assert body["result"] == {"ok": True}
    assert body["finished_at"] is not None


def test_list__newest_first_with_cursor_pages(producer_client: APIClient, queue) -> None:
    tasks = [TaskFactory(queue=queue) for _ in range(5)]
    seen: list[str] = []
    url = "/queues/q/tasks?limit=2"
    while url:
        page = producer_client.get(url).json()
        assert len(page["results"]) <= 2
        seen += [t["id"] for t in page["results"]]
        url = page["next"]
    assert seen == [str(t.pk) for t in reversed(tasks)]


def test_list__cursor_is_stable_when_tasks_arrive(producer_client: APIClient, queue) -> None:
    old = [TaskFactory(queue=queue) for _ in range(3)]
    page = producer_client.get("/queues/q/tasks?limit=2").json()
    TaskFactory(queue=queue)  # newer than everything: must not shift page two
    rest = producer_client.get(page["next"]).json()
    assert [t["id"] for t in rest["results"]] == [str(old[0].pk)]


def test_list__filters(producer_client: APIClient, queue) -> None:
    done = TaskFactory(queue=queue, status=S.DONE, worker_id="w-a")
    TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w-b")
    pending = TaskFactory(queue=queue)
    TaskFactory(status=S.DONE)  # another queue

    def ids(query: str) -> list[str]:
        response = producer_client.get(f"/queues/q/tasks?{query}")
        assert response.status_code == status.HTTP_200_OK
        return [t["id"] for t in response.json()["results"]]

    assert ids("status=done") == [str(done.pk)]
    assert ids("claimed_by=w-a") == [str(done.pk)]
    cut = isoformat(pending.created_at).replace("+", "%2B")
    assert ids(f"created_before={cut}") == [t for t in ids("") if t != str(pending.pk)]
    assert ids(f"created_after={cut}") == []  # exclusive


def test_events__oldest_first(producer_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.RETRY, worker_id="w-1")
    response = producer_client.get(f"/queues/q/tasks/{task.pk}/events")
    assert response.status_code == status.HTTP_200_OK
    events = response.json()["results"]
    assert [(e["from_status"], e["to_status"]) for e in events] == [
        (None, "pending"),
        ("pending", "claimed"),
        ("claimed", "executing"),
        ("executing", "retry"),
    ]
    assert events[-1]["worker_id"] == "w-1"
    assert events[-1]["attempt"] == 1
    assert events[-1]["error"] == "boom"
    assert set(events[0]) == {"at", "from_status", "to_status", "worker_id", "attempt", "error"}
    # The creation is the task row's (tasks.events): at its created_at, no worker.
    assert parse_time(events[0]["at"]) == task.created_at
    assert (events[0]["attempt"], events[0]["worker_id"]) == (0, None)


def test_events__pages_of_one_walk_the_chain_once(producer_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.RETRY, worker_id="w-1")
    whole = producer_client.get(f"/queues/q/tasks/{task.pk}/events").json()["results"]
    url: str | None = f"/queues/q/tasks/{task.pk}/events?limit=1"
    walked = []
    while url is not None:
        body = producer_client.get(url).json()
        assert len(body["results"]) == 1
        walked += body["results"]
        url = body["next"]
    assert walked == whole and len(whole) == 4
    # The second page starts after the creation, with the first stored event.
    first = producer_client.get(f"/queues/q/tasks/{task.pk}/events?limit=1").json()
    assert producer_client.get(first["next"]).json()["results"] == whole[1:2]


def _walk(client: APIClient, url: str | None) -> list[dict[str, Any]]:
    """Every item of a list, page by page from `url`."""
    walked = []
    while url is not None:
        body = client.get(url).json()
        walked += body["results"]
        url = body["next"]
    return walked


def test_events__of_a_task_buffered_by_its_enqueue_page_through_its_row_and_rows(
    producer_client: APIClient,
    worker_client: APIClient,
    queue,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Created and buffered in one statement: both moves are the task row's
    (tasks.events); pages of 1, 2 and 3 walk them, then the stored hand-out and ack."""
    with django_capture_on_commit_callbacks(execute=True):  # the push to Redis
        response = producer_client.post("/queues/q/tasks", {"payload": 1}, format="json")
    task_id = response.json()["id"]
    claim = {"worker_id": "w-1", "queues": ["q"]}
    assert worker_client.post("/workers/claim", claim, format="json").json()["tasks"]
    ack = {"worker_id": "w-1", "task_id": task_id}
    assert worker_client.post("/workers/ack", ack, format="json").status_code == 200
    whole = producer_client.get(f"/queues/q/tasks/{task_id}/events").json()["results"]
    assert [(e["from_status"], e["to_status"]) for e in whole] == [
        (None, "pending"),
        ("pending", "claimed"),
        ("claimed", "executing"),
        ("executing", "done"),
    ]
    assert whole[0]["at"] == whole[1]["at"]
    for limit in (1, 2, 3):
        assert _walk(producer_client, f"/queues/q/tasks/{task_id}/events?limit={limit}") == whole


def test_events__pages_walk_the_claims_outcome_rows_and_the_task_row_record(
    producer_client: APIClient, queue
) -> None:
    """A second attempt running: the first attempt's claim is its outcome row's,
    the running one's the task row's (tasks.events); pages of every size walk
    the chain once, and a cursor of one value (before the claims were halves of
    rows) is the documented 400."""
    task = TaskFactory(queue=queue, status=S.RETRY, worker_id="w-1")
    Task.objects.filter(pk=task.pk).update(scheduled_at=timezone.now())  # due now
    transitions.promote([Task.objects.get(pk=task.pk)])
    assert transitions.buffer_due(queue, limit=1)
    transitions.hand_out([str(task.pk)], worker_id="w-2")
    whole = producer_client.get(f"/queues/q/tasks/{task.pk}/events").json()["results"]
    assert [(e["from_status"], e["to_status"], e["worker_id"]) for e in whole] == [
        (None, "pending", None),
        ("pending", "claimed", None),
        ("claimed", "executing", "w-1"),
        ("executing", "retry", "w-1"),
        ("retry", "pending", None),
        ("pending", "claimed", None),
        ("claimed", "executing", "w-2"),
    ]
    for limit in range(1, 8):
        assert _walk(producer_client, f"/queues/q/tasks/{task.pk}/events?limit={limit}") == whole
    old_cursor = keyset.encode([1])
    response = producer_client.get(f"/queues/q/tasks/{task.pk}/events?cursor={old_cursor}")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "invalid"
    not_ints = keyset.encode(["a", 1])
    response = producer_client.get(f"/queues/q/tasks/{task.pk}/events?cursor={not_ints}")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    # Integers beyond any row id (bigint) are keys before or after every event.
    for beyond, results in ((10**50, []), (-(10**50), whole)):
        cursor = keyset.encode([beyond, 1])
        body = producer_client.get(f"/queues/q/tasks/{task.pk}/events?cursor={cursor}").json()
        assert body["results"] == results


@pytest.mark.parametrize("state", [S.PENDING, S.CLAIMED, S.RETRY])
def test_cancel__from_cancellable_states(producer_client: APIClient, queue, state: str) -> None:
    task = TaskFactory(queue=queue, status=state)
    response = producer_client.delete(f"/queues/q/tasks/{task.pk}")
    assert response.status_code == status.HTTP_200_OK
    assert response.json()["status"] == "cancelled"
    assert response.json()["finished_at"] is not None
    assert Task.objects.get(pk=task.pk).status == S.CANCELLED


@pytest.mark.parametrize("state", [S.EXECUTING, S.DONE, S.DEAD, S.CANCELLED])
def test_cancel__other_states_are_409(producer_client: APIClient, queue, state: str) -> None:
    task = TaskFactory(queue=queue, status=state)
    response = producer_client.delete(f"/queues/q/tasks/{task.pk}")
    assert response.status_code == status.HTTP_409_CONFLICT
    assert response.json()["error"]["code"] == "invalid_state"
    assert Task.objects.get(pk=task.pk).status == state


def test_stats(producer_client: APIClient, queue) -> None:
    TaskFactory(queue=queue)
    TaskFactory(queue=queue, scheduled_at=timezone.now() + timedelta(hours=1))
    TaskFactory(queue=queue, status=S.CLAIMED)
    TaskFactory(queue=queue, status=S.EXECUTING)
    TaskFactory(queue=queue, status=S.RETRY)
    TaskFactory(queue=queue, status=S.DEAD)
    for _ in range(3):
        TaskFactory(queue=queue, status=S.DONE)
    response = producer_client.get("/queues/q/stats")
    assert response.status_code == status.HTTP_200_OK
    stats = response.json()
    assert stats["queue"] == "q"
    assert stats["paused"] is False
    assert stats["depth"] == {
        "pending": 1,
        "scheduled": 1,
        "claimed": 1,
        "executing": 1,
        "retry": 1,
    }
    assert stats["dlq_depth"] == 1
    # 3 acks and 2 failed attempts (one retry, one dead) in the last minute.
    assert stats["throughput_per_second"] == pytest.approx(3 / 60, abs=1e-3)
    assert stats["error_rate"] == pytest.approx(2 / 5)
    assert 0 <= stats["oldest_pending_age_seconds"] < 60


def test_stats__empty_queue(producer_client: APIClient, queue) -> None:
    stats = producer_client.get("/queues/q/stats").json()
    assert stats["error_rate"] == 0
    assert stats["oldest_pending_age_seconds"] is None


@pytest.mark.usefixtures("redis_client")
def test_enqueue__due_task_is_claimable_without_the_dispatcher(
    producer_client: APIClient, worker_client: APIClient, queue, django_capture_on_commit_callbacks
) -> None:
    with django_capture_on_commit_callbacks(execute=True):
        task_id = enqueue(producer_client, {"payload": 1}).json()["id"]
    claim = worker_client.post("/workers/claim", {"worker_id": "w", "queues": ["q"]}, format="json")
    assert [t["id"] for t in claim.json()["tasks"]] == [task_id]


@pytest.mark.usefixtures("redis_client")
def test_enqueue__paused_or_future_tasks_stay_pending(
    producer_client: APIClient, admin_client: APIClient, queue
) -> None:
    later = enqueue(producer_client, {"payload": 1, "delay_seconds": 60}).json()
    admin_client.post("/queues/q/pause")
    paused = enqueue(producer_client, {"payload": 2}).json()
    assert Task.objects.get(pk=later["id"]).status == S.PENDING
    assert Task.objects.get(pk=paused["id"]).status == S.PENDING


@pytest.mark.django_db(transaction=True)
def test_enqueue__queue_deleted_meanwhile_is_404_not_500() -> None:
    """A queue deleted between the request's lookup and its insert names no queue.

    Transactional: the foreign key is checked at commit, as in production.
    """
    from queues.exceptions import UnknownQueue
    from tasks.services import TaskSpec, enqueue

    gone = QueueFactory(name="gone")
    gone_copy = type(gone).objects.get(pk=gone.pk)
    gone.delete()
    with pytest.raises(UnknownQueue):
        enqueue(gone_copy, [TaskSpec(payload=1)])
    with pytest.raises(UnknownQueue):
        enqueue(gone_copy, [TaskSpec(payload=1, idempotency_key="k")])
    assert not Task.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_client")
def test_enqueue__queue_deleted_by_another_process_is_404(producer_client: APIClient) -> None:
    """The enqueue remembers queue rows for a second; a row deleted elsewhere meanwhile
    (no signal reaches this process) fails the insert's foreign key: 404, then forgotten."""
    QueueFactory(name="gone")
    assert enqueue(producer_client, {"payload": 1}, queue="gone").status_code == 201
    Task.objects.all().delete()
    Queue.objects.filter(name="gone")._raw_delete(using="default")  # no post_delete signal
    response = enqueue(producer_client, {"payload": 1}, queue="gone")
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"
    assert lookup.by_name("gone") is None
