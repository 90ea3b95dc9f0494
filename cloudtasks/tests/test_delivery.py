"""Delivery of /v2 tasks by run_pusher (API-cloudtasks.md "Delivery", "Retries").

A real run_api, dispatcher, scheduler, watchdog and pusher; a real HTTP target
records what arrives.
"""

from __future__ import annotations

import base64
import itertools
import time
from collections.abc import Callable

import jwt

from queues.models import Queue
from taskforge.audit.models import AuditEntry
from tasks.models import Task, TaskStatus
from tests.pushtarget import Answer, Request, Target
from tests.service import Api, Service
from workers.models import SigningKey

P = "/v2/projects/p/locations/l"
S = TaskStatus


def wait_for(check: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_delivery__method_url_headers_and_body_exactly(
    fleet: Service, keys: dict[str, str]
) -> None:
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/hooks"})
    with Target() as target:
        body = bytes(range(256))
        admin.ok(
            "POST",
            f"{P}/queues/hooks/tasks",
            {
                "task": {
                    "name": f"{P[4:]}/queues/hooks/tasks/t-1",
                    "httpRequest": {
                        "url": target.url("/put/here?a=1&b=%20"),
                        "httpMethod": "PUT",
                        "headers": {"X-Custom": "Keep-Case", "Authorization": "Bearer mine"},
                        "body": base64.b64encode(body).decode(),
                    },
                }
            },
        )
        admin.ok(
            "POST",
            f"{P}/queues/hooks/tasks",
            {"task": {"httpRequest": {"url": target.url("/get"), "httpMethod": "GET"}}},
        )
        wait_for(lambda: len(target.requests) == 2)
        by_path = {r.path: r for r in target.requests}
        put = by_path["/put/here?a=1&b=%20"]
        assert put.method == "PUT"
        assert put.body == body
        assert put.header("Content-Type") is None  # only as the task's headers give it
        assert put.header("X-Custom") == "Keep-Case"
        assert put.header("Authorization") == "Bearer mine"
        assert put.header("User-Agent") == "Google-Cloud-Tasks"
        assert put.header("X-CloudTasks-QueueName") == "hooks"
        assert put.header("X-CloudTasks-TaskName") == "t-1"
        assert put.header("X-CloudTasks-TaskRetryCount") == "0"
        assert put.header("X-CloudTasks-TaskExecutionCount") == "0"
        assert put.header("X-CloudTasks-TaskPreviousResponse") is None
        eta = float(put.header("X-CloudTasks-TaskETA") or 0)
        assert abs(eta - time.time()) < 60
        native = Task.objects.get(name="t-1")
        assert put.header("TaskForge-Task-Id") == str(native.pk)
        assert put.header("TaskForge-Attempt") == "1"
        assert (put.header("TaskForge-Signature") or "").startswith("t=")
        get = by_path["/get"]
        assert (get.method, get.body) == ("GET", b"")
        wait_for(lambda: Task.objects.filter(status=S.DONE).count() == 2)
        # Done: gone over /v2, there natively.
        status, _ = admin.call("GET", f"{P}/queues/hooks/tasks/t-1")
        assert status == 404


def test_delivery__retries_follow_the_queue_config_then_dead(
    fleet: Service, keys: dict[str, str]
) -> None:
    """maxAttempts 3, backoff 1s doubling: 3 attempts ~1s then ~2s apart, the next
    attempt carries the previous status, then the task is dead (404 over /v2)."""
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok(
        "POST",
        f"{P}/queues",
        {
            "name": f"{P[4:]}/queues/flaky",
            "retryConfig": {"maxAttempts": 3, "minBackoff": "1s", "maxBackoff": "10s"},
        },
    )

    def answer(request: Request) -> Answer:
        return Answer(500 if len(target.requests) < 3 else 404, b"nope")

    with Target(answer) as target:
        admin.ok(
            "POST",
            f"{P}/queues/flaky/tasks",
            {
                "task": {
                    "name": f"{P[4:]}/queues/flaky/tasks/f",
                    "httpRequest": {"url": target.url()},
                }
            },
        )
        wait_for(lambda: Task.objects.filter(name="f", status=S.DEAD).exists(), 40)
        arrivals = target.requests
        assert len(arrivals) == 3
        assert [r.header("X-CloudTasks-TaskRetryCount") for r in arrivals] == ["0", "1", "2"]
        assert [r.header("X-CloudTasks-TaskPreviousResponse") for r in arrivals] == [
            None,
            "500",
            "500",
        ]
        assert [r.header("X-CloudTasks-TaskExecutionCount") for r in arrivals] == ["0", "0", "0"]
        gaps = [b.at - a.at for a, b in itertools.pairwise(arrivals)]
        tick = fleet.knob("SCHEDULER_TICK_SECONDS")
        assert 1.0 <= gaps[0] <= 1.0 + tick + 1.5, gaps
        assert 2.0 <= gaps[1] <= 2.0 + tick + 1.5, gaps
        task = Task.objects.get(name="f")
        assert task.last_error is not None and task.last_error.startswith("HTTP 404")
        status, _ = admin.call("GET", f"{P}/queues/flaky/tasks/f")
        assert status == 404


def test_delivery__dispatch_deadline_fails_a_slow_attempt(
    fleet: Service, keys: dict[str, str]
) -> None:
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok(
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/slow", "retryConfig": {"maxAttempts": 1}},
    )
    with Target(lambda r: Answer(200, b"late", delay=20)) as target:
        admin.ok(
            "POST",
            f"{P}/queues/slow/tasks",
            {
                "task": {
                    "name": f"{P[4:]}/queues/slow/tasks/s",
                    "dispatchDeadline": "15s",
                    "httpRequest": {"url": target.url()},
                }
            },
        )
        wait_for(lambda: Task.objects.filter(name="s", status=S.DEAD).exists(), 40)
        task = Task.objects.get(name="s")
        assert task.last_error == "timeout after 15.0 s"
        assert task.http_attempts is not None
        assert task.http_attempts["last"]["responseStatus"]["code"] == 4  # DEADLINE_EXCEEDED


def test_delivery__a_pull_queue_keeps_its_claims_and_its_v2_tasks_apart(
    fleet: Service, keys: dict[str, str]
) -> None:
    """/workers/claim never hands out a task with an HTTP target, in a queue it pulls."""
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok("POST", "/queues", {"name": "mixed"})
    worker = Api(fleet.base_url, keys["worker"])
    with Target() as target:
        admin.ok(
            "POST", f"{P}/queues/mixed/tasks", {"task": {"httpRequest": {"url": target.url()}}}
        )
        Api(fleet.base_url, keys["producer"]).ok("POST", "/queues/mixed/tasks", {"payload": 1})
        claimed = worker.ok(
            "POST", "/workers/claim", {"worker_id": "w", "queues": ["mixed"], "max_tasks": 10}
        )
        assert [t["payload"] for t in claimed["tasks"]] in ([1], [])
        wait_for(lambda: len(target.requests) == 1)
        assert Queue.objects.get(name="mixed").push is None


def test_oidc__each_attempt_carries_a_token_a_receiver_verifies(
    fleet: Service, keys: dict[str, str]
) -> None:
    """PyJWT's PyJWKClient verifies the token against /.well-known/jwks.json; the key
    the API published first is the one the push process signs with (one key, in Postgres)."""
    config = Api(fleet.base_url).ok("GET", "/.well-known/openid-configuration")
    issuer = f"http://127.0.0.1:{fleet.port}"
    assert config["issuer"] == issuer
    assert config["jwks_uri"] == f"{issuer}/.well-known/jwks.json"
    assert config["id_token_signing_alg_values_supported"] == ["RS256"]
    published = Api(fleet.base_url).ok("GET", "/.well-known/jwks.json")["keys"]
    assert [(k["kty"], k["alg"], k["use"]) for k in published] == [("RSA", "RS256", "sig")]

    admin = Api(fleet.base_url, keys["admin"])
    admin.ok("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/signed"})
    with Target() as target:
        for audience in ("", "https://receiver.example/"):
            token = {"serviceAccountEmail": "caller@example.iam.gserviceaccount.com"}
            if audience:
                token["audience"] = audience
            admin.ok(
                "POST",
                f"{P}/queues/signed/tasks",
                {
                    "task": {
                        "httpRequest": {
                            "url": target.url(f"/oidc/{len(audience)}"),
                            "headers": {"Authorization": "Bearer replaced"},
                            "oidcToken": token,
                        }
                    }
                },
            )
        wait_for(lambda: len(target.requests) == 2)
    jwks = jwt.PyJWKClient(f"{fleet.base_url}/.well-known/jwks.json")
    for request in target.requests:
        header = request.header("Authorization") or ""
        assert header.startswith("Bearer ") and header != "Bearer replaced"
        raw = header.removeprefix("Bearer ")
        audience = (
            target.url(request.path) if request.path == "/oidc/0" else "https://receiver.example/"
        )
        claims = jwt.decode(
            raw,
            jwks.get_signing_key_from_jwt(raw).key,
            algorithms=["RS256"],
            audience=audience,
            issuer=issuer,
        )
        assert claims["email"] == claims["sub"] == "caller@example.iam.gserviceaccount.com"
        assert claims["email_verified"] is True
        assert claims["exp"] - claims["iat"] == 3600
        assert jwt.get_unverified_header(raw)["kid"] == published[0]["kid"]
    assert SigningKey.objects.count() == 1


def test_delete__an_executing_task_is_cancelled_and_its_answer_discarded(
    fleet: Service, keys: dict[str, str]
) -> None:
    admin = Api(fleet.base_url, keys["admin"])
    producer = Api(fleet.base_url, keys["producer"])
    admin.ok("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/long"})
    with Target(lambda r: Answer(200, b'{"late": true}', delay=3)) as target:
        producer.ok(
            "POST",
            f"{P}/queues/long/tasks",
            {
                "task": {
                    "name": f"{P[4:]}/queues/long/tasks/l",
                    "httpRequest": {"url": target.url()},
                }
            },
        )
        wait_for(lambda: len(target.requests) == 1)
        assert Task.objects.get(name="l").status == S.EXECUTING
        producer.ok("DELETE", f"{P}/queues/long/tasks/l")
        status, _ = producer.call("GET", f"{P}/queues/long/tasks/l")
        assert status == 404
        time.sleep(4)  # the target has answered 200 meanwhile
    task = Task.objects.get(name="l")
    assert (task.status, task.result) == (S.CANCELLED, None)
    assert len(target.requests) == 1
    assert AuditEntry.objects.filter(action="task.cancel", target=str(task.pk)).exists()


def test_run_task__dispatches_at_once_in_a_paused_queue_and_a_later_schedule(
    fleet: Service, keys: dict[str, str]
) -> None:
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/held"})
    admin.ok("POST", f"{P}/queues/held:pause", {})
    with Target() as target:
        later = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 3600))
        admin.ok(
            "POST",
            f"{P}/queues/held/tasks",
            {
                "task": {
                    "name": f"{P[4:]}/queues/held/tasks/r",
                    "scheduleTime": later,
                    "httpRequest": {"url": target.url("/run")},
                }
            },
        )
        began = time.monotonic()
        ran = admin.ok("POST", f"{P}/queues/held/tasks/r:run", {})
        assert ran["dispatchCount"] == 1
        wait_for(lambda: len(target.requests) == 1, 10)
        assert time.monotonic() - began < 3
        assert target.requests[0].path == "/run"
    wait_for(lambda: Task.objects.filter(name="r", status=S.DONE).exists())
    assert AuditEntry.objects.filter(action="task.run", queue="held").count() == 1
    # A task made by the native API cannot be run over /v2.
    Api(fleet.base_url, keys["producer"]).ok("POST", "/queues/held/tasks", {"payload": 1})
    native = Task.objects.get(queue__name="held", name=None)
    status, answer = admin.call("POST", f"{P}/queues/held/tasks/{native.pk}:run", {})
    assert (status, answer["error"]["status"]) == (400, "FAILED_PRECONDITION")


def test_rate_and_concurrency__observed_at_the_target(fleet: Service, keys: dict[str, str]) -> None:
    """maxDispatchesPerSecond 2 (burst 2): over any span of the arrivals, at most
    2*T + 2 of them; maxConcurrentDispatches 2: never more than 2 in flight at once."""
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok(
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/paced", "rateLimits": {"maxDispatchesPerSecond": 2}},
    )
    admin.ok(
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/narrow", "rateLimits": {"maxConcurrentDispatches": 2}},
    )
    with Target() as fast, Target(lambda r: Answer(200, delay=0.5)) as slow:
        for _ in range(8):
            for queue, target in (("paced", fast), ("narrow", slow)):
                admin.ok(
                    "POST",
                    f"{P}/queues/{queue}/tasks",
                    {"task": {"httpRequest": {"url": target.url()}}},
                )
        wait_for(lambda: len(fast.requests) == len(slow.requests) == 8, 60)
        paced = sorted(r.at for r in fast.requests)
        for i, start in enumerate(paced):
            for j in range(i + 1, len(paced)):
                # Arrivals are measured at the target, after the pusher's request went
                # out: half a second of slack for a loaded machine delaying some requests
                # (3 arrivals within 0.39 s were seen, the first two late). Without the
                # rate, all 8 arrive at once; the span below checks the pace.
                assert j - i + 1 <= 2 * (paced[j] - start + 0.5) + 2, paced
        assert paced[-1] - paced[0] >= 2.5  # 8 tasks at 2/s after a burst of 2
        assert 1 <= slow.max_concurrent <= 2
