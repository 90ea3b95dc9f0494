"""Push delivery (API.md v1.1 "Push delivery"), against a real local HTTP target.

The push loop runs in a thread of the test process, on the real Postgres and
Redis; the target is `tests.pushtarget.Target`, a real HTTP server the test
scripts (statuses, delays, slow bodies, hang-ups).
"""

from __future__ import annotations

import email.utils
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.db import connection
from django.test import override_settings

from queues import push
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge import metrics
from taskforge_client.push import verify_signature
from tasks import events as task_events
from tasks import services
from tasks.dispatcher import DispatcherLoop
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import age_lease
from tests.pushtarget import Answer, Target
from workers import protocol
from workers.models import Worker
from workers.pusher import PushLoop
from workers.watchdog import WatchdogLoop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(90)]

S = TaskStatus


@pytest.fixture(autouse=True)
def loopback_allowed(settings: Any) -> None:
    """The targets here listen on 127.0.0.1, where push requests may not go by default
    (test_push_destinations.py keeps the default)."""
    settings.TASKFORGE_PUSH_ALLOWED_NETWORKS = "127.0.0.0/8"


@pytest.fixture
def target(redis_client: Any) -> Iterator[Target]:
    with Target() as server:
        yield server


@contextmanager
def pushing(capacity: int = 200) -> Iterator[PushLoop]:
    """A push process's loop, running in a thread until the block ends."""
    loop = PushLoop(capacity=capacity, name="test")

    def run() -> None:
        try:
            loop.run()
        finally:
            connection.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.stopping = True
        thread.join(timeout=15)
        assert not thread.is_alive()


def push_queue(target: Target, path: str = "/hook", **fields: Any) -> Queue:
    spec = {"url": target.url(path), "timeout_seconds": fields.pop("timeout_seconds", 5)}
    spec.update(fields.pop("push", {}))
    return QueueFactory(name=fields.pop("name", "hooks"), push=push.parse(spec).as_json(), **fields)


def enqueue(queue: Queue, *payloads: Any) -> list[str]:
    return [
        str(e.task.pk) for e in services.enqueue(queue, [services.TaskSpec(p) for p in payloads])
    ]


def wait_for(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def settled(ids: list[str], *statuses: str) -> Callable[[], bool]:
    return lambda: Task.objects.filter(pk__in=ids, status__in=statuses).count() == len(ids)


def retried(task_id: str) -> tuple[Task, float]:
    """A task that failed an attempt, and the seconds from that failure to its next attempt."""
    task = Task.objects.get(pk=task_id)
    failed_at = TaskEvent.objects.get(task_id=task_id, to_status=S.RETRY).at
    return task, (task.scheduled_at - failed_at).total_seconds()


def test_delivers_the_payload_with_the_documented_headers_and_signature(target: Target) -> None:
    queue = push_queue(
        target,
        push={
            "headers": {
                "Authorization": "Bearer t0ken",
                "X-Env": "a",
                "content-type": "text/plain",  # TaskForge's own headers win
                "TaskForge-Queue": "forged",
            }
        },
    )
    with override_settings(TASKFORGE_PUSH_SIGNING_SECRET="s3cret"), pushing() as loop:
        [task_id] = enqueue(queue, {"to": "ada@example.com", "n": [1, 2]})
        wait_for(settled([task_id], S.DONE))
    [request] = target.requests
    assert request.path == "/hook"
    assert request.json() == {"to": "ada@example.com", "n": [1, 2]}
    assert request.header("Content-Type") == "application/json"
    assert request.header("User-Agent") == "TaskForge-Push/1.1"
    assert request.header("TaskForge-Task-Id") == task_id
    assert request.header("TaskForge-Queue") == "hooks"
    assert request.header("TaskForge-Attempt") == "1"
    assert request.header("Authorization") == "Bearer t0ken"
    assert request.header("X-Env") == "a"
    signature = request.header("TaskForge-Signature")
    assert signature is not None and signature.startswith("t=")
    assert verify_signature("s3cret", signature, request.body, now=time.time())
    assert not verify_signature("other", signature, request.body, now=time.time())
    assert not verify_signature("s3cret", signature, request.body + b" ", now=time.time())

    task = Task.objects.get(pk=task_id)
    assert task.result == {"ok": True}
    assert task.attempts == 1
    assert task.claimed_by == loop.worker_id and loop.worker_id.startswith("push:")
    events = task_events.chain(task, 50)
    assert [(e.from_status, e.to_status) for e in events][-2:] == [
        ("claimed", "executing"),
        ("executing", "done"),
    ]
    assert {e.worker_id for e in events[-2:]} == {loop.worker_id}


def test_no_signature_header_without_a_secret(target: Target) -> None:
    queue = push_queue(target, push={"headers": {"TaskForge-Signature": "forged"}})
    with override_settings(TASKFORGE_PUSH_SIGNING_SECRET=""), pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.DONE))
    assert target.requests[0].header("TaskForge-Signature") is None


@pytest.mark.parametrize(
    ("answer", "result"),
    [
        (Answer(204), None),
        (Answer(200, b"plain text, not JSON"), None),
        (Answer(201, b"[1, 2, 3]", {"Content-Type": "text/plain"}), [1, 2, 3]),
        (Answer(200, b'{"a": 1, "a": 2}'), None),  # duplicate keys: not JSON TaskForge reads
    ],
)
def test_a_2xx_answer_is_done_with_a_json_body_as_result(
    target: Target, answer: Answer, result: Any
) -> None:
    target.script = lambda request: answer
    queue = push_queue(target)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.DONE))
    assert Task.objects.get(pk=ids[0]).result == result


def test_a_2xx_body_over_the_payload_limit_is_ignored(target: Target) -> None:
    big = b'["' + b"x" * 2000 + b'"]'
    target.script = lambda request: Answer(200, big)
    queue = push_queue(target)
    with override_settings(TASKFORGE_MAX_PAYLOAD_BYTES=1000), pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.DONE))
    assert Task.objects.get(pk=ids[0]).result is None


def test_another_status_is_a_failed_attempt_with_the_body_excerpt(target: Target) -> None:
    target.script = lambda request: Answer(500, b"E" * 700)
    queue = push_queue(target, max_retries=1)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    task = Task.objects.get(pk=ids[0])
    assert task.last_error == "HTTP 500: " + "E" * 500
    assert task.attempts == 1
    # The usual backoff (TASKFORGE_RETRY_BASE_MS 1000): 1..2 s after the failure.
    failed_at = TaskEvent.objects.get(task_id=ids[0], to_status=S.RETRY).at
    assert timedelta(seconds=1) <= task.scheduled_at - failed_at <= timedelta(seconds=2)


def test_out_of_attempts_is_dead(target: Target) -> None:
    target.script = lambda request: Answer(400, b"bad input")
    queue = push_queue(target, max_retries=0)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.DEAD))
    assert Task.objects.get(pk=ids[0]).last_error == "HTTP 400: bad input"


@pytest.mark.parametrize(
    ("status", "retry_after", "expected"),
    [
        (429, "120", 120),
        (503, "HTTPDATE+300", 300),
        (429, "999999", 86400),
    ],
)
def test_retry_after_of_a_429_or_503_replaces_the_backoff(
    target: Target, status: int, retry_after: str, expected: int
) -> None:
    if retry_after.startswith("HTTPDATE+"):
        when = datetime.now(UTC) + timedelta(seconds=int(retry_after.split("+")[1]))
        retry_after = email.utils.format_datetime(when, usegmt=True)
    target.script = lambda request: Answer(status, b"slow down", {"Retry-After": retry_after})
    queue = push_queue(target)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    task, delay = retried(ids[0])
    assert expected - 2 <= delay <= expected
    assert task.last_error == f"HTTP {status}: slow down"


@pytest.mark.parametrize("retry_after", ["soon", "HTTPDATE-300"])
def test_a_retry_after_that_is_no_delay_is_ignored_or_zero(
    target: Target, retry_after: str
) -> None:
    past = retry_after.startswith("HTTPDATE-")
    if past:
        when = datetime.now(UTC) - timedelta(seconds=300)
        retry_after = email.utils.format_datetime(when, usegmt=True)
    target.script = lambda request: Answer(503, b"busy", {"Retry-After": retry_after})
    queue = push_queue(target)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    _, delay = retried(ids[0])
    if past:
        assert delay == 0
    else:  # the usual backoff: 1..2 s after the first failure
        assert 1 <= delay <= 2


def test_a_push_process_is_listed_among_the_workers(target: Target, admin_client: Any) -> None:
    with pushing() as loop:
        wait_for(lambda: Worker.objects.filter(worker_id=loop.worker_id).exists())
        listed = admin_client.get("/workers").json()
    rows = listed["results"] if isinstance(listed, dict) else listed
    assert loop.worker_id in [row["worker_id"] for row in rows]


def test_a_redirect_is_not_followed(target: Target) -> None:
    target.script = lambda request: (
        Answer(302, headers={"Location": target.url("/elsewhere")})
        if request.path == "/hook"
        else Answer(200)
    )
    queue = push_queue(target)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    assert [r.path for r in target.requests] == ["/hook"]
    error = Task.objects.get(pk=ids[0]).last_error
    assert error is not None and error.startswith("HTTP 302: redirect to ")


def test_no_answer_within_the_timeout_is_a_failed_attempt(target: Target) -> None:
    target.script = lambda request: Answer(200, delay=3)
    queue = push_queue(target, timeout_seconds=1)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        began = time.monotonic()
        wait_for(settled(ids, S.RETRY))
        assert time.monotonic() - began < 2.5
    assert Task.objects.get(pk=ids[0]).last_error == "timeout after 1 s"


def test_a_2xx_whose_body_comes_too_slowly_is_done_without_a_result(target: Target) -> None:
    target.script = lambda request: Answer(200, b'{"slow": true}', trickle=0.2)
    queue = push_queue(target, timeout_seconds=1)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.DONE))
    assert Task.objects.get(pk=ids[0]).result is None


def test_a_hang_up_is_a_failed_attempt(target: Target) -> None:
    target.script = lambda request: Answer(hang_up=True)
    queue = push_queue(target)
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    error = Task.objects.get(pk=ids[0]).last_error
    assert error == "connection closed by the target before it answered"


def test_a_refused_connection_is_a_failed_attempt(target: Target) -> None:
    queue = QueueFactory(
        name="nowhere", push=push.parse({"url": "http://127.0.0.1:9/hook"}).as_json()
    )
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    error = Task.objects.get(pk=ids[0]).last_error
    assert error is not None and error.startswith("connection failed: ")


def test_a_tls_failure_is_a_failed_attempt(target: Target) -> None:
    # https:// to a server that speaks plain HTTP: the TLS handshake fails.
    queue = QueueFactory(
        name="tls", push=push.parse({"url": f"https://127.0.0.1:{target.port}/"}).as_json()
    )
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, S.RETRY))
    error = Task.objects.get(pk=ids[0]).last_error
    assert error is not None and error.startswith("TLS error: "), error


def test_one_process_keeps_at_least_100_requests_in_flight(target: Target) -> None:
    target.script = lambda request: Answer(200, delay=1.0)
    queue = push_queue(target)
    with pushing(capacity=200):
        ids = enqueue(queue, *({"n": n} for n in range(150)))
        began = time.monotonic()
        wait_for(settled(ids, S.DONE), timeout=30)
        took = time.monotonic() - began
    assert target.max_concurrent >= 100
    assert took < 8, took  # 150 one-second requests, one process: not one after another


def test_the_in_flight_capacity_is_a_bound(target: Target) -> None:
    target.script = lambda request: Answer(200, delay=0.3)
    queue = push_queue(target)
    with pushing(capacity=4):
        ids = enqueue(queue, *({"n": n} for n in range(12)))
        wait_for(settled(ids, S.DONE), timeout=30)
    assert target.max_concurrent == 4


def test_max_concurrency_holds_across_push_processes(target: Target) -> None:
    target.script = lambda request: Answer(200, delay=0.2)
    queue = push_queue(target, max_concurrency=3)
    with pushing(), pushing():
        ids = enqueue(queue, *({"n": n} for n in range(15)))
        wait_for(settled(ids, S.DONE), timeout=30)
    assert target.max_concurrent <= 3
    assert len(target.requests) == 15


def test_the_rate_limit_holds(target: Target) -> None:
    queue = push_queue(target, rate_limit=5)
    with pushing():
        ids = enqueue(queue, *({"n": n} for n in range(12)))
        wait_for(settled(ids, S.DONE), timeout=30)
    times = sorted(r.at for r in target.requests)
    # API.md: over any interval of T seconds at most R*T + R tasks.
    for i, start in enumerate(times):
        within_1s = [t for t in times[i:] if t - start <= 1.0]
        assert len(within_1s) <= 10


def test_order_within_a_queue_is_priority_then_time(target: Target) -> None:
    queue = push_queue(target, paused=True)
    specs = [services.TaskSpec({"p": p}, priority=p) for p in (5, 1, 9, 3)]
    services.enqueue(queue, specs)
    with pushing(capacity=1):
        Queue.objects.filter(pk=queue.pk).update(paused=False)
        DispatcherLoop().tick()
        wait_for(lambda: len(target.requests) == 4, timeout=20)
    assert [r.json()["p"] for r in target.requests] == [1, 3, 5, 9]


def test_a_paused_queue_sends_nothing(target: Target) -> None:
    queue = push_queue(target, paused=True)
    with pushing():
        enqueue(queue, {"n": 1})
        time.sleep(1.5)
    assert target.requests == []


def test_claims_never_get_a_push_queues_tasks(target: Target) -> None:
    queue = push_queue(target)
    enqueue(queue, {"n": 1})
    claimed = protocol.claim(protocol.ClaimRequest("w1", [queue.name], max_tasks=5))
    assert claimed == []


def test_the_lease_lasts_the_timeout_longer_than_a_workers(target: Target) -> None:
    release = threading.Event()
    target.script = lambda request: (release.wait(10), Answer(200))[1]
    queue = push_queue(target, timeout_seconds=120)
    try:
        with pushing():
            ids = enqueue(queue, {"n": 1})
            wait_for(lambda: len(target.requests) == 1)
            task = Task.objects.get(pk=ids[0])
            assert task.status == S.EXECUTING
            assert task.claimed_at is not None and task.heartbeat_at is not None
            assert task.heartbeat_at - task.claimed_at == timedelta(seconds=120)
            release.set()
            wait_for(settled(ids, S.DONE))
    finally:
        release.set()


def test_an_answer_after_the_lease_was_reclaimed_changes_nothing(target: Target) -> None:
    release = threading.Event()
    target.script = lambda request: (release.wait(10), Answer(200, b'{"late": 1}'))[1]
    queue = push_queue(target, max_retries=3)
    try:
        with pushing():
            ids = enqueue(queue, {"n": 1})
            wait_for(lambda: len(target.requests) == 1)
            # The watchdog reclaimed the lease meanwhile (a failed attempt).
            age_lease(ids[0], 3600)
            WatchdogLoop().expire_leases()
            release.set()
            time.sleep(1.0)
    finally:
        release.set()
    task = Task.objects.get(pk=ids[0])
    assert task.status == S.RETRY and task.result is None


def test_requests_are_counted_in_the_metrics(target: Target) -> None:
    target.script = lambda request: Answer(500) if request.json()["n"] else Answer(200)
    queue = push_queue(target, name="counted")
    before = _samples()
    with pushing():
        ids = enqueue(queue, {"n": 0}, {"n": 1})
        wait_for(lambda: Task.objects.filter(pk__in=ids, status__in=[S.DONE, S.RETRY]).count() == 2)
    after = _samples()
    for outcome in ("success", "http_error"):
        key = ("taskforge_push_requests_total", (("outcome", outcome), ("queue", "counted")))
        assert after.get(key, 0) - before.get(key, 0) == 1
    count = ("taskforge_push_request_duration_seconds_count", (("queue", "counted"),))
    assert after.get(count, 0) - before.get(count, 0) == 2


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in metrics.counted_collector().collect():
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def test_stopping_with_requests_in_flight_ends_within_the_bound(redis_client: Any) -> None:
    """In-flight requests are waited for briefly, then left to the lease (API.md: a
    loop exits within max(tick, 1 s) + 2 s)."""
    release = threading.Event()
    with Target(lambda request: (release.wait(20), Answer(200))[1]) as target:
        queue = push_queue(target)
        try:
            with pushing() as loop:
                ids = enqueue(queue, {"n": 1})
                wait_for(lambda: len(target.requests) == 1)
                began = time.monotonic()
                loop.stopping = True
            assert time.monotonic() - began < 3.0
        finally:
            release.set()
    assert Task.objects.get(pk=ids[0]).status == S.EXECUTING  # left to its lease


def test_a_waiting_claim_skips_a_queue_given_a_push_target_meanwhile(target: Target) -> None:
    queue = QueueFactory(name="turning")
    got: list[Any] = []
    claim = threading.Thread(
        target=lambda: got.extend(
            protocol.claim(protocol.ClaimRequest("w1", ["turning"], wait_seconds=4))
        )
    )
    claim.start()
    time.sleep(0.3)
    Queue.objects.filter(pk=queue.pk).update(push=push.parse({"url": target.url()}).as_json())
    time.sleep(1.5)  # queue rows are remembered for a second (queues.lookup)
    ids = enqueue(Queue.objects.get(pk=queue.pk), {"n": 1})
    claim.join(10)
    connection.close()
    assert got == []
    assert Task.objects.get(pk=ids[0]).status == S.CLAIMED  # left for a push process
