from __future__ import annotations

import threading
import time
from datetime import datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone
from rest_framework import status
from rest_framework.test import APIClient

from queues.tests.factories import QueueFactory
from tasks.dispatcher import DispatcherLoop
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory
from workers.models import Worker

S = TaskStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client")]


def dispatch() -> None:
    loop = DispatcherLoop()
    while loop.tick():
        pass


def claim(client: APIClient, worker: str = "w1", queues=("q",), **extra):
    body = {"worker_id": worker, "queues": list(queues), **extra}
    response = client.post("/workers/claim", body, format="json")
    assert response.status_code == status.HTTP_200_OK, response.json()
    return response.json()["tasks"]


def post(client: APIClient, path: str, body: dict[str, Any]):
    return client.post(f"/workers/{path}", body, format="json")


@pytest.fixture
def queue():
    return QueueFactory(name="q", max_retries=2)


def test_claim__priority_then_fifo(worker_client: APIClient, queue) -> None:
    low = [TaskFactory(queue=queue, priority=9) for _ in range(3)]
    high = [TaskFactory(queue=queue, priority=1) for _ in range(3)]
    dispatch()
    got = claim(worker_client, max_tasks=10)
    assert [t["id"] for t in got] == [str(t.pk) for t in high + low]
    assert all(t["status"] == "executing" and t["attempts"] == 1 for t in got)
    assert all(t["claimed_by"] == "w1" for t in got)
    first = got[0]
    expires = datetime.fromisoformat(first["lease_expires_at"])
    beat = datetime.fromisoformat(first["heartbeat_at"])
    assert (expires - beat) == timedelta(seconds=30)


def test_claim__queues_in_the_order_given(worker_client: APIClient, queue) -> None:
    other = QueueFactory(name="other")
    mine = TaskFactory(queue=queue, priority=9)
    theirs = TaskFactory(queue=other, priority=1)
    dispatch()
    got = claim(worker_client, queues=["q", "other"], max_tasks=2)
    assert [t["id"] for t in got] == [str(mine.pk), str(theirs.pk)]


def test_claim__max_tasks_and_empty(worker_client: APIClient, queue) -> None:
    for _ in range(3):
        TaskFactory(queue=queue)
    dispatch()
    assert len(claim(worker_client, max_tasks=2)) == 2
    assert len(claim(worker_client, max_tasks=2)) == 1
    assert claim(worker_client, max_tasks=2) == []


def test_claim__unknown_queue_is_404(worker_client: APIClient, queue) -> None:
    response = post(worker_client, "claim", {"worker_id": "w", "queues": ["q", "nope"]})
    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json()["error"]["code"] == "not_found"


def test_claim__paused_queue_hands_out_nothing(
    worker_client: APIClient, admin_client: APIClient, queue
) -> None:
    TaskFactory(queue=queue)
    dispatch()
    admin_client.post("/queues/q/pause")
    assert claim(worker_client) == []
    admin_client.post("/queues/q/resume")
    assert len(claim(worker_client)) == 1


def test_claim__future_task_is_not_handed_out(worker_client: APIClient, queue) -> None:
    TaskFactory(queue=queue, scheduled_at=timezone.now() + timedelta(hours=1))
    dispatch()
    assert claim(worker_client) == []


def test_claim__skips_ids_of_cancelled_tasks(
    worker_client: APIClient, producer_client: APIClient, queue
) -> None:
    first, second = TaskFactory(queue=queue), TaskFactory(queue=queue)
    dispatch()
    producer_client.delete(f"/queues/q/tasks/{first.pk}")
    assert [t["id"] for t in claim(worker_client)] == [str(second.pk)]


@pytest.mark.django_db(transaction=True)
def test_claim__long_poll_answers_when_work_arrives(make_client) -> None:
    queue = QueueFactory(name="q")
    client = make_client("worker")
    started = time.monotonic()

    def later() -> None:
        time.sleep(0.3)
        try:
            TaskFactory(queue=queue)
            dispatch()
        finally:
            connection.close()

    thread = threading.Thread(target=later)
    thread.start()
    got = claim(client, wait_seconds=5)
    thread.join(timeout=10)
    elapsed = time.monotonic() - started
    assert len(got) == 1
    assert 0.3 <= elapsed < 2.0


def test_claim__long_poll_times_out_empty(worker_client: APIClient, queue) -> None:
    started = time.monotonic()
    assert claim(worker_client, wait_seconds=0.3) == []
    assert 0.3 <= time.monotonic() - started < 1.5


def test_heartbeat__extends_the_lease(worker_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")
    response = post(worker_client, "heartbeat", {"worker_id": "w1", "task_id": str(task.pk)})
    assert response.status_code == status.HTTP_200_OK
    body = response.json()
    assert set(body) == {"task_id", "status", "heartbeat_at", "lease_expires_at"}
    assert body["status"] == "executing"
    task.refresh_from_db()
    assert task.heartbeat_at is not None
    assert body["heartbeat_at"].startswith(task.heartbeat_at.strftime("%Y-%m-%dT%H:%M:%S"))


LEASE_LOST_CASES = [
    ("other worker", {"worker_id": "w2"}),
    ("wrong attempt", {"attempt": 2}),
    ("unknown task", {"task_id": "00000000-0000-7000-8000-000000000000"}),
]


@pytest.mark.parametrize("path", ["heartbeat", "ack", "nack"])
@pytest.mark.parametrize(("case", "change"), LEASE_LOST_CASES)
def test_fencing__foreign_or_stale_calls_are_409_and_change_nothing(
    worker_client: APIClient, queue, path: str, case: str, change: dict[str, Any]
) -> None:
    task = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")
    before = Task.objects.get(pk=task.pk)
    events = TaskEvent.objects.count()
    body = {"worker_id": "w1", "task_id": str(task.pk), **change}
    if path == "nack":
        body["error"] = "x"
    response = post(worker_client, path, body)
    assert response.status_code == status.HTTP_409_CONFLICT
    assert response.json()["error"]["code"] == "lease_lost"
    after = Task.objects.get(pk=task.pk)
    assert (after.status, after.heartbeat_at, after.attempts) == (
        before.status,
        before.heartbeat_at,
        before.attempts,
    )
    assert TaskEvent.objects.count() == events


@pytest.mark.parametrize("path", ["heartbeat", "ack", "nack"])
def test_fencing__after_the_watchdog_reclaimed_the_lease(
    worker_client: APIClient, queue, path: str
) -> None:
    from tasks import transitions

    task = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")
    transitions.expire_lease(task)
    body = {"worker_id": "w1", "task_id": str(task.pk), "error": "late"}
    if path != "nack":
        body.pop("error")
    response = post(worker_client, path, body)
    assert response.status_code == status.HTTP_409_CONFLICT
    assert Task.objects.get(pk=task.pk).status == S.RETRY


def test_ack__stores_the_result_and_repeats_safely(worker_client: APIClient, queue) -> None:
    task = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")
    body = {"worker_id": "w1", "task_id": str(task.pk), "attempt": 1, "result": {"sent": 3}}
    first = post(worker_client, "ack", body)
    assert first.status_code == status.HTTP_200_OK
    assert (first.json()["status"], first.json()["result"]) == ("done", {"sent": 3})
    again = post(worker_client, "ack", body)
    assert again.status_code == status.HTTP_200_OK
    assert again.json()["status"] == "done"
    assert TaskEvent.objects.filter(task=task, to_status=S.DONE).count() == 1
    other = post(worker_client, "ack", {**body, "worker_id": "w2"})
    assert other.status_code == status.HTTP_409_CONFLICT


def test_nack__retries_with_backoff_then_dies(worker_client: APIClient, queue, settings) -> None:
    settings.TASKFORGE_RETRY_BASE_MS = 1000
    task = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")  # max_retries 2
    response = post(
        worker_client, "nack", {"worker_id": "w1", "task_id": str(task.pk), "error": "e1"}
    )
    body = response.json()
    assert (response.status_code, body["status"], body["last_error"]) == (200, "retry", "e1")
    delay = datetime.fromisoformat(body["scheduled_at"]) - datetime.fromisoformat(
        body["updated_at"]
    )
    assert timedelta(seconds=1) <= delay <= timedelta(seconds=2)
    from tasks import transitions

    for attempt in (2, 3):
        task.refresh_from_db()
        transitions.promote([task])
        transitions.buffer_due(task.queue, limit=1, now=task.scheduled_at)  # the retry's time
        transitions.hand_out([str(task.pk)], worker_id="w1")
        body = post(
            worker_client,
            "nack",
            {
                "worker_id": "w1",
                "task_id": str(task.pk),
                "error": f"e{attempt}",
                "attempt": attempt,
            },
        ).json()
    assert (body["status"], body["attempts"]) == ("dead", 3)
    assert body["finished_at"] is not None


def test_nack__retry_false_goes_dead_and_retry_after_is_used(
    worker_client: APIClient, queue
) -> None:
    a = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")
    b = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1")
    body = post(
        worker_client,
        "nack",
        {"worker_id": "w1", "task_id": str(a.pk), "error": "x", "retry": False},
    ).json()
    assert body["status"] == "dead"
    body = post(
        worker_client,
        "nack",
        {"worker_id": "w1", "task_id": str(b.pk), "error": "x", "retry_after_seconds": 600},
    ).json()
    delay = datetime.fromisoformat(body["scheduled_at"]) - datetime.fromisoformat(
        body["updated_at"]
    )
    assert delay == timedelta(seconds=600)


def test_batches__each_item_on_its_own(worker_client: APIClient, queue) -> None:
    mine = [TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1") for _ in range(2)]
    foreign = TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w2")
    items: list[dict[str, Any]] = [{"task_id": str(t.pk)} for t in [*mine, foreign]]
    beats = post(worker_client, "heartbeat/batch", {"worker_id": "w1", "items": items}).json()
    assert [r["ok"] for r in beats["results"]] == [True, True, False]
    assert beats["results"][0]["status"] == "executing"
    assert "lease_expires_at" in beats["results"][0]
    assert beats["results"][2]["error"]["code"] == "lease_lost"
    items[0]["result"] = {"n": 1}
    acks = post(worker_client, "ack/batch", {"worker_id": "w1", "items": items}).json()
    assert [(r["task_id"], r["ok"]) for r in acks["results"]] == [
        (str(mine[0].pk), True),
        (str(mine[1].pk), True),
        (str(foreign.pk), False),
    ]
    assert acks["results"][0]["status"] == "done"
    assert Task.objects.get(pk=mine[0].pk).result == {"n": 1}
    assert Task.objects.get(pk=foreign.pk).status == S.EXECUTING


def test_ack_batch__a_few_queries_whatever_its_size(worker_client: APIClient, queue) -> None:
    """An ack batch's tasks come back brief (transitions.ack): nothing on its way to the
    answer, the log lines or the metrics may read a field they do not hold (each read
    would be a query of its own)."""
    from django.db import connections
    from django.test.utils import CaptureQueriesContext

    counts = []
    for size in (1, 30):  # the first also looks up the key and records the worker
        held = [TaskFactory(queue=queue, status=S.EXECUTING, worker_id="w1") for _ in range(size)]
        items = [{"task_id": str(t.pk), "attempt": 1, "result": {"n": 1}} for t in held]
        with CaptureQueriesContext(connections["default"]) as queries:
            body = post(worker_client, "ack/batch", {"worker_id": "w1", "items": items}).json()
        assert [r["status"] for r in body["results"]] == ["done"] * size
        counts.append(len(queries))
    assert counts[1] <= 3, counts  # the ack statement, and a queue lookup when its cache expired
    assert Task.objects.filter(status=S.DONE, result={"n": 1}).count() == 31


@pytest.mark.parametrize("items", [[], [{"task_id": "nope"}], "x"])
def test_batches__malformed_body_is_400(worker_client: APIClient, queue, items) -> None:
    response = post(worker_client, "ack/batch", {"worker_id": "w1", "items": items})
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "invalid"


@pytest.mark.parametrize(
    "body",
    [
        {"worker_id": "", "queues": ["q"]},
        {"worker_id": "has space", "queues": ["q"]},
        {"worker_id": "w" * 201, "queues": ["q"]},
        {"worker_id": "w", "queues": []},
        {"worker_id": "w", "queues": ["q"] * 21},
        {"worker_id": "w", "queues": ["q"], "max_tasks": 101},
        {"worker_id": "w", "queues": ["q"], "wait_seconds": 31},
        {"worker_id": "w", "queues": ["q"], "wait_seconds": -1},
    ],
)
def test_claim__invalid_bodies(worker_client: APIClient, queue, body) -> None:
    response = post(worker_client, "claim", body)
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "invalid"


def test_workers__lists_recent_workers_with_their_tasks(
    admin_client: APIClient, worker_client: APIClient, queue
) -> None:
    task = TaskFactory(queue=queue)
    dispatch()
    claim(worker_client, worker="alive")
    Worker.objects.create(worker_id="quiet", last_seen_at=timezone.now() - timedelta(minutes=5))
    Worker.objects.create(worker_id="gone", last_seen_at=timezone.now() - timedelta(hours=2))
    body = admin_client.get("/workers").json()
    assert body["next"] is None
    rows = {row["worker_id"]: row for row in body["results"]}
    assert set(rows) == {"alive", "quiet"}
    assert rows["alive"]["current_tasks"] == [str(task.pk)]
    assert (rows["alive"]["stale"], rows["quiet"]["stale"]) == (False, True)
    assert worker_client.get("/workers").status_code == status.HTTP_403_FORBIDDEN


def test_claim__queue_paused_after_the_claim_read_it_hands_out_nothing(
    worker_client: APIClient, queue
) -> None:
    """The hand-out itself honours a pause that lands while a claim is under way."""
    from queues.models import Queue
    from tasks import transitions
    from tasks.buffer import get_buffer

    task = TaskFactory(queue=queue)
    dispatch()
    Queue.objects.filter(pk=queue.pk).update(paused=True)  # after the claim's read, say
    taken = get_buffer().take(queue.id, 10, None)
    assert transitions.hand_out(taken.ids, worker_id="w", queues={queue.id: queue}) == []
    assert Task.objects.get(pk=task.pk).status == S.CLAIMED


def test_lease__is_bound_to_the_claiming_key(make_client, queue) -> None:
    """API.md v1.1 (issue 14): another worker key sending the same worker_id is not the
    holder; its heartbeat, ack and nack answer 409 lease_lost and change nothing."""
    TaskFactory(queue=queue)
    dispatch()
    holder, other = make_client("worker"), make_client("worker")
    [task] = claim(holder)
    item = {"worker_id": "w1", "task_id": task["id"], "attempt": task["attempts"]}
    for path, body in [
        ("heartbeat", item),
        ("ack", {**item, "result": {"stolen": True}}),
        ("nack", {**item, "error": "not mine"}),
    ]:
        response = post(other, path, body)
        assert response.status_code == status.HTTP_409_CONFLICT, path
        assert response.json()["error"]["code"] == "lease_lost"
    for path in ("heartbeat/batch", "ack/batch"):
        batch = {"worker_id": "w1", "items": [{"task_id": task["id"]}]}
        [result] = post(other, path, batch).json()["results"]
        assert result["error"]["code"] == "lease_lost", path
    row = Task.objects.get(pk=task["id"])
    assert (row.status, row.result, row.last_error) == (S.EXECUTING, None, None)
    assert post(holder, "ack", {**item, "result": {"mine": True}}).status_code == 200
    assert Task.objects.get(pk=task["id"]).result == {"mine": True}
