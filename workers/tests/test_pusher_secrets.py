"""A push queue's secrets stay out of a delivery's log lines and its `last_error` (API.md v1.2
"Secrets in push settings": header values, the URL's user info and query), from real
deliveries to real local targets."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from queues import push
from queues.tests.factories import QueueFactory
from taskforge.lib.logging import JsonFormatter
from tasks.models import Task, TaskStatus
from tests.pushtarget import Answer, Request, Target
from workers.tests.test_pusher import (  # noqa: F401 (loopback_allowed: autouse)
    enqueue,
    loopback_allowed,
    pushing,
    settled,
    wait_for,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(60)]

SECRETS = ("pa55word", "qt0ken", "k3y-value")
HEADERS = {"X-Api-Key": "k3y-value"}


@pytest.fixture
def garbler(redis_client: Any) -> Iterator[int]:
    """A target that answers each request with a status line no HTTP client accepts
    (aiohttp's error then names the URL it sent to, query included)."""
    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(5)
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 2OO OK\r\nContent-Length: 0\r\n\r\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()


def _deliver_once(url: str, caplog: pytest.LogCaptureFixture) -> tuple[Task, str]:
    """One task sent to `url` until its attempt failed: the task, and the pusher's log."""
    queue = QueueFactory(
        name="hooks",
        push=push.parse({"url": url, "timeout_seconds": 5, "headers": HEADERS}).as_json(),
    )
    caplog.set_level(logging.INFO, logger="taskforge.pusher")
    with pushing():
        ids = enqueue(queue, {"n": 1})
        wait_for(settled(ids, TaskStatus.RETRY))
        wait_for(lambda: any(r.getMessage() == "push.failed" for r in caplog.records))
    formatter = JsonFormatter()
    log = "\n".join(formatter.format(r) for r in caplog.records if r.name == "taskforge.pusher")
    return Task.objects.get(pk=ids[0]), log


def test_an_error_naming_the_url_names_it_without_user_info_or_query(
    garbler: int, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"http://bot:pa55word@127.0.0.1:{garbler}/hook?token=qt0ken"
    task, log = _deliver_once(url, caplog)
    assert task.last_error is not None and task.last_error.startswith("request failed: ")
    assert f"127.0.0.1:{garbler}/hook" in task.last_error  # still says where it went
    assert '"event": "push.failed"' in log
    for secret in SECRETS:
        assert secret not in task.last_error, task.last_error
        assert secret not in log, log


def test_a_target_echoing_a_header_value_does_not_put_it_in_the_log(
    redis_client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    def echo(request: Request) -> Answer:
        return Answer(401, f"bad key {request.header('X-Api-Key')}".encode())

    with Target(echo) as target:
        task, log = _deliver_once(target.url("/hook?token=qt0ken"), caplog)
    assert target.requests[0].header("X-Api-Key") == "k3y-value"  # the target got it
    assert task.last_error == "HTTP 401: bad key [redacted]"
    for secret in SECRETS:
        assert secret not in log, log
