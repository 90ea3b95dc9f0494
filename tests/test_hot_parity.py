"""The hot endpoints answer malformed input exactly as they always did.

The eight endpoints of the task lifecycle (enqueue and its batch, claim,
heartbeat and its batch, ack and its batch, nack) validate their bodies with
`taskforge.api.bodies`, not DRF serializers.  `hot_parity.json` holds what
each of them answered, status and whole error body, to every row of CASES
when DRF's serializers still validated them; this test replays the rows and
compares.  A new malformed input is one more row: record its answer with
`TASKFORGE_RECORD_PARITY=1 pytest tests/test_hot_parity.py` (and read the
diff of the JSON file: a changed answer is a breaking change, API.md).
One change was recorded on purpose: a padded `worker_id` (" w-1 ") is 400
`invalid` since API.md v1.2 ("Strings are taken as sent"), where it was
trimmed and served.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import RequestFactory
from rest_framework.test import APIClient

from queues.models import Queue
from taskforge.api.middleware import is_hot_call

pytestmark = pytest.mark.django_db

GOLDEN = Path(__file__).with_name("hot_parity.json")
RECORD = os.environ.get("TASKFORGE_RECORD_PARITY") == "1"

TASK_ID = "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"
Q = "parity"

ENDPOINTS: dict[str, tuple[str, str, dict[str, Any]]] = {
    # name: (path, role, a valid body)
    "enqueue": (f"/queues/{Q}/tasks", "producer", {"payload": {"n": 1}}),
    "enqueue_batch": (f"/queues/{Q}/tasks/batch", "producer", {"tasks": [{"payload": 1}]}),
    "claim": ("/workers/claim", "worker", {"worker_id": "w-1", "queues": [Q]}),
    "heartbeat": ("/workers/heartbeat", "worker", {"worker_id": "w-1", "task_id": TASK_ID}),
    "heartbeat_batch": (
        "/workers/heartbeat/batch",
        "worker",
        {"worker_id": "w-1", "items": [{"task_id": TASK_ID}]},
    ),
    "ack": ("/workers/ack", "worker", {"worker_id": "w-1", "task_id": TASK_ID}),
    "ack_batch": (
        "/workers/ack/batch",
        "worker",
        {"worker_id": "w-1", "items": [{"task_id": TASK_ID}]},
    ),
    "nack": (
        "/workers/nack",
        "worker",
        {"worker_id": "w-1", "task_id": TASK_ID, "error": "boom"},
    ),
}

# Values every field is fed in turn.
ANY_VALUES: dict[str, Any] = {
    "null": None,
    "true": True,
    "false": False,
    "zero": 0,
    "one": 1,
    "minus": -1,
    "float": 1.5,
    "float-int": 3.0,
    "big": 2**53 + 1,
    "huge": 10**30,
    "empty-str": "",
    "blank": "   ",
    "str": "x",
    "padded": " w-1 ",
    "digits": "5",
    "long": "x" * 201,
    "longer": "y" * 10_001,
    "bad-chars": "a b",
    "uuid": TASK_ID,
    "uuid-upper": TASK_ID.upper(),
    "uuid-braces": "{" + TASK_ID + "}",
    "uuid-hex": TASK_ID.replace("-", ""),
    "time": "2030-01-01T00:00:00Z",
    "time-offset": "2030-01-01T02:00:00+02:00",
    "time-naive": "2030-01-01T00:00:00",
    "time-date": "2030-01-01",
    "time-far": "10000-01-01T00:00:00Z",
    "time-past": "2001-01-01T00:00:00Z",
    "list-empty": [],
    "list": ["a"],
    "list-queue": [Q],
    "object-empty": {},
    "object": {"a": 1},
    "max+": 31,
    "retries+": 101,
    "priority+": 11,
    "tasks+": 101,
    "delay+": 100 * 365 * 86400 + 1,
    "wait": 30,
    "wait+": 30.5,
    "after+": 86_401,
}

FIELDS: dict[str, list[str]] = {
    "enqueue": [
        "payload",
        "priority",
        "scheduled_at",
        "delay_seconds",
        "idempotency_key",
        "max_retries",
    ],
    "claim": ["worker_id", "queues", "max_tasks", "wait_seconds"],
    "heartbeat": ["worker_id", "task_id", "attempt"],
    "ack": ["worker_id", "task_id", "attempt", "result"],
    "nack": ["worker_id", "task_id", "attempt", "error", "retry", "retry_after_seconds"],
    "heartbeat_batch": ["worker_id", "items"],
    "ack_batch": ["worker_id", "items"],
    "enqueue_batch": ["tasks"],
}

# Fields of the items of the batch forms, fed the same values inside `items[1]` / `tasks[1]`.
ITEM_FIELDS: dict[str, tuple[str, list[str], dict[str, Any]]] = {
    "enqueue_batch": ("tasks", FIELDS["enqueue"], {"payload": 1}),
    "heartbeat_batch": ("items", ["task_id", "attempt"], {"task_id": TASK_ID}),
    "ack_batch": ("items", ["task_id", "attempt", "result"], {"task_id": TASK_ID}),
}

# Valid waits: a claim would wait that long for work (a long poll), so they are left out.
LONG_POLLS = {"one", "float", "float-int", "wait"}

WHOLE_BODIES: dict[str, Any] = {
    "list": [],
    "string": "x",
    "number": 1,
    "null": None,
    "empty": {},
    "unknown": {"nope": 1},
    "unknowns-and-bad": {"zz": 1, "aa": 2, "priority": "x", "attempt": 0, "queues": 5},
    "many-bad": {
        "worker_id": "",
        "task_id": 1,
        "attempt": 0,
        "queues": [],
        "max_tasks": 0,
        "wait_seconds": -1,
        "error": "",
        "retry": "no",
        "retry_after_seconds": -1,
        "items": [],
        "tasks": [],
        "payload": None,
        "priority": 0,
        "result": None,
        "scheduled_at": "x",
        "delay_seconds": "x",
        "idempotency_key": "",
        "max_retries": -1,
    },
}


def _cases() -> Iterator[tuple[str, str, Any]]:
    for endpoint, (_, _, valid) in ENDPOINTS.items():
        yield endpoint, "valid", valid
        for name, body in WHOLE_BODIES.items():
            yield endpoint, f"body:{name}", body
        for field in FIELDS[endpoint]:
            for name, value in ANY_VALUES.items():
                if field == "wait_seconds" and name in LONG_POLLS:
                    continue
                yield endpoint, f"{field}={name}", {**valid, field: value}
            if field in valid:
                yield endpoint, f"{field}:missing", {k: v for k, v in valid.items() if k != field}
        if endpoint in ITEM_FIELDS:
            key, item_fields, item = ITEM_FIELDS[endpoint]
            for field in item_fields:
                for name, value in ANY_VALUES.items():
                    body = {**valid, key: [item, {**item, field: value}]}
                    yield endpoint, f"{key}[1].{field}={name}", body
            for name, value in ANY_VALUES.items():
                yield endpoint, f"{key}[0]={name}", {**valid, key: [value, item]}
            yield endpoint, f"{key}:two-bad", {**valid, key: [{"x": 1}, item, {"y": 2}]}
            limit = 1000 if endpoint == "enqueue_batch" else 100
            yield endpoint, f"{key}:over", {**valid, key: [item] * (limit + 1)}
            yield endpoint, f"{key}:at-limit", {**valid, key: [item] * limit}
    # Rules that tie fields together, and sizes.
    enqueue: dict[str, Any] = ENDPOINTS["enqueue"][2]
    both = {"scheduled_at": "2030-01-01T00:00:00Z", "delay_seconds": 1}
    yield "enqueue", "scheduled-and-delay", {**enqueue, **both}
    yield "enqueue_batch", "scheduled-and-delay", {"tasks": [{"payload": 1, **both}]}
    yield "enqueue", "payload-too-large", {"payload": "x" * 262_145}
    yield "enqueue_batch", "payload-too-large", {"tasks": [{"payload": "x" * 262_145}]}
    ack = ENDPOINTS["ack"][2]
    yield "ack", "result-too-large", {**ack, "result": "x" * 262_145}
    yield (
        "ack_batch",
        "result-too-large",
        {**ack, "items": [{"task_id": TASK_ID, "result": "x" * 262_145}]},
    )
    yield "claim", "unknown-queue", {"worker_id": "w-1", "queues": ["nope"]}
    yield "claim", "queues-mixed", {"worker_id": "w-1", "queues": [Q, 5, None, "x" * 101]}
    yield "claim", "queues-21", {"worker_id": "w-1", "queues": [Q] * 21}
    yield "nack", "error-padded", {**ENDPOINTS["nack"][2], "error": "  "}


CASES = list(_cases())


def _answer(response: Any) -> dict[str, Any]:
    status = response.status_code
    if status < 400:
        return {"status": status}
    return {"status": status, "body": json.loads(response.content)}


@pytest.fixture
def clients(make_client: Callable[[str | None], APIClient]) -> dict[str, APIClient]:
    Queue.objects.create(name=Q)
    return {role: make_client(role) for role in ("producer", "worker", "admin")} | {
        "none": make_client(None)
    }


@pytest.mark.parametrize(
    "content_type",
    [
        pytest.param("application/json", id="hot-path"),
        # Any other spelling of JSON goes through DRF's view, to the same rules and handler.
        pytest.param("application/json; charset=utf-8", id="drf-path"),
    ],
)
def test_hot_endpoints__answer_malformed_input_as_recorded(
    clients: dict[str, APIClient], content_type: str
) -> None:
    """Every row of CASES, and the role checks of each endpoint, answer as recorded."""
    answers: dict[str, Any] = {}
    for endpoint, name, body in CASES:
        path, role, _ = ENDPOINTS[endpoint]
        response = clients[role].post(path, json.dumps(body), content_type=content_type)
        answers[f"{endpoint} {name}"] = _answer(response)
    for endpoint, (path, role, valid) in ENDPOINTS.items():
        wrong = "worker" if role == "producer" else "producer"
        for who in ("none", wrong):
            response = clients[who].post(path, json.dumps(valid), content_type=content_type)
            answers[f"{endpoint} role:{who}"] = _answer(response)
        response = clients[role].post(path, b"{", content_type=content_type)
        answers[f"{endpoint} parse-error"] = _answer(response)
        response = clients[role].post(path, b'{"a": 1, "a": 2}', content_type=content_type)
        answers[f"{endpoint} duplicate-key"] = _answer(response)
        response = clients[role].post(
            path, b"x=1", content_type="application/x-www-form-urlencoded"
        )
        answers[f"{endpoint} form"] = _answer(response)
        response = clients[role].get(path)
        answers[f"{endpoint} GET"] = _answer(response)
    if RECORD and content_type == "application/json":
        GOLDEN.write_text(json.dumps(answers, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
    recorded = json.loads(GOLDEN.read_text())
    mismatched = {
        case: {"now": answers.get(case), "recorded": recorded.get(case)}
        for case in sorted(set(answers) | set(recorded))
        if answers.get(case) != recorded.get(case)
    }
    assert not mismatched, json.dumps(dict(list(mismatched.items())[:20]), indent=1)


def test_hot_endpoints__answer_with_drf_views_headers(clients: dict[str, APIClient]) -> None:
    """A hot answer carries the headers the DRF view's answer carries (Allow included)."""
    for endpoint, (path, role, valid) in ENDPOINTS.items():
        if endpoint == "enqueue_batch":
            valid = {"tasks": [{"payload": 1, "idempotency_key": "same"}]}
        answers = [
            clients[role].post(path, json.dumps(valid), content_type=content_type)
            for content_type in ("application/json", "application/json; charset=utf-8")
        ]
        hot, drf = ({name.lower(): value for name, value in a.items()} for a in answers)
        hot.pop("content-length", None), drf.pop("content-length", None)
        assert hot == drf, endpoint


@pytest.mark.parametrize(
    ("method", "path", "hot"),
    [
        ("POST", "/workers/claim", True),
        ("POST", "/workers/ack/batch", True),
        ("POST", f"/queues/{Q}/tasks", True),
        ("POST", f"/queues/{Q}/tasks/batch", True),
        ("GET", f"/queues/{Q}/tasks", False),
        ("POST", "/queues", False),
        ("POST", f"/queues/{Q}/tasks/x/y", False),
        ("POST", "/admin/login/", False),
    ],
)
def test_is_hot_call__only_a_post_to_a_hot_endpoint(method: str, path: str, hot: bool) -> None:
    """Only those pass the people's middleware by (taskforge.api.middleware)."""
    request = RequestFactory().generic(method, path)
    assert is_hot_call(request) is hot
