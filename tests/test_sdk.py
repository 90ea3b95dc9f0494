"""The Python SDK (`taskforge_client`) against a real TaskForge.

One service (gunicorn + the three loops, tests/service.py, with its fast knobs: 2 s leases,
50 ms retry base) serves the whole module; each test uses queues and keys of its own.
Workers run in threads of the test or, where signals matter, as subprocesses
(`python -m taskforge_client.worker tests.sdk_handlers:...`).
"""

from __future__ import annotations

import contextlib
import http.server
import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from taskforge_client import (
    Conflict,
    ConnectionFailed,
    Forbidden,
    Invalid,
    LeaseLost,
    NotFound,
    Task,
    TaskForge,
    TaskForgeError,
    TaskSpec,
    Unauthorized,
    Unavailable,
    Worker,
)
from taskforge_client.cli import main as cli_main
from tests import sdk_handlers
from tests.service import ROOT, Keys, Service, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


# -- fixtures --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory, django_db_setup: None) -> Iterator[Service]:
    svc = Service(
        tmp_path_factory.mktemp("sdk-service"),
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "sdk-secret-key",
        },
    )
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()


@pytest.fixture
def keys(service: Service) -> Keys:
    return Keys("sdk")


@pytest.fixture
def admin(service: Service, keys: Keys) -> Iterator[TaskForge]:
    with TaskForge(service.base_url, keys.admin) as client:
        yield client


@pytest.fixture
def producer(service: Service, keys: Keys) -> Iterator[TaskForge]:
    with TaskForge(service.base_url, keys.producer) as client:
        yield client


def qname() -> str:
    return f"sdk-{uuid.uuid4().hex[:10]}"


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@contextlib.contextmanager
def running_worker(
    service: Service, key: str, queue: str, handler: Callable[[Any], Any], **kwargs: Any
) -> Iterator[Worker]:
    worker = Worker(
        service.base_url,
        key,
        queues=[queue],
        handler=handler,
        wait_seconds=kwargs.pop("wait_seconds", 1.0),
        grace_seconds=kwargs.pop("grace_seconds", 5.0),
        **kwargs,
    )
    thread = threading.Thread(target=lambda: worker.run(install_signal_handlers=False))
    thread.start()
    try:
        yield worker
    finally:
        worker.stop()
        thread.join(timeout=10)
        assert not thread.is_alive(), "worker did not stop"


def spawn_worker(
    service: Service, key: str, queue: str, handler: str, worker_id: str, log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "taskforge_client.worker",
                handler,
                "--queue",
                queue,
                "--concurrency",
                "2",
                "--worker-id",
                worker_id,
                "--grace-seconds",
                "10",
                "--wait-seconds",
                "1",
                "--url",
                service.base_url,
            ],
            cwd=ROOT,
            env={"TASKFORGE_API_KEY": key, "PATH": "/usr/bin:/bin", "PYTHONUNBUFFERED": "1"},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


# -- the client ------------------------------------------------------------------------------


def test_client_round_trip(admin: TaskForge, producer: TaskForge, keys: Keys, service: Service):
    name = qname()
    queue = admin.create_queue(name, max_retries=0)
    assert (queue.name, queue.max_retries, queue.paused) == (name, 0, False)
    assert isinstance(queue.created_at, datetime) and queue.created_at.tzinfo is not None
    with pytest.raises(Conflict) as exists:
        admin.create_queue(name)
    assert (exists.value.code, exists.value.status) == ("queue_exists", 409)
    assert name in [q.name for q in producer.list_queues(limit=None)]
    assert admin.pause_queue(name).paused and not admin.resume_queue(name).paused
    assert admin.update_queue(name, rate_limit=50).rate_limit == 50
    assert admin.update_queue(name, rate_limit=None).rate_limit is None
    assert admin.update_queue(name, max_concurrency=3).max_concurrency == 3
    assert admin.get_queue(name).max_concurrency == 3
    assert admin.update_queue(name, max_retries=0).max_concurrency == 3  # left as it was
    assert admin.update_queue(name, max_concurrency=None).max_concurrency is None
    capped = admin.create_queue(qname(), max_concurrency=7, rate_limit=5)
    assert (capped.max_concurrency, capped.rate_limit) == (7, 5)
    slow = admin.create_queue(qname(), rate_limit=2, retry_policy={"max_backoff_seconds": 30})
    assert slow.retry_policy is not None and slow.retry_policy["max_backoff_seconds"] == 30
    assert admin.update_queue(slow.name, max_retries=2).retry_policy == slow.retry_policy
    assert admin.update_queue(slow.name, retry_policy=None).retry_policy is None
    hook = {"url": "https://hooks.example.com/t", "headers": {"Authorization": "Bearer x"}}
    pushed = admin.create_queue(qname(), push=hook)
    assert pushed.push == {**hook, "timeout_seconds": 30}
    assert producer.get_queue(pushed.name).push == {
        "url": hook["url"],
        "timeout_seconds": 30,
        "headers": {"Authorization": "[redacted]"},
    }
    assert admin.update_queue(pushed.name, push={"url": "http://b.example/"}).push == {
        "url": "http://b.example/",
        "timeout_seconds": 30,
        "headers": {},
    }
    assert admin.update_queue(pushed.name, max_retries=1).push is not None  # left as it was
    assert admin.update_queue(pushed.name, push=None).push is None
    with pytest.raises(Invalid):
        admin.create_queue(qname(), push={"url": "ftp://x"})

    # Enqueue: single, with a key (idempotent), delay, at, batch.
    task = producer.enqueue(name, {"n": 1}, priority=2)
    assert (task.status, task.priority, task.payload, task.queue) == ("pending", 2, {"n": 1}, name)
    keyed = producer.enqueue(name, {"n": 2}, idempotency_key="k-1", max_retries=4)
    again = producer.enqueue(name, {"n": 2}, idempotency_key="k-1")
    assert again.id == keyed.id and keyed.max_retries == 4
    later = producer.enqueue(name, "later", delay=timedelta(hours=1))
    assert later.scheduled_at is not None
    assert later.scheduled_at > datetime.now(UTC) + timedelta(minutes=59)
    at = datetime.now(UTC) + timedelta(days=1)
    dated = producer.enqueue(name, [1, 2], at=at)
    assert dated.scheduled_at is not None and abs((dated.scheduled_at - at).total_seconds()) < 1
    batch = producer.enqueue_many(
        name, [TaskSpec({"b": 0}), {"payload": {"b": 1}, "priority": 9, "delay": 3600}]
    )
    assert [t.payload for t in batch] == [{"b": 0}, {"b": 1}] and batch[1].priority == 9

    # Read back.
    got = producer.get_task(name, task.id)
    assert got.id == task.id and got.created_at == task.created_at
    listed = producer.list_tasks(name, limit=None)
    assert {t.id for t in listed} >= {task.id, keyed.id, later.id, dated.id}
    assert len(producer.list_tasks(name, limit=2)) == 2
    assert producer.task_events(name, task.id)[0].to_status == "pending"
    stats = producer.stats(name)
    assert stats.queue == name and stats.depth.scheduled >= 3 and stats.dlq_depth == 0

    # Cancel: once, then invalid_state.
    assert producer.cancel_task(name, later.id).status == "cancelled"
    with pytest.raises(Conflict) as state:
        producer.cancel_task(name, later.id)
    assert state.value.code == "invalid_state"

    # Errors carry code, status, message and fields.
    with pytest.raises(NotFound) as missing:
        producer.get_task(name, str(uuid.uuid4()))
    assert (missing.value.code, missing.value.status) == ("not_found", 404)
    with pytest.raises(Invalid) as invalid:
        producer.enqueue(name, {"x": 1}, priority=11)
    assert invalid.value.code == "invalid" and "priority" in invalid.value.fields
    with pytest.raises(Forbidden):
        producer.create_queue(qname())
    with (
        TaskForge(service.base_url, "tf_nope", retries=0) as anonymous,
        pytest.raises(Unauthorized) as unauth,
    ):
        anonymous.list_queues()
    assert unauth.value.code == "unauthenticated"

    # The worker protocol by hand: claim, lease_lost, nack -> DLQ, replay, discard.
    with TaskForge(service.base_url, keys.worker) as worker:
        admin.pause_queue(name)
        solo = qname()
        admin.create_queue(solo, max_retries=0)
        dead = producer.enqueue(solo, {"die": True})
        claimed = wait_for(
            lambda: worker.claim("w-1", [solo], max_tasks=5, wait_seconds=2), 10, "a claim"
        )
        assert [t.id for t in claimed] == [dead.id] and claimed[0].lease_expires_at is not None
        with pytest.raises(LeaseLost) as lost:
            worker.ack("w-2", dead.id)
        assert (lost.value.code, lost.value.status) == ("lease_lost", 409)
        beat = worker.heartbeat_batch("w-1", [(dead.id, 1), (str(uuid.uuid4()), None)])
        assert beat[0].ok and beat[0].lease_expires_at is not None and not beat[1].ok
        assert worker.nack("w-1", dead.id, "no", attempt=1).status == "dead"
    entries = admin.dlq(solo)
    assert [(d.id, d.last_error, d.attempts) for d in entries] == [(dead.id, "no", 1)]
    assert admin.replay(solo, dead.id).status == "pending"
    with pytest.raises(NotFound):
        admin.replay(solo, dead.id)  # not dead any more
    assert admin.replay_many(solo, [dead.id]) == 0
    assert admin.replay_all(solo) == 0
    admin.cancel_task(solo, dead.id)
    with pytest.raises(NotFound):
        admin.discard(solo, dead.id)


def test_client__schedules(admin: TaskForge, service: Service) -> None:
    name = qname()
    admin.create_queue(name)
    made = admin.create_schedule(
        name, "nightly", "0 3 * * *", {"kind": "nightly"}, timezone="Europe/Paris", priority=2
    )
    assert (made.queue, made.name, made.cron, made.timezone, made.priority) == (
        name,
        "nightly",
        "0 3 * * *",
        "Europe/Paris",
        2,
    )
    assert made.next_run_at is not None and made.last_run_at is None and not made.paused
    with pytest.raises(Conflict) as exists:
        admin.create_schedule(name, "nightly", "@daily", 1)
    assert exists.value.code == "schedule_exists"
    with pytest.raises(Invalid):
        admin.create_schedule(name, "bad", "0 0 * * * *", 1)
    assert admin.pause_schedule(name, "nightly").paused is True
    assert admin.resume_schedule(name, "nightly").paused is False
    changed = admin.update_schedule(name, "nightly", cron="@hourly", payload=[1], max_retries=None)
    assert (changed.cron, changed.payload, changed.max_retries) == ("@hourly", [1], None)
    assert [s.name for s in admin.list_schedules(name)] == ["nightly"]
    assert admin.get_schedule(name, "nightly").id == made.id
    admin.delete_schedule(name, "nightly")
    with pytest.raises(NotFound):
        admin.get_schedule(name, "nightly")


def test_cli__schedules(
    admin: TaskForge, keys: Keys, service: Service, capsys: pytest.CaptureFixture[str]
) -> None:
    name = qname()
    admin.create_queue(name)
    base = ["--url", service.base_url, "--api-key", keys.admin, "schedules"]
    assert cli_main([*base, "create", name, "every", "*/5 * * * *", '{"a": 1}', "--paused"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert (created["cron"], created["payload"], created["paused"]) == (
        "*/5 * * * *",
        {"a": 1},
        True,
    )
    assert cli_main([*base, "resume", name, "every"]) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is False
    assert cli_main([*base, "update", name, "every", "--cron", "@daily", "--priority", "1"]) == 0
    assert json.loads(capsys.readouterr().out)["cron"] == "@daily"
    assert cli_main([*base, "list", name]) == 0
    assert [s["name"] for s in json.loads(capsys.readouterr().out)["results"]] == ["every"]
    assert cli_main([*base, "show", name, "every"]) == 0
    assert json.loads(capsys.readouterr().out)["priority"] == 1
    assert cli_main([*base, "delete", name, "every"]) == 0
    assert json.loads(capsys.readouterr().out) == {"deleted": True}
    assert cli_main([*base, "show", name, "every"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"


def test_cli__queues(keys: Keys, service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    name = qname()
    base = ["--url", service.base_url, "--api-key", keys.admin, "queues"]
    assert cli_main([*base, "create", name, "--max-concurrency", "10", "--max-retries", "2"]) == 0
    created = json.loads(capsys.readouterr().out)
    assert (created["name"], created["max_concurrency"], created["max_retries"]) == (name, 10, 2)
    assert cli_main([*base, "pause", name]) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is True
    assert cli_main([*base, "resume", name]) == 0
    assert json.loads(capsys.readouterr().out)["paused"] is False
    assert cli_main([*base, "update", name, "--max-concurrency", "none", "--rate-limit", "4"]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert (changed["max_concurrency"], changed["rate_limit"], changed["max_retries"]) == (
        None,
        4,
        2,
    )
    assert cli_main([*base, "show", name]) == 0
    assert json.loads(capsys.readouterr().out)["rate_limit"] == 4
    assert cli_main([*base, "list"]) == 0
    assert name in [q["name"] for q in json.loads(capsys.readouterr().out)["results"]]
    assert cli_main([*base, "create", name]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "queue_exists"
    assert cli_main([*base, "update", name, "--max-concurrency", "0"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["fields"].keys() == {"max_concurrency"}

    # A retry policy (v1.2), set and removed.
    policy = '{"min_backoff_seconds": 1, "max_backoff_seconds": 60, "max_doublings": 3}'
    assert cli_main([*base, "update", name, "--retry-policy", policy]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert changed["retry_policy"] == {
        "min_backoff_seconds": 1,
        "max_backoff_seconds": 60,
        "max_doublings": 3,
        "max_retry_duration_seconds": 0,
    }
    assert cli_main([*base, "update", name, "--retry-policy", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["retry_policy"] is None
    assert cli_main([*base, "update", name, "--retry-policy", '{"max_doublings": 99}']) == 1
    assert "retry_policy" in json.loads(capsys.readouterr().err)["error"]["fields"]
    with pytest.raises(SystemExit):
        cli_main([*base, "update", name, "--retry-policy", "[1]"])
    assert "not a JSON object" in capsys.readouterr().err


def test_cli__push_queues(keys: Keys, service: Service, capsys: pytest.CaptureFixture[str]) -> None:
    name = qname()
    base = ["--url", service.base_url, "--api-key", keys.admin, "queues"]
    hook = "https://hooks.example.com/t"
    argv = [*base, "create", name, "--push-url", hook, "--push-timeout", "5"]
    assert cli_main([*argv, "--push-header", "Authorization: Bearer x"]) == 0
    assert json.loads(capsys.readouterr().out)["push"] == {
        "url": hook,
        "timeout_seconds": 5,
        "headers": {"Authorization": "Bearer x"},
    }
    assert cli_main([*base, "update", name, "--push-url", "http://b.example/"]) == 0
    assert json.loads(capsys.readouterr().out)["push"] == {
        "url": "http://b.example/",
        "timeout_seconds": 30,
        "headers": {},
    }
    assert cli_main([*base, "update", name, "--push-url", "none"]) == 0
    assert json.loads(capsys.readouterr().out)["push"] is None
    assert cli_main([*base, "update", name, "--push-url", "ftp://x"]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["fields"].keys() == {"push"}
    with pytest.raises(SystemExit) as usage:
        cli_main([*base, "update", name, "--push-timeout", "5"])
    assert usage.value.code == 2


def test_cli__task_cancel_and_dlq_discard(
    admin: TaskForge,
    producer: TaskForge,
    keys: Keys,
    service: Service,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = qname()
    admin.create_queue(name, max_retries=0)
    base = ["--url", service.base_url, "--api-key", keys.producer]
    later = producer.enqueue(name, {"n": 1}, delay=3600)
    assert cli_main([*base, "task", "cancel", name, later.id]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert cli_main([*base, "task", "show", name, later.id]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "cancelled"
    assert cli_main([*base, "task", "cancel", name, later.id]) == 1  # cancelled already
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid_state"
    assert cli_main([*base, "task", "cancel", name, str(uuid.uuid4())]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"
    # Usage errors exit 2 before any request: the queue left out, --events with cancel.
    for words in (["cancel", later.id], ["cancel", name, later.id, "--events"], [name]):
        with pytest.raises(SystemExit) as usage:
            cli_main([*base, "task", *words])
        assert usage.value.code == 2
    capsys.readouterr()

    # A dead task: discarded for good; a second discard, or a live task, is not_found.
    dead = producer.enqueue(name, {"die": True})
    with TaskForge(service.base_url, keys.worker) as worker:
        wait_for(lambda: worker.claim("w-cli", [name], wait_seconds=2), 10, "a claim")
        assert worker.nack("w-cli", dead.id, "no", attempt=1).status == "dead"
    live = producer.enqueue(name, {"n": 2}, delay=3600)
    base = ["--url", service.base_url, "--api-key", keys.admin]
    assert cli_main([*base, "dlq", "discard", name, live.id]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"
    assert cli_main([*base, "dlq", "discard", name, dead.id]) == 0
    assert json.loads(capsys.readouterr().out) == {"discarded": True}
    assert admin.dlq(name) == []
    assert cli_main([*base, "task", name, dead.id]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"
    assert cli_main([*base, "dlq", "discard", name, dead.id]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"
    # Discarding is an admin's: a producer key gets forbidden.
    producer_base = ["--url", service.base_url, "--api-key", keys.producer]
    assert cli_main([*producer_base, "dlq", "discard", name, live.id]) == 1
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "forbidden"


def test_cli(admin: TaskForge, keys: Keys, service: Service, capsys: pytest.CaptureFixture[str]):
    name = qname()
    admin.create_queue(name, max_retries=0)
    base = ["--url", service.base_url, "--api-key", keys.admin]
    assert cli_main([*base, "enqueue", name, '{"a": 1}', "--priority", "3", "--delay", "60"]) == 0
    task = json.loads(capsys.readouterr().out)
    assert (task["payload"], task["priority"]) == ({"a": 1}, 3)
    assert cli_main([*base, "task", name, task["id"]]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == task["id"]
    assert cli_main([*base, "stats", name]) == 0
    assert json.loads(capsys.readouterr().out)["depth"]["scheduled"] == 1
    assert cli_main([*base, "queues"]) == 0
    assert name in [q["name"] for q in json.loads(capsys.readouterr().out)["results"]]
    assert cli_main([*base, "dlq", "list", name]) == 0
    assert json.loads(capsys.readouterr().out) == {"results": []}
    assert cli_main([*base, "dlq", "replay", name, "--all"]) == 0
    assert json.loads(capsys.readouterr().out) == {"replayed": 0}
    # An API error: exit 1, the error on stderr.
    assert cli_main([*base, "task", name, str(uuid.uuid4())]) == 1
    err = capsys.readouterr().err
    assert json.loads(err)["error"]["code"] == "not_found"
    # The console script exists and exits nonzero on an error too.
    script = Path(sys.executable).parent / "taskforge"
    done = subprocess.run(
        [str(script), *base, "stats", "no-such-queue"], capture_output=True, timeout=30
    )
    assert done.returncode == 1 and b'"not_found"' in done.stderr


# -- retry policy ----------------------------------------------------------------------------


class _Always503(http.server.BaseHTTPRequestHandler):
    hits: list[str] = []

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        type(self).hits.append(f"{self.command} {self.path}")
        body = json.dumps({"error": {"code": "unavailable", "message": "db down"}}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_DELETE = _answer

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_retry_policy_on_503() -> None:
    """503 is retried for idempotent calls only (a stdlib server that always answers 503)."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Always503)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    client = TaskForge(url, "k", retries=2, backoff_base=0.01)
    cases: list[tuple[Callable[[], Any], int]] = [
        (lambda: client.get_task("q", "1"), 3),
        (lambda: client.enqueue("q", {"x": 1}), 1),  # no key: never repeated
        (lambda: client.enqueue("q", {"x": 1}, idempotency_key="a"), 3),
        (lambda: client.enqueue_many("q", [TaskSpec(1, idempotency_key="a"), TaskSpec(2)]), 1),
        (lambda: client.cancel_task("q", "1"), 3),
        (lambda: client.ack("w", "1", 1), 3),
        (lambda: client.heartbeat("w", "1", 1), 3),
        (lambda: client.nack("w", "1", "e", attempt=1), 1),
        (lambda: client.claim("w", ["q"]), 1),
        (lambda: client.replay_all("q"), 1),
    ]
    try:
        for call, expected in cases:
            _Always503.hits.clear()
            with pytest.raises(Unavailable) as exc:
                call()
            assert exc.value.code == "unavailable" and exc.value.status == 503
            assert len(_Always503.hits) == expected, _Always503.hits
    finally:
        client.close()
        server.shutdown()
        server.server_close()


def test_retry_policy_on_network_errors() -> None:
    """A refused connection: idempotent calls try 1 + retries times, the others once."""
    with socketless_port() as port:
        client = TaskForge(f"http://127.0.0.1:{port}", "k", retries=2, backoff_base=0.01)
        cases: list[tuple[Callable[[], Any], int]] = [
            (lambda: client.stats("q"), 3),
            (lambda: client.enqueue("q", 1), 1),
            (lambda: client.enqueue("q", 1, idempotency_key="x"), 3),
            (lambda: client.claim("w", ["q"], wait_seconds=1), 1),
        ]
        for call, expected in cases:
            before = client.requests_sent
            with pytest.raises(ConnectionFailed) as exc:
                call()
            assert exc.value.code == "connection_error" and exc.value.status is None
            assert client.requests_sent - before == expected


@contextlib.contextmanager
def socketless_port() -> Iterator[int]:
    from tests.service import free_port

    yield free_port()


def test_naive_datetime_refused(producer: TaskForge) -> None:
    with pytest.raises(ValueError):
        producer.enqueue("q", 1, at=datetime(2030, 1, 1))
    with pytest.raises(ValueError):
        producer.enqueue("q", None)


# -- the worker ------------------------------------------------------------------------------


def test_worker_processes_tasks(admin: TaskForge, producer: TaskForge, keys: Keys, service):
    name = qname()
    admin.create_queue(name)
    tasks = producer.enqueue_many(name, [TaskSpec({"n": n}) for n in range(12)])
    with running_worker(service, keys.worker, name, sdk_handlers.double, concurrency=4) as w:
        wait_for(lambda: w.processed == 12, 20, "12 tasks acked")
    for t in tasks:
        done = producer.get_task(name, t.id)
        assert done.status == "done" and done.result == {"doubled": t.payload["n"] * 2}
        assert done.claimed_by == w.worker_id and done.finished_at is not None


def test_failures_retry_then_dlq(admin: TaskForge, producer: TaskForge, keys: Keys, service):
    name = qname()
    admin.create_queue(name, max_retries=1)
    crash = producer.enqueue(name, {"kind": "crash"})
    permanent = producer.enqueue(name, {"kind": "permanent"})
    later = producer.enqueue(name, {"kind": "retry_after"})
    with running_worker(service, keys.worker, name, sdk_handlers.by_kind, concurrency=3):
        wait_for(
            lambda: (
                {producer.get_task(name, t.id).status for t in (crash, permanent, later)}
                == {"dead", "done"}
            ),
            20,
            "the three tasks to finish",
        )
    crashed = producer.get_task(name, crash.id)
    assert crashed.status == "dead" and crashed.attempts == 2  # max_retries 1: two attempts
    assert crashed.last_error is not None and "ValueError: boom on attempt 2" in crashed.last_error
    perm = producer.get_task(name, permanent.id)
    assert perm.status == "dead" and perm.attempts == 1
    assert perm.last_error is not None and "Permanent: this payload" in perm.last_error
    retried = producer.get_task(name, later.id)
    assert retried.status == "done" and retried.attempts == 2
    events = producer.task_events(name, later.id)
    failed_at = next(e.at for e in events if e.to_status == "retry")
    next_claim = [e.at for e in events if e.to_status == "executing"][1]
    assert failed_at is not None and next_claim is not None
    assert (next_claim - failed_at).total_seconds() >= 0.45  # RetryAfter(0.5), not 50 ms
    assert {d.id for d in admin.dlq(name)} == {crash.id, permanent.id}


def test_sigterm_drains(admin: TaskForge, producer: TaskForge, keys: Keys, service, tmp_path):
    name = qname()
    admin.create_queue(name)
    task = producer.enqueue(name, {"sleep": 3})  # longer than the 2 s lease: heartbeats needed
    log = tmp_path / "worker.log"
    proc = spawn_worker(service, keys.worker, name, "tests.sdk_handlers:slow", "sigterm-w", log)
    try:
        wait_for(lambda: producer.get_task(name, task.id).status == "executing", 15, "task running")
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log.read_text()
    assert code == 0, output
    done = producer.get_task(name, task.id)
    assert done.status == "done" and done.attempts == 1, output
    assert done.result == {"slept": 3, "attempt": 1}
    assert "got SIGTERM" in output and "stopped: 1 done" in output


def test_killed_worker_task_is_reclaimed(admin, producer, keys: Keys, service, tmp_path):
    name = qname()
    admin.create_queue(name)
    task = producer.enqueue(name, {"sleep": 60})
    proc = spawn_worker(
        service, keys.worker, name, "tests.sdk_handlers:slow", "doomed-w", tmp_path / "w.log"
    )
    try:
        wait_for(lambda: producer.get_task(name, task.id).claimed_by == "doomed-w", 15, "claimed")
    finally:
        proc.kill()
        proc.wait()
    began = time.monotonic()

    def quick(t: Any) -> Any:
        return {"reclaimed": t.attempts}

    with running_worker(service, keys.worker, name, quick, worker_id="rescuer-w") as w:
        wait_for(lambda: w.processed == 1, 20, "the reclaimed task acked")
    done = producer.get_task(name, task.id)
    assert (done.status, done.claimed_by, done.attempts) == ("done", "rescuer-w", 2)
    assert done.result == {"reclaimed": 2}
    assert done.last_error is not None and "lease" in done.last_error
    assert time.monotonic() - began < 15


def test_grace_period_exceeded_nacks(admin: TaskForge, producer: TaskForge, keys: Keys, service):
    """A handler still running when the grace period ends: its task is nacked for a retry."""
    name = qname()
    admin.create_queue(name, max_retries=3)
    task = producer.enqueue(name, {"sleep": 4})
    with running_worker(service, keys.worker, name, sdk_handlers.slow, grace_seconds=0.5):
        wait_for(lambda: producer.get_task(name, task.id).status == "executing", 10, "running")
    after = producer.get_task(name, task.id)
    assert after.status in ("retry", "pending", "claimed") and after.attempts == 1
    assert after.last_error == "worker shut down before the handler finished"


def test_worker_survives_api_restart(
    admin: TaskForge,
    producer: TaskForge,
    keys: Keys,
    service: Service,
    caplog: pytest.LogCaptureFixture,
):
    name = qname()
    admin.create_queue(name)
    with running_worker(service, keys.worker, name, sdk_handlers.double, concurrency=2) as w:
        first = producer.enqueue(name, {"n": 1})
        wait_for(lambda: w.processed == 1, 10, "the first task")
        code, _ = service.signal("api", signal.SIGINT, timeout=10)
        assert code is not None
        time.sleep(2)  # claims fail meanwhile: the worker logs and backs off
        service.restart("api")
        second = producer.enqueue(name, {"n": 2})
        wait_for(lambda: w.processed == 2, 20, "the task enqueued after the restart")
    assert producer.get_task(name, first.id).result == {"doubled": 2}
    assert producer.get_task(name, second.id).result == {"doubled": 4}
    assert any("claim failed" in r.getMessage() for r in caplog.records)


def test_heartbeat_crossing_an_ack_is_not_a_lost_lease(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service, caplog: Any
) -> None:
    """Regression for issue 11: a heartbeat round sent while a finished task's ack was in
    flight came back `lease_lost` (the task was done) and the worker logged that the
    outcome would be dropped, though it had been delivered."""
    from taskforge_client import runtime

    name = qname()
    admin.create_queue(name)
    producer.enqueue(name, {"n": 1})
    worker = Worker(service.base_url, keys.worker, queues=[name], handler=sdk_handlers.double)
    [task] = worker.client.claim(worker.worker_id, [name], max_tasks=1, wait_seconds=5)
    run = runtime._Running(task, time.monotonic())
    run.beat_at -= worker.heartbeat_interval  # due for a heartbeat
    worker._running[task.id] = run

    class AckLandsFirst(TaskForge):
        """The handler returns and its ack commits while the heartbeat call is out."""

        def heartbeat_batch(self, worker_id: str, items: Any) -> Any:
            run.finishing = True
            self.ack(worker_id, task.id, task.attempts, {"doubled": 2})
            return super().heartbeat_batch(worker_id, items)

    worker.client.close()
    worker.client = AckLandsFirst(service.base_url, keys.worker)
    try:
        with caplog.at_level("WARNING", logger="taskforge_client.worker"):
            worker._heartbeat_round()
    finally:
        worker.client.close()
    assert not run.lost
    assert "lease lost" not in caplog.text
    assert producer.get_task(name, task.id).status == "done"


def test_worker__heartbeats_only_the_tasks_that_are_due(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service
) -> None:
    """Issue 34: a round heartbeated every running task, a task claimed a moment before
    included; now only the due ones go, and those past half their interval with them."""
    from taskforge_client import runtime

    name = qname()
    admin.create_queue(name)
    producer.enqueue_many(name, [TaskSpec({"n": 1}), TaskSpec({"n": 2})])
    worker = Worker(service.base_url, keys.worker, queues=[name], handler=sdk_handlers.double)
    sent: list[list[str]] = []
    heartbeat_batch = worker.client.heartbeat_batch

    def recording(worker_id: str, items: Any) -> Any:
        items = list(items)
        sent.append([task_id for task_id, _ in items])
        return heartbeat_batch(worker_id, items)

    worker.client.heartbeat_batch = recording  # type: ignore[method-assign]
    try:
        tasks = worker.client.claim(worker.worker_id, [name], max_tasks=2, wait_seconds=5)
        old, new = (runtime._Running(t, time.monotonic(), lease_seconds=2.0) for t in tasks)
        for run in (old, new):
            worker._running[run.task.id] = run
        interval = worker._interval(old)
        assert interval == pytest.approx(2.0 / 3)
        old.beat_at -= interval
        worker._heartbeat_round()
        assert sent == [[old.task.id]]
        # The claim set both heartbeat_at; the round moved the old one's only.
        old_beat = producer.get_task(name, old.task.id).heartbeat_at
        assert producer.get_task(name, new.task.id).heartbeat_at == new.task.heartbeat_at
        assert old_beat is not None and old.task.heartbeat_at is not None
        assert old_beat > old.task.heartbeat_at
        worker._heartbeat_round()  # nothing due: no call
        assert len(sent) == 1
        old.beat_at -= interval
        new.beat_at -= interval * 0.6  # not due, but past half: it goes along
        worker._heartbeat_round()
        assert sent[1:] == [[old.task.id, new.task.id]]
    finally:
        worker.client.close()


# -- batching ------------------------------------------------------------------------------


def _api_requests(service: Service, path: str) -> int:
    return sum(
        1
        for line in service.log_lines("api")
        if line.get("event") == "http.request" and line.get("path") == path
    )


def test_enqueue_batcher__many_threads_few_requests_each_its_own_task(
    admin: TaskForge, producer: TaskForge, service: Service
) -> None:
    name = qname()
    admin.create_queue(name)
    got: dict[int, Task] = {}
    with producer.batcher(linger=0.02) as batcher:

        def produce(thread: int) -> None:
            for n in range(25):
                got[thread * 100 + n] = batcher.enqueue(name, {"n": thread * 100 + n})

        threads = [threading.Thread(target=produce, args=(t,)) for t in range(8)]
        sent_before = producer.requests_sent
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert len(got) == 200
    assert all(task.payload == {"n": n} and task.queue == name for n, task in got.items())
    assert len({task.id for task in got.values()}) == 200
    assert all(task.status == "pending" for task in got.values())  # as an enqueue answers
    # 8 threads each waiting for its previous task: far fewer calls than tasks.
    assert producer.requests_sent - sent_before <= 100


def test_enqueue_batcher__a_bad_item_fails_only_its_own_call(
    admin: TaskForge, producer: TaskForge
) -> None:
    name = qname()
    admin.create_queue(name)
    results: dict[str, Any] = {}
    with producer.batcher(linger=0.2) as batcher:

        def call(label: str, **options: Any) -> None:
            try:
                results[label] = batcher.enqueue(name, {"label": label}, **options)
            except TaskForgeError as exc:
                results[label] = exc

        threads = [
            threading.Thread(target=call, args=("good-1",)),
            threading.Thread(target=call, args=("bad",), kwargs={"priority": 11}),
            threading.Thread(target=call, args=("good-2",), kwargs={"priority": 2}),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    bad = results["bad"]
    assert isinstance(bad, Invalid) and set(bad.fields) == {"priority"}, bad
    assert results["good-1"].payload == {"label": "good-1"}
    assert results["good-2"].priority == 2
    assert {t.payload["label"] for t in producer.list_tasks(name)} == {"good-1", "good-2"}


def test_ack_batch__each_item_answered_on_its_own(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service
) -> None:
    name = qname()
    admin.create_queue(name)
    producer.enqueue_many(name, [TaskSpec({"n": n}) for n in range(3)])
    with TaskForge(service.base_url, keys.worker) as worker:
        claimed = worker.claim("w-batch", [name], max_tasks=3, wait_seconds=5)
        assert len(claimed) == 3
        items: list[tuple[str, int, Any]] = [
            (t.id, t.attempts, {"n": i}) for i, t in enumerate(claimed)
        ]
        items[2] = (claimed[2].id, claimed[2].attempts + 1, None)  # a stale attempt
        results = worker.ack_batch("w-batch", items)
    assert [r.ok for r in results] == [True, True, False]
    assert results[2].error_code == "lease_lost"
    assert producer.get_task(name, claimed[0].id).result == {"n": 0}


def test_worker__acks_through_ack_batch(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service
) -> None:
    name = qname()
    admin.create_queue(name)
    batches_before = _api_requests(service, "/workers/ack/batch")
    singles_before = _api_requests(service, "/workers/ack")
    producer.enqueue_many(name, [TaskSpec({"n": n}) for n in range(30)])
    with running_worker(service, keys.worker, name, sdk_handlers.double, concurrency=8) as w:
        wait_for(lambda: w.processed == 30, 30, "30 tasks acked")
    assert all(t.status == "done" for t in producer.list_tasks(name))
    assert _api_requests(service, "/workers/ack") == singles_before
    assert _api_requests(service, "/workers/ack/batch") > batches_before


def _moves(producer: TaskForge, queue: str, *tasks: Task) -> dict[str, dict[str, datetime]]:
    """Each task's moves: when it entered each status (its last time), from its events."""
    return {
        task.id: {e.to_status: e.at for e in producer.task_events(queue, task.id) if e.at}
        for task in tasks
    }


def test_worker__claims_again_while_an_ack_is_on_its_way(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service
) -> None:
    """A slot frees when its handler returns: with one slot and acks that wait 0.5 s for
    company, the next task is handed out before the previous one is acked."""
    name = qname()
    admin.create_queue(name)
    first, second = producer.enqueue_many(name, [TaskSpec({"n": 1}), TaskSpec({"n": 2})])
    with running_worker(
        service, keys.worker, name, sdk_handlers.double, concurrency=1, ack_linger=0.5
    ) as w:
        wait_for(lambda: w.processed == 2, 30, "2 tasks acked")
    events = _moves(producer, name, first, second)
    handed = sorted(events.values(), key=lambda moves: moves["executing"])
    assert handed[1]["executing"] < handed[0]["done"]
    assert all(t.status == "done" for t in producer.list_tasks(name))


def test_worker__one_claim_fills_the_slots_of_handlers_that_return_together(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service
) -> None:
    """Four handlers that return 10 ms apart free four slots; the next claim waits
    `claim_linger` for them and asks for all four, not for the first one alone."""
    name = qname()
    admin.create_queue(name)
    producer.enqueue_many(name, [TaskSpec({"sleep": 0.2 + n % 4 / 100}) for n in range(8)])
    asked: list[int] = []
    with running_worker(
        service, keys.worker, name, sdk_handlers.slow, concurrency=4, claim_linger=0.1
    ) as w:
        claim = w.client.claim

        def recording_claim(*args: Any, **kwargs: Any) -> Any:
            tasks = claim(*args, **kwargs)
            if tasks:
                asked.append(kwargs["max_tasks"])
            return tasks

        w.client.claim = recording_claim  # type: ignore[method-assign]
        wait_for(lambda: w.processed == 8, 30, "8 tasks acked")
    # (The first claim may go out before the recorder is in place.)
    assert asked and all(n == 4 for n in asked), asked


def test_worker__claim_does_not_wait_for_a_handler_that_keeps_running(
    admin: TaskForge, producer: TaskForge, keys: Keys, service: Service
) -> None:
    """`claim_linger` bounds the wait: with one handler busy for 3 s, the slot its
    neighbour freed is claimed for after the linger, not after the long task."""
    name = qname()
    admin.create_queue(name)
    long, short, third = producer.enqueue_many(
        name, [TaskSpec({"sleep": 3}), TaskSpec({"sleep": 0}), TaskSpec({"sleep": 0})]
    )
    with running_worker(
        service, keys.worker, name, sdk_handlers.slow, concurrency=2, claim_linger=0.3
    ) as w:
        wait_for(lambda: w.processed == 3, 30, "3 tasks acked")
    moves = _moves(producer, name, long, short, third)
    assert moves[third.id]["executing"] - moves[short.id]["done"] < timedelta(seconds=2)
    assert moves[third.id]["executing"] < moves[long.id]["done"] - timedelta(seconds=1)


def test_worker__signal_handler_takes_no_lock(service: Service, keys: Keys) -> None:
    """Regression for issue 14: the SIGTERM handler called Event.set() (and logged); run
    in the main thread while that thread held the event's lock, it waited for it forever."""
    worker = Worker(service.base_url, keys.worker, queues=["q"], handler=sdk_handlers.double)
    returned = threading.Event()

    def interrupted_inside_the_events_lock() -> None:
        with worker._stop._cond:  # type: ignore[attr-defined]  # where Event.wait() waits
            worker._on_signal(signal.SIGTERM, None)
        returned.set()

    threading.Thread(target=interrupted_inside_the_events_lock, daemon=True).start()
    assert returned.wait(2), "the handler blocked on a lock"
    worker.client.close()


def test_client__warns_of_a_key_sent_in_clear_to_another_host(caplog: Any) -> None:
    """Issue 14: nothing said that a plain http:// URL to a remote host sends the key in clear."""
    with caplog.at_level("WARNING", logger="taskforge_client"):
        TaskForge("http://127.0.0.1:1", "k").close()
        TaskForge("https://queue.example", "k").close()
    assert "plain http" not in caplog.text
    with caplog.at_level("WARNING", logger="taskforge_client"):
        TaskForge("http://queue.example:8080", "k").close()
    assert "plain http" in caplog.text


def test_cli__warns_of_a_key_on_the_command_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 14: --api-key shows in ps; the CLI tells the person at the terminal (a script's
    stderr stays the error's JSON) and names the variable to use."""
    argv = ["--url", "http://127.0.0.1:1", "--api-key", "secret", "queues"]
    cli_main(argv)
    assert "TASKFORGE_API_KEY" not in capsys.readouterr().err
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    cli_main(argv)
    assert "TASKFORGE_API_KEY" in capsys.readouterr().err
