"""Google's own Python client (google-cloud-tasks, REST transport) against run_api."""

from __future__ import annotations

from typing import Any

import pytest
from google.api_core import exceptions as gexc
from google.api_core.client_options import ClientOptions
from google.cloud import tasks_v2
from google.oauth2.credentials import Credentials
from google.protobuf import duration_pb2, field_mask_pb2

from queues.models import Queue
from taskforge.audit.models import AuditEntry
from tasks.models import Task, TaskStatus
from tests.service import Service

PARENT = "projects/my-project/locations/us-central1"


def client(server: Service, key: str) -> tasks_v2.CloudTasksClient:
    """The setup of API-cloudtasks.md "Serving and clients", exactly."""
    return tasks_v2.CloudTasksClient(
        transport="rest",
        client_options=ClientOptions(api_endpoint=server.base_url),
        credentials=Credentials(token=key),
    )


def rpc_error(exc: gexc.GoogleAPICallError) -> dict[str, Any]:
    """The google.rpc.Status the server answered (its `error` object)."""
    response: Any = exc.response
    body: dict[str, Any] = response.json()["error"]
    return body


def test_queues__every_method(server: Service, keys: dict[str, str]) -> None:
    admin = client(server, keys["admin"])
    name = f"{PARENT}/queues/emails"
    created = admin.create_queue(
        parent=PARENT,
        queue=tasks_v2.Queue(
            name=name,
            rate_limits=tasks_v2.RateLimits(max_dispatches_per_second=0.5),
            retry_config=tasks_v2.RetryConfig(
                max_attempts=5, min_backoff=duration_pb2.Duration(seconds=10)
            ),
        ),
    )
    assert created.name == name
    assert created.rate_limits.max_dispatches_per_second == 0.5
    assert created.rate_limits.max_burst_size == 1
    assert created.rate_limits.max_concurrent_dispatches == 1000
    assert created.retry_config.max_attempts == 5
    assert created.retry_config.min_backoff.seconds == 10
    assert created.retry_config.max_backoff.seconds == 3600
    assert created.retry_config.max_doublings == 16
    assert created.state == tasks_v2.Queue.State.RUNNING
    native = Queue.objects.get(name="emails")
    assert (native.rate_limit, native.max_retries, native.max_concurrency) == (0.5, 4, 1000)

    with pytest.raises(gexc.Conflict):
        admin.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=name))

    got = admin.get_queue(name=name)
    assert got.retry_config.max_attempts == 5
    # Any project and location see the one namespace.
    other = client(server, keys["producer"]).get_queue(
        name="projects/p2/locations/europe-west1/queues/emails"
    )
    assert other.name == "projects/p2/locations/europe-west1/queues/emails"

    updated = admin.update_queue(
        queue=tasks_v2.Queue(
            name=name, rate_limits=tasks_v2.RateLimits(max_concurrent_dispatches=7)
        ),
        update_mask=field_mask_pb2.FieldMask(paths=["rate_limits.max_concurrent_dispatches"]),
    )
    assert updated.rate_limits.max_concurrent_dispatches == 7
    assert updated.rate_limits.max_dispatches_per_second == 0.5  # not named: unchanged

    assert admin.pause_queue(name=name).state == tasks_v2.Queue.State.PAUSED
    paused = [
        q.name for q in admin.list_queues(request={"parent": PARENT, "filter": "state: PAUSED"})
    ]
    assert paused == [name]
    assert admin.resume_queue(name=name).state == tasks_v2.Queue.State.RUNNING
    purged = admin.purge_queue(name=name)
    assert purged.purge_time.timestamp() > 0

    # Pages: every queue once, in name order.
    for index in range(5):
        admin.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=f"{PARENT}/queues/q{index}"))
    listed = [
        q.name.rsplit("/", 1)[1]
        for q in admin.list_queues(request={"parent": PARENT, "page_size": 2})
    ]
    assert listed == ["emails", "q0", "q1", "q2", "q3", "q4"]

    admin.delete_queue(name=name)
    with pytest.raises(gexc.NotFound):
        admin.get_queue(name=name)
    entry = AuditEntry.objects.get(action="queue.delete", queue="emails")
    assert entry.details == {"tasks_deleted": 0}


def test_tasks__create_get_list_delete(server: Service, keys: dict[str, str]) -> None:
    admin = client(server, keys["admin"])
    producer = client(server, keys["producer"])
    queue = f"{PARENT}/queues/work"
    admin.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=queue))
    admin.pause_queue(name=queue)  # nothing is delivered while we look
    task = producer.create_task(
        request=tasks_v2.CreateTaskRequest(
            parent=queue,
            task=tasks_v2.Task(
                name=f"{queue}/tasks/order-1",
                http_request=tasks_v2.HttpRequest(
                    url="https://example.com/hook?x=1",
                    http_method=tasks_v2.HttpMethod.PUT,
                    headers={"Content-Type": "text/plain", "X-Trace": "abc", "Host": "evil"},
                    body=b"hello \x00 bytes",
                ),
            ),
            response_view=tasks_v2.Task.View.FULL,
        )
    )
    assert task.name == f"{queue}/tasks/order-1"
    assert task.http_request.http_method == tasks_v2.HttpMethod.PUT
    assert task.http_request.body == b"hello \x00 bytes"
    assert dict(task.http_request.headers) == {
        "Content-Type": "text/plain",
        "X-Trace": "abc",
        "User-Agent": "Google-Cloud-Tasks",
    }
    assert task.dispatch_deadline.seconds == 600
    native = Task.objects.get(name="order-1")
    assert native.payload is None
    assert native.http_request is not None
    assert native.http_request["url"] == "https://example.com/hook?x=1"

    with pytest.raises(gexc.Conflict) as conflict:
        producer.create_task(
            parent=queue,
            task=tasks_v2.Task(
                name=f"{queue}/tasks/order-1",
                http_request=tasks_v2.HttpRequest(url="https://example.com/"),
            ),
        )
    assert rpc_error(conflict.value)["status"] == "ALREADY_EXISTS"

    unnamed = producer.create_task(
        parent=queue, task=tasks_v2.Task(http_request=tasks_v2.HttpRequest(url="http://x.test/"))
    )
    unnamed_id = unnamed.name.rsplit("/", 1)[1]
    assert Task.objects.filter(pk=unnamed_id, name=None).exists()

    basic = producer.get_task(name=f"{queue}/tasks/order-1")
    assert basic.http_request.body == b""  # BASIC leaves the body out
    assert basic.view == tasks_v2.Task.View.BASIC
    listed = [
        t.name.rsplit("/", 1)[1]
        for t in producer.list_tasks(request={"parent": queue, "page_size": 1})
    ]
    assert listed == ["order-1", unnamed_id]

    producer.delete_task(name=f"{queue}/tasks/order-1")
    assert Task.objects.get(name="order-1").status == TaskStatus.CANCELLED
    with pytest.raises(gexc.NotFound):
        producer.get_task(name=f"{queue}/tasks/order-1")
    with pytest.raises(gexc.Conflict) as recent:
        producer.create_task(
            parent=queue,
            task=tasks_v2.Task(
                name=f"{queue}/tasks/order-1",
                http_request=tasks_v2.HttpRequest(url="https://example.com/"),
            ),
        )
    assert "too recently" in rpc_error(recent.value)["message"]


def test_errors__roles_and_statuses(server: Service, keys: dict[str, str]) -> None:
    worker = client(server, keys["worker"])
    producer = client(server, keys["producer"])
    with pytest.raises(gexc.Forbidden):
        producer.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=f"{PARENT}/queues/x"))
    with pytest.raises(gexc.Forbidden):
        worker.list_tasks(parent=f"{PARENT}/queues/x")
    assert list(worker.list_queues(parent=PARENT)) == []
    with pytest.raises(gexc.NotFound):
        producer.get_queue(name=f"{PARENT}/queues/missing")
    with pytest.raises(gexc.BadRequest) as bad:
        client(server, keys["admin"]).create_queue(
            parent=PARENT, queue=tasks_v2.Queue(name=f"{PARENT}/queues/bad_name")
        )
    details = rpc_error(bad.value)["details"]
    assert details[0]["fieldViolations"][0]["field"] == "queue.name"
    with pytest.raises(gexc.MethodNotImplemented):
        client(server, keys["admin"]).get_iam_policy(resource=f"{PARENT}/queues/x")


def test_tasks__create_in_a_queue_made_again_or_deleted(
    server: Service, keys: dict[str, str]
) -> None:
    """CreateTask reads the queue as its API process remembers it (for up to a
    second): a queue made again elsewhere under its name takes the task, and one
    deleted elsewhere answers NOT_FOUND."""
    admin = client(server, keys["admin"])
    producer = client(server, keys["producer"])
    queue = f"{PARENT}/queues/again"
    admin.create_queue(parent=PARENT, queue=tasks_v2.Queue(name=queue))
    admin.pause_queue(name=queue)
    task = tasks_v2.Task(http_request=tasks_v2.HttpRequest(url="https://example.com/"))
    producer.create_task(parent=queue, task=task)  # the API process remembers the queue
    # Deleted and made again by another process (this one: the API process is not told).
    Queue.objects.filter(name="again").delete()
    made = Queue.objects.create(name="again", paused=True)
    producer.create_task(parent=queue, task=task)
    assert Task.objects.filter(queue=made).count() == 1
    Queue.objects.filter(name="again").delete()
    with pytest.raises(gexc.NotFound):
        producer.create_task(parent=queue, task=task)
