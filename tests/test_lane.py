"""The hot lane answers, logs and counts a call exactly as the middleware chain does."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.test import RequestFactory
from prometheus_client import REGISTRY
from rest_framework.test import APIClient, ForceAuthClientHandler

from queues.models import Queue
from taskforge.api import lane
from taskforge.api.bridge import Answer
from taskforge.api.lane import MIRRORED, HotLane, LaneClientHandler
from taskforge.api.models import ApiKey
from taskforge.conf import conf
from taskforge.lib import pg

pytestmark = pytest.mark.django_db

Q = "lane"
TASK_ID = "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"


def test_mirrored__is_the_middleware_chain() -> None:
    """The lane calls the hooks of this chain: a changed MIDDLEWARE needs the lane changed."""
    assert settings.MIDDLEWARE == MIRRORED


def _request(path: str = f"/queues/{Q}/tasks", body: bytes = b"{}", **extra: Any) -> Any:
    extra.setdefault("content_type", "application/json")
    extra.setdefault("HTTP_HOST", "localhost")
    return RequestFactory().post(path, data=body, **extra)


@pytest.mark.parametrize(
    ("make", "taken"),
    [
        pytest.param(lambda: _request(), True, id="plain-json-enqueue"),
        pytest.param(lambda: _request("/workers/ack/batch"), True, id="plain-json-ack-batch"),
        pytest.param(lambda: _request(content_type="application/json; charset=utf-8"), False),
        pytest.param(lambda: _request(f"/queues/{Q}/tasks?format=json"), False, id="query"),
        pytest.param(lambda: _request(HTTP_ACCEPT="text/html"), False, id="accept"),
        pytest.param(lambda: _request(body=b""), False, id="no-body"),
        pytest.param(lambda: _request("/queues"), False, id="not-hot"),
        pytest.param(lambda: _request(HTTP_HOST="evil.example"), False, id="host-not-allowed"),
        pytest.param(
            lambda: RequestFactory().get(f"/queues/{Q}/tasks", HTTP_HOST="localhost"), False
        ),
        pytest.param(
            lambda: _request(body=b" " * (2 * conf.MAX_PAYLOAD_BYTES + 4097)),
            False,
            id="over-the-single-task-limit",
        ),
    ],
)
def test_takes__only_what_the_chain_would_pass_to_the_view(
    make: Callable[[], Any], taken: bool
) -> None:
    assert (HotLane().takes(make()) is not None) is taken


@pytest.fixture
def client(make_client: Callable[[str | None], APIClient]) -> Callable[[str | None], APIClient]:
    """A client of a role (its calls through the lane, as the servers serve them)."""
    Queue.objects.create(name=Q)

    def make(role: str | None) -> APIClient:
        made = make_client(role)
        assert isinstance(made.handler, LaneClientHandler)
        return made

    return make


def _samples() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """django-prometheus's HTTP series; of a histogram its count (a bucket or the
    sum depends on the call's duration, or an answer's length), and every bucket
    of the request sizes; no series' creation time."""
    found = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            name = sample.name
            if not name.startswith("django_http_") or name.endswith("_created"):
                continue
            if (
                metric.type == "histogram"
                and not name.endswith("_count")
                and name != "django_http_requests_body_bytes_bucket"
            ):
                continue
            found[(name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = {
            key: value
            for key, value in vars(record).items()
            if key in {"method", "path", "status", "remote_addr", "status_code"}
        }
        self.lines.append({"logger": record.name, "message": record.getMessage(), **fields})


@pytest.fixture
def records() -> Iterator[_Records]:
    handler = _Records()
    loggers = [logging.getLogger("taskforge.request"), logging.getLogger("django.request")]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler
    for logger in loggers:
        logger.removeHandler(handler)


def _through(
    how: Callable[[dict[str, Any]], Answer],
    environ: dict[str, Any],
    records: _Records,
) -> dict[str, Any]:
    records.lines.clear()
    before = _samples()
    status, headers, body = how(environ)
    after = _samples()
    payload = json.loads(body)
    return {
        "status": status,
        "headers": sorted((name.lower(), value) for name, value in headers),
        # A created task's ids and times are its own; the answer's shape is compared.
        "body": payload if status >= 400 else sorted(payload),
        "logs": records.lines[:],
        "counted": {
            key: after[key] - before.get(key, 0.0)
            for key in after
            if after[key] != before.get(key, 0.0)
        },
    }


def _call(
    client: APIClient, path: str, body: Any, records: _Records, spy: list[int]
) -> dict[str, Any]:
    responded = len(spy)

    def post(environ: dict[str, Any]) -> Answer:
        response = client.post(path, json.dumps(body), content_type="application/json")
        return response.status_code, list(response.items()), response.content

    found = _through(post, {}, records)
    return {"lane": len(spy) > responded, **found}


CALLS = [
    ("producer", f"/queues/{Q}/tasks", {"payload": {"n": 1}}),
    ("producer", f"/queues/{Q}/tasks/batch", {"tasks": [{"payload": 1}, {"payload": 2}]}),
    ("producer", f"/queues/{Q}/tasks", {"payload": {"n": 1}, "priority": 11}),
    ("producer", "/queues/nope/tasks", {"payload": 1}),
    ("worker", f"/queues/{Q}/tasks", {"payload": 1}),
    (None, f"/queues/{Q}/tasks", {"payload": 1}),
    ("worker", "/workers/claim", {"worker_id": "w-1", "queues": [Q], "max_tasks": 5}),
    ("worker", "/workers/claim", {"worker_id": "w-1", "queues": ["nope"]}),
    ("worker", "/workers/ack", {"worker_id": "w-1", "task_id": TASK_ID}),
    ("worker", "/workers/heartbeat/batch", {"worker_id": "w-1", "items": [{"task_id": TASK_ID}]}),
    ("worker", "/workers/nack", {"worker_id": "w-1", "task_id": TASK_ID, "error": "boom"}),
]


@pytest.mark.parametrize(("role", "path", "body"), CALLS, ids=[f"{c[1]}-{c[0]}" for c in CALLS])
def test_a_call__answered_logged_and_counted_as_through_the_chain(
    client: Callable[[str | None], APIClient],
    records: _Records,
    monkeypatch: pytest.MonkeyPatch,
    role: str | None,
    path: str,
    body: Any,
) -> None:
    spy: list[int] = []
    respond = HotLane.respond

    def spied(self: HotLane, *args: Any) -> Any:
        spy.append(1)
        return respond(self, *args)

    monkeypatch.setattr(HotLane, "respond", spied)
    caller = client(role)
    fast = _call(caller, path, body, records, spy)
    caller.handler = ForceAuthClientHandler(enforce_csrf_checks=False)  # the whole chain
    slow = _call(caller, path, body, records, spy)
    assert fast.pop("lane") is True
    assert slow.pop("lane") is False
    assert fast == slow


def test_wsgi_application__serves_through_the_lane() -> None:
    from taskforge.wsgi import application

    assert isinstance(application, lane.ApiWSGIHandler)


# --- ApiWSGIHandler.answer: the servers' way into the lane ---------------------------------
#
# Transactional: `answer` gives the thread's connection back (or keeps it) as a server's
# request does, which the usual test transaction does not survive.


def _environ(key: str | None, path: str, body: Any) -> dict[str, Any]:
    extra = {"HTTP_AUTHORIZATION": f"Bearer {key}"} if key else {}
    request = _request(path, json.dumps(body).encode(), **extra)
    return dict(request.environ)


def _wsgi(handler: lane.ApiWSGIHandler) -> Callable[[dict[str, Any]], Any]:
    def call(environ: dict[str, Any]) -> Answer:
        started: list[Any] = []
        result = handler(environ, lambda status, headers: started.extend([status, headers]))
        try:
            body = b"".join(result)
        finally:
            result.close()
        return int(started[0].split()[0]), started[1], body

    return call


@pytest.fixture
def handler() -> Iterator[lane.ApiWSGIHandler]:
    made = lane.ApiWSGIHandler()
    assert made.parking is not None, "the request signals' receivers changed: see lane.STARTED"
    yield made
    made.parking.resume()
    close_old_connections()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("role", "path", "body"), CALLS, ids=[f"{c[1]}-{c[0]}" for c in CALLS])
def test_answer__as_the_wsgi_call(
    handler: lane.ApiWSGIHandler, records: _Records, role: str | None, path: str, body: Any
) -> None:
    Queue.objects.create(name=Q)
    key = ApiKey.issue(name=f"test-{role}", role=role)[1] if role else None

    def direct(environ: dict[str, Any]) -> Answer:
        answer = handler.answer(environ)
        assert answer is not None
        return answer

    fast = _through(direct, _environ(key, path, body), records)
    slow = _through(_wsgi(handler), _environ(key, path, body), records)
    assert fast == slow


@pytest.mark.django_db(transaction=True)
def test_answer__none_for_a_call_the_lane_does_not_take(handler: lane.ApiWSGIHandler) -> None:
    environ = dict(_request("/queues", b"{}").environ)
    assert handler.answer(environ) is None


def _backend_pid() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_parking__a_thread_keeps_its_connection_between_hot_calls_until_another_request(
    handler: lane.ApiWSGIHandler,
) -> None:
    Queue.objects.create(name=Q)
    _, key = ApiKey.issue(name="test-producer", role="producer")
    close_old_connections()  # this thread starts as a server's does: no connection
    parking = handler.parking
    assert parking is not None

    answer = handler.answer(_environ(key, f"/queues/{Q}/tasks", {"payload": 1}))
    assert answer is not None and answer[0] == 201
    assert parking.count == 1
    kept = connection.connection
    assert kept is not None
    answer = handler.answer(_environ(key, f"/queues/{Q}/tasks", {"payload": 2}))
    assert answer is not None and answer[0] == 201
    assert connection.connection is kept  # the same connection, not one from the pool
    assert parking.count == 1

    # Any other request gives it back to the pool, as Django's request signals do.
    _wsgi(handler)(dict(RequestFactory().get("/healthz", HTTP_HOST="localhost").environ))
    assert parking.count == 0
    assert connection.connection is None


@pytest.mark.django_db(transaction=True)
def test_parking__only_a_clean_connection_and_only_up_to_the_limit() -> None:
    parking = lane.Parking(limit=2, max_age=60)
    close_old_connections()
    assert not parking.release()  # no connection open
    _backend_pid()
    with transaction.atomic():
        assert not parking.release()  # inside a transaction
    assert parking.release()
    assert parking.count == 1

    holding, done = threading.Event(), threading.Event()
    kept: dict[str, bool] = {}

    def thread(name: str, hold: bool) -> None:
        _backend_pid()
        kept[name] = parking.release()
        if hold:
            holding.set()
            done.wait(10)
        if kept[name]:
            parking.resume()
        connection.close()

    second = threading.Thread(target=thread, args=("second", True))
    second.start()
    assert holding.wait(10)
    third = threading.Thread(target=thread, args=("third", False))
    third.start()
    third.join(10)
    assert kept == {"second": True, "third": False}  # two keep one; the rest go round the pool
    assert parking.count == 2
    done.set()
    second.join(10)
    assert parking.resume()
    assert parking.count == 0
    close_old_connections()


@pytest.mark.django_db(transaction=True)
def test_parking__a_connection_is_kept_for_max_age_at_most() -> None:
    parking = lane.Parking(limit=4, max_age=0.05)
    _backend_pid()
    assert parking.release()
    assert parking.resume()
    time.sleep(0.1)
    assert not parking.release()  # first kept over max_age ago: back to the pool
    close_old_connections()


@pytest.mark.django_db(transaction=True)
def test_parking__a_connection_kept_before_a_broken_one_was_met_is_not_used_again() -> None:
    """After a request met a dead connection (Postgres restarted, sessions cut), a
    connection a thread kept from before is closed, not used nor given back as idle."""
    parking = lane.Parking(limit=4, max_age=60)
    _backend_pid()
    raw = connection.connection
    assert parking.release()
    pg.check_pool_soon()
    assert parking.resume() is False
    assert parking.count == 0
    assert connection.connection is None
    assert raw is not None and raw.closed
