"""The hot lane answers, logs and counts a call exactly as the middleware chain does."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.conf import settings
from django.test import RequestFactory
from prometheus_client import REGISTRY
from rest_framework.test import APIClient, ForceAuthClientHandler

from queues.models import Queue
from taskforge.api import lane
from taskforge.api.lane import MIRRORED, HotLane, LaneClientHandler
from taskforge.conf import conf

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
    """django-prometheus's HTTP series; of a histogram only its count (a bucket
    or the sum depends on the call's duration), and no series' creation time."""
    found = {}
    for metric in REGISTRY.collect():
        for sample in metric.samples:
            name = sample.name
            if not name.startswith("django_http_") or name.endswith("_created"):
                continue
            if metric.type == "histogram" and not name.endswith("_count"):
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


def _call(
    client: APIClient, path: str, body: Any, records: _Records, spy: list[int]
) -> dict[str, Any]:
    records.lines.clear()
    before, responded = _samples(), len(spy)
    response = client.post(path, json.dumps(body), content_type="application/json")
    after = _samples()
    counted = {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if after[key] != before.get(key, 0.0)
    }
    payload = json.loads(response.content)
    return {
        "lane": len(spy) > responded,
        "status": response.status_code,
        "headers": sorted((name.lower(), value) for name, value in response.items()),
        # A created task's ids and times are its own; the answer's shape is compared.
        "body": payload if response.status_code >= 400 else sorted(payload),
        "logs": records.lines[:],
        "counted": counted,
    }


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
