"""Every bad input of API-cloudtasks.md's table: 400 INVALID_ARGUMENT naming its field,
nothing stored or changed; nothing under /v2/ answers HTML or a 500 for bad input."""

from __future__ import annotations

import base64
from typing import Any

from queues.models import Queue
from taskforge.audit.models import AuditEntry
from tasks.models import Task, TaskName
from tests.service import Api, Service

P = "/v2/projects/p/locations/l"
Q = f"{P}/queues/q"
URL = "https://example.com/hook"


def http(**fields: Any) -> dict[str, Any]:
    return {"task": {"httpRequest": {"url": URL, **fields}}}


def task(**fields: Any) -> dict[str, Any]:
    return {"task": {"httpRequest": {"url": URL}, **fields}}


# (method, path, body, the field named)
CASES: list[tuple[str, str, Any, str]] = [
    ("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/bad_id"}, "queue.name"),
    ("POST", f"{P}/queues", {"name": "projects/x/locations/l/queues/ok"}, "queue.name"),
    ("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/ok", "httpTarget": {}}, "queue.httpTarget"),
    (
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/ok", "appEngineRoutingOverride": {}},
        "queue.appEngineRoutingOverride",
    ),
    (
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/ok", "rateLimits": {"maxDispatchesPerSecond": 501}},
        "queue.rateLimits.maxDispatchesPerSecond",
    ),
    (
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/ok", "retryConfig": {"minBackoff": "ten"}},
        "queue.retryConfig.minBackoff",
    ),
    (
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/ok", "retryConfig": {"maxDoublings": 33}},
        "queue.retryConfig.maxDoublings",
    ),
    ("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/ok", "colour": 1}, "queue.colour"),
    ("PATCH", f"{Q}?updateMask=state", {}, "updateMask"),
    ("PATCH", f"{Q}?updateMask=bogus", {}, "updateMask"),
    ("GET", f"{P}/queues?filter=name:q", None, "filter"),
    ("GET", f"{P}/queues?pageSize=-1", None, "pageSize"),
    ("GET", f"{P}/queues?pageSize=9801", None, "pageSize"),
    ("GET", f"{P}/queues?pageToken=%25%25", None, "pageToken"),
    ("GET", f"{P}/queues?colour=red", None, "colour"),
    ("GET", f"{Q}/tasks?pageSize=1001", None, "pageSize"),
    ("POST", f"{Q}/tasks", {"task": {"name": f"{Q[4:]}/tasks/a b", **http()["task"]}}, "task.name"),
    (
        "POST",
        f"{Q}/tasks",
        {"task": {"name": "projects/p/locations/l/queues/other/tasks/a", **http()["task"]}},
        "task.name",
    ),
    ("POST", f"{Q}/tasks", {"task": {}}, "task.httpRequest"),
    ("POST", f"{Q}/tasks", {"task": {"appEngineHttpRequest": {}}}, "task.appEngineHttpRequest"),
    ("POST", f"{Q}/tasks", http(oauthToken={}), "task.httpRequest.oauthToken"),
    ("POST", f"{Q}/tasks", http(url="ftp://example.com/"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(url="https://example.com/a b"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(url="https://example.com/#frag"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(url="https://" + "a" * 2084), "task.httpRequest.url"),
    # API.md "Security (v1.2)": a blocked literal address, or a numeric form of one.
    ("POST", f"{Q}/tasks", http(url="http://127.0.0.1:8080/x"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(url="http://[::1]/x"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(url="http://0x7f000001/x"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(url="http://169.254.169.254/meta"), "task.httpRequest.url"),
    ("POST", f"{Q}/tasks", http(httpMethod="FETCH"), "task.httpRequest.httpMethod"),
    ("POST", f"{Q}/tasks", http(httpMethod=9), "task.httpRequest.httpMethod"),
    ("POST", f"{Q}/tasks", http(httpMethod="GET", body="aGk="), "task.httpRequest.body"),
    ("POST", f"{Q}/tasks", http(body="not base64!"), "task.httpRequest.body"),
    ("POST", f"{Q}/tasks", http(headers={"X-A": "a\r\nb"}), "task.httpRequest.headers['X-A']"),
    ("POST", f"{Q}/tasks", http(headers={"Bad Name": "x"}), "task.httpRequest.headers['Bad Name']"),
    ("POST", f"{Q}/tasks", http(headers={"X-Big": "x" * 82000}), "task.httpRequest.headers"),
    (
        "POST",
        f"{Q}/tasks",
        http(oidcToken={"audience": "a"}),
        "task.httpRequest.oidcToken.serviceAccountEmail",
    ),
    ("POST", f"{Q}/tasks", task(scheduleTime="tomorrow"), "task.scheduleTime"),
    ("POST", f"{Q}/tasks", task(scheduleTime="2999-01-01T00:00:00Z"), "task.scheduleTime"),
    ("POST", f"{Q}/tasks", task(dispatchDeadline="5s"), "task.dispatchDeadline"),
    ("POST", f"{Q}/tasks", task(dispatchDeadline="1801s"), "task.dispatchDeadline"),
    ("POST", f"{Q}/tasks", task(retryConfig={"maxAttempts": -2}), "task.retryConfig.maxAttempts"),
    ("POST", f"{Q}/tasks", {**task(), "extra": 1}, "extra"),
    ("POST", f"{Q}/tasks", {"task": {**http()["task"], "colour": 1}}, "task.colour"),
    ("POST", f"{Q}/tasks", {**task(), "responseView": "HUGE"}, "responseView"),
    (
        "POST",
        f"{Q}/tasks",
        http(body=base64.b64encode(b"x" * 1_048_577).decode()),
        "task",
    ),
]


def test_bad_input__400_with_the_field_and_nothing_stored(
    server: Service, keys: dict[str, str]
) -> None:
    admin = Api(server.base_url, keys["admin"])
    admin.ok("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/q"})
    queues, audit = Queue.objects.count(), AuditEntry.objects.count()
    failures = []
    for method, path, body, field in CASES:
        status, answer = admin.call(method, path, body)
        error = answer.get("error", {}) if isinstance(answer, dict) else {}
        violations = [
            v["field"] for d in error.get("details", []) for v in d.get("fieldViolations", [])
        ]
        if (status, error.get("status"), violations) != (400, "INVALID_ARGUMENT", [field]):
            failures.append(f"{method} {path[:80]} -> {status} {str(answer)[:300]}")
    assert failures == []
    assert (Queue.objects.count(), AuditEntry.objects.count()) == (queues, audit)
    assert not Task.objects.exists()
    assert not TaskName.objects.exists()


def test_bad_input__unauthenticated_unknown_and_unimplemented(
    server: Service, keys: dict[str, str]
) -> None:
    status, answer = Api(server.base_url).call("GET", f"{P}/queues")
    assert (status, answer["error"]["status"]) == (401, "UNAUTHENTICATED")
    admin = Api(server.base_url, keys["admin"])
    for path in (f"{P}/nothing", "/v2/", f"{Q}:frobnicate"):
        status, answer = admin.call("GET", path)
        assert (status, answer["error"]["status"]) == (404, "NOT_FOUND"), path
    for method, path in (
        ("POST", f"{Q}:getIamPolicy"),
        ("POST", f"{Q}/tasks:batchCreate"),
        ("GET", "/v2/projects/p/locations"),
        ("GET", f"{P}/cmekConfig"),
    ):
        status, answer = admin.call(method, path, {})
        assert (status, answer["error"]["status"]) == (501, "UNIMPLEMENTED"), path
    status, answer = admin.call("POST", f"{P}/queues", None)
    assert status == 400  # an empty body is {}: the name is missing
    status, answer = admin.call("POST", f"{Q}/tasks?$alt=json;enum-encoding=int", {"task": 1})
    assert (status, answer["error"]["details"][0]["fieldViolations"][0]["field"]) == (400, "task")
