"""The serving model under `run_api` (issue 11): what idle and hostile clients cost.

Real processes and raw sockets: the API as deployments run it, a fleet of workers
long-polling it, and clients that send their requests a line at a time.  Nothing
here is timed against a speed target (those are `make bench`'s idle-fleet row);
each bound below is only how long a test waits before calling a request lost.
"""

from __future__ import annotations

import json
import selectors
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection

from queues.models import Queue
from taskforge.api.models import ApiKey
from tests.service import Api, Service, database_url

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]

FLEET = 300  # long-polling workers (the bench's idle-fleet row runs 1,000)
TRICKLERS = 500  # connections sending their request a line at a time
HEADER_TIMEOUT = 2  # seconds, TASKFORGE_HEADER_TIMEOUT_SECONDS in these tests
BODY_TIMEOUT = 2  # seconds, TASKFORGE_BODY_TIMEOUT_SECONDS
ANSWER_BOUND = 5.0  # seconds before a probe counts as unanswered


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "serving-secret-key",
            "TASKFORGE_HEADER_TIMEOUT_SECONDS": str(HEADER_TIMEOUT),
            "TASKFORGE_BODY_TIMEOUT_SECONDS": str(BODY_TIMEOUT),
            # The pollers never heartbeat: with the suite's 2 s lease, a loaded
            # machine let a lease run out while the fleet was still being served,
            # and the watchdog rightly handed that task to a second poller.
            "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS": "120",
        },
    )
    try:
        svc.start()  # the API and the loops (the dispatcher feeds Redis)
        yield svc
    finally:
        svc.stop()


def connect(svc: Service) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", svc.port), timeout=ANSWER_BOUND)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def request_bytes(method: str, path: str, body: Any = None, key: str | None = None) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(data)}"]
    if body is not None:
        lines.append("Content-Type: application/json")
    if key:
        lines.append(f"Authorization: Bearer {key}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + data


def read_response(sock: socket.socket) -> tuple[int, Any]:
    """One HTTP/1.1 response with a Content-Length (as the API sends them)."""
    raw = b""
    while b"\r\n\r\n" not in raw:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before an answer: {raw!r}")
        raw += chunk
    head, _, rest = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        rest += chunk
    return status, json.loads(rest) if rest else None


def probe(svc: Service, key: str | None, method: str, path: str, body: Any = None) -> int:
    """One request on a fresh connection; its status, or fails past ANSWER_BOUND."""
    with connect(svc) as sock:
        sock.sendall(request_bytes(method, path, body, key))
        return read_response(sock)[0]


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """Did the server close `sock` (after any answer it sent) within `within` s?"""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:  # reset
        return True
    return True


class Trickler:
    """`count` connections that each send their request one line (or byte) at a time."""

    def __init__(self, svc: Service, count: int, first: bytes, drip: bytes) -> None:
        self.socks = [connect(svc) for _ in range(count)]
        for sock in self.socks:
            sock.sendall(first)
        self.drip = drip
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.wait(0.5):
            for sock in self.socks:
                try:
                    sock.sendall(self.drip)
                except OSError:
                    pass  # closed by the server: what the test wants to see

    def close(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)
        for sock in self.socks:
            sock.close()


def test_slow_headers__cost_no_request_capacity_and_are_closed(server: Service) -> None:
    """500 connections trickling a header line every 0.5 s: /healthz still answers at
    once, and each of them is closed once the header timeout is over."""
    slow = Trickler(server, TRICKLERS, b"GET /healthz HTTP/1.1\r\nHost: x\r\n", b"X-Slow: 1\r\n")
    try:
        statuses = [probe(server, None, "GET", "/healthz") for _ in range(20)]
        assert statuses == [200] * 20
        time.sleep(HEADER_TIMEOUT)
        closed = sum(closed_by_server(sock, within=HEADER_TIMEOUT + 3) for sock in slow.socks[:50])
        assert closed == 50
    finally:
        slow.close()


def test_slow_bodies__cost_no_request_capacity_and_get_408(server: Service) -> None:
    """500 connections that declare a body and trickle it a byte at a time: /healthz and
    an enqueue still answer; each slow request gets 408 `request_timeout` and is closed."""
    Queue.objects.create(name="busy")
    key = ApiKey.issue(name="serving-producer", role="producer")[1]
    head = (
        b"POST /queues/busy/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + key.encode() + b"\r\nContent-Length: 1000\r\n\r\n{"
    )
    slow = Trickler(server, TRICKLERS, head, b" ")
    try:
        assert [probe(server, None, "GET", "/healthz") for _ in range(10)] == [200] * 10
        enqueued = [probe(server, key, "POST", "/queues/busy/tasks", {"payload": {}})]
        assert enqueued == [201]
        sock = slow.socks[0]
        sock.settimeout(BODY_TIMEOUT + 5)
        status, body = read_response(sock)
        assert status == 408 and body["error"]["code"] == "request_timeout", body
        assert closed_by_server(sock, within=5)
    finally:
        slow.close()
    assert Queue.objects.get(name="busy").tasks.count() == 1  # the slow ones created nothing


def test_body_over_the_limit__refused_before_it_is_read(server: Service) -> None:
    """A declared length over TASKFORGE_MAX_REQUEST_BYTES is answered 413 at once,
    before any of the body is sent."""
    with connect(server) as sock:
        sock.sendall(
            b"POST /queues/x/tasks/batch HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 999999999\r\n\r\n"
        )
        status, body = read_response(sock)
    assert status == 413 and body["error"]["code"] == "payload_too_large"


def test_idle_fleet__waiting_polls_block_nothing_and_each_gets_a_task(server: Service) -> None:
    """300 workers long-poll one queue (`wait_seconds` 30): enqueues into another queue
    and /healthz answer meanwhile; then 300 tasks reach the fleet, one to each poller,
    none twice."""
    Queue.objects.create(name="fleet")
    Queue.objects.create(name="other")
    worker_key = ApiKey.issue(name="serving-fleet", role="worker")[1]
    producer_key = ApiKey.issue(name="serving-producer", role="producer")[1]
    pollers = [connect(server) for _ in range(FLEET)]
    for index, sock in enumerate(pollers):
        claim = {"worker_id": f"w{index}", "queues": ["fleet"], "wait_seconds": 30}
        sock.sendall(request_bytes("POST", "/workers/claim", claim, worker_key))
    try:
        time.sleep(1.0)  # every claim has looked once and is waiting
        for _ in range(10):
            assert probe(server, None, "GET", "/healthz") == 200
            body = {"payload": {"probe": True}}
            assert probe(server, producer_key, "POST", "/queues/other/tasks", body) == 201

        api = Api(server.base_url, producer_key)
        tasks = [{"payload": {"n": n}} for n in range(FLEET)]
        api.ok("POST", "/queues/fleet/tasks/batch", {"tasks": tasks})

        got: dict[int, list[str]] = {}
        selector = selectors.DefaultSelector()
        for index, sock in enumerate(pollers):
            selector.register(sock, selectors.EVENT_READ, index)
        deadline = time.monotonic() + 20
        while len(got) < FLEET and time.monotonic() < deadline:
            for ready, _ in selector.select(timeout=1.0):
                selector.unregister(ready.fileobj)
                status, answer = read_response(ready.fileobj)  # type: ignore[arg-type]
                assert status == 200, answer
                got[ready.data] = [task["id"] for task in answer["tasks"]]
        selector.close()
    finally:
        for sock in pollers:
            sock.close()
    assert len(got) == FLEET, f"{FLEET - len(got)} pollers got no answer"
    handed = [task_id for ids in got.values() for task_id in ids]
    assert len(handed) == FLEET and len(set(handed)) == FLEET
