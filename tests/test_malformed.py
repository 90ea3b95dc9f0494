"""Malformed input of every kind answers a 4xx JSON error and stores nothing.

One table (CASES): a new malformed input is one more row.  Bodies are sent
as raw bytes, so the table holds what a broken client would really send.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest
from rest_framework import status
from rest_framework.test import APIClient

from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.audit.models import AuditEntry
from tasks.models import Schedule, Task, TaskEvent
from tasks.tests.factories import ScheduleFactory, TaskFactory
from tests.helpers import send_raw

if TYPE_CHECKING:
    from rest_framework.response import _MonkeyPatchedResponse as TestResponse

pytestmark = pytest.mark.django_db

JSON = "application/json"
QUEUES = "/queues"
QUEUE = "/queues/{queue}"
TASKS = "/queues/{queue}/tasks"
BATCH = "/queues/{queue}/tasks/batch"
TASK = "/queues/{queue}/tasks/{task}"
EVENTS = "/queues/{queue}/tasks/{task}/events"
SCHEDULES = "/queues/{queue}/schedules"
SCHEDULE = "/queues/{queue}/schedules/{schedule}"


@dataclass(frozen=True)
class Case:
    method: str
    path: str  # {queue}, {task}, {other_task} are filled in by the `world` fixture
    body: bytes
    status: int
    code: str
    fields: tuple[str, ...] | None = None  # exactly the names of error.fields
    content_type: str | None = JSON
    settings: tuple[tuple[str, Any], ...] = ()


def raw(value: Any) -> bytes:
    return json.dumps(value).encode()


def invalid(method: str, path: str, body: Any, fields: tuple[str, ...], id: str, **kw: Any) -> Any:
    """A well-formed JSON body that fails validation: 400 `invalid` naming `fields`."""
    data = body if isinstance(body, bytes) else raw(body)
    return pytest.param(
        Case(method, path, data, status.HTTP_400_BAD_REQUEST, "invalid", fields, **kw), id=id
    )


def parse_error(method: str, path: str, body: bytes, id: str) -> Any:
    """A body that is not (strict) JSON: 400 `parse_error`."""
    return pytest.param(Case(method, path, body, status.HTTP_400_BAD_REQUEST, "parse_error"), id=id)


def unsupported(method: str, path: str, body: bytes, content_type: str | None, id: str) -> Any:
    return pytest.param(
        Case(
            method,
            path,
            body,
            status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            content_type=content_type,
        ),
        id=id,
    )


def not_found(method: str, path: str, id: str) -> Any:
    return pytest.param(Case(method, path, b"", status.HTTP_404_NOT_FOUND, "not_found"), id=id)


def too_large(method: str, path: str, body: Any, id: str, **settings: Any) -> Any:
    data = body if isinstance(body, bytes) else raw(body)
    return pytest.param(
        Case(
            method,
            path,
            data,
            status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            "payload_too_large",
            settings=tuple(settings.items()),
        ),
        id=id,
    )


def query(path: str, params: str, fields: tuple[str, ...], id: str) -> Any:
    return invalid("GET", f"{path}?{params}", b"", fields, id)


def cursor(plain: Any) -> str:
    text = plain if isinstance(plain, bytes) else json.dumps(plain).encode()
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


def batch_of(*items: Any) -> dict[str, Any]:
    return {"tasks": list(items)}


OK = {"payload": {"ok": True}}
BIG_INT = 10**30

# What the wrong-type rows feed each kind of field.
NOT_AN_INT = {
    "string": "3",
    "bool": True,
    "float": 1.5,
    "list": [3],
    "object": {"n": 3},
    "null": None,
    "huge": BIG_INT,
}
NOT_A_BOOL = {"string": "true", "int 1": 1, "int 0": 0, "null": None, "list": [True]}
NOT_A_STRING = {"int": 5, "bool": True, "null": None, "list": ["a"], "object": {"a": 1}}
BAD_TIMES = {
    "number": 1_700_000_000,
    "bool": True,
    "null": None,
    "list": ["2030-01-01T00:00:00Z"],
    "empty": "",
    "words": "tomorrow",
    "naive": "2030-01-01T00:00:00",
    "date only": "2030-01-01",
    "year 10000": "10000-01-01T00:00:00Z",
    "signed year 10000": "+10000-01-01T00:00:00Z",
    "trailing garbage": "2030-01-01T00:00:00Zgarbage",
    "trailing words": "2030-01-01T00:00:00Z please",
    "month 13": "2030-13-01T00:00:00Z",
    "february 30": "2030-02-30T00:00:00Z",
    "leap second": "2030-06-30T23:59:60Z",
    "offset 24h": "2030-01-01T00:00:00+24:00",
    "past year 9999 in UTC": "9999-12-31T23:59:59-23:59",
    "before year 1 in UTC": "0001-01-01T00:00:00+01:00",
    "very long": "2030-01-01T00:00:00" + "0" * 1000 + "Z",
}

CASES: list[Any] = []

# --- POST /queues: wrong JSON types and out-of-range values per field ---------
CASES += [
    invalid("POST", QUEUES, {"name": v}, ("name",), f"create queue: name {k}")
    for k, v in NOT_A_STRING.items()
]
CASES += [
    invalid("POST", QUEUES, {"name": v}, ("name",), f"create queue: name {k}")
    for k, v in {
        "empty": "",
        "leading dash": "-q",
        "space": "a b",
        "slash": "a/b",
        "non-ascii": "caf\u00e9",
        "101 chars": "q" * 101,
        # Taken as sent (API.md Security v1.2): never trimmed.
        "leading space": " q",
        "trailing space": "q ",
        "trailing newline": "q\n",
        "tab": "\tq",
        "control character": "q\u0001",
        "C1 control": "q\u0085",
    }.items()
]
CASES += [
    invalid("POST", QUEUES, {"name": "q", "max_retries": v}, ("max_retries",), f"create: mr {k}")
    for k, v in {**NOT_AN_INT, "negative": -1, "101": 101}.items()
]
CASES += [
    invalid("POST", QUEUES, {"name": "q", "rate_limit": v}, ("rate_limit",), f"create: rl {k}")
    for k, v in {**NOT_AN_INT, "zero": 0, "negative": -5}.items()
    if k != "null"  # null is "unlimited"
]
CASES += [
    invalid(
        "POST", QUEUES, {"name": "q", "max_concurrency": v}, ("max_concurrency",), f"create: mc {k}"
    )
    for k, v in {**NOT_AN_INT, "zero": 0, "negative": -5, "100001": 100_001}.items()
    if k != "null"  # null is "unlimited"
]
CASES += [
    invalid("POST", QUEUES, {"name": "q", "paused": v}, ("paused",), f"create queue: paused {k}")
    for k, v in NOT_A_BOOL.items()
]
CASES += [
    invalid("POST", QUEUES, {"name": "q", "max_retry": 3}, ("max_retry",), "create: unknown"),
    invalid("POST", QUEUES, {"name": "q", "id": "x"}, ("id",), "create queue: read-only id"),
    invalid(
        "POST", QUEUES, {"name": "q", "Name": "r", "x": 1}, ("Name", "x"), "create: two unknown"
    ),
    invalid("POST", QUEUES, b"", ("name",), "create queue: empty body"),
    invalid("POST", QUEUES, {}, ("name",), "create queue: empty object"),
]
CASES += [
    invalid("POST", QUEUES, body, ("non_field_errors",), f"create queue: body is {k}")
    for k, body in {
        "a list": b'[{"name": "q"}]',
        "an empty list": b"[]",
        "a string": b'"q"',
        "a number": b"5",
        "true": b"true",
        "null": b"null",
    }.items()
]

# --- JSON that is not strict JSON, and bytes that are not JSON ----------------
CASES += [
    parse_error("POST", QUEUES, body, f"create queue: {k}")
    for k, body in {
        "NaN": b'{"name": "q", "max_retries": NaN}',
        "Infinity": b'{"name": "q", "max_retries": Infinity}',
        "-Infinity": b'{"name": "q", "max_retries": -Infinity}',
        "1e999": b'{"name": "q", "max_retries": 1e999}',
        "-1e999": b'{"name": "q", "max_retries": -1e999}',
        "duplicate key": b'{"name": "q", "name": "r"}',
        "duplicate key, same value": b'{"name": "q", "name": "q"}',
        "missing value": b'{"name": }',
        "truncated": b'{"name": "q"',
        "truncated string": b'{"name": "q',
        "single quotes": b"{'name': 'q'}",
        "trailing comma": b'{"name": "q",}',
        "trailing data": b'{"name": "q"} x',
        "two documents": b'{"name": "q"}{"name": "r"}',
        "comment": b'{"name": "q" /* hi */}',
        "bare word": b"name=q",
        "whitespace only": b"   ",
        "raw control char in string": b'{"name": "q\x01"}',
        "raw NUL in string": b'{"name": "q\x00"}',
        "invalid UTF-8": b'{"name": "\xff\xfe"}',
        "latin-1 bytes": b'{"name": "caf\xe9"}',
        "truncated UTF-8 sequence": b'{"name": "\xe2\x82"}',
        "UTF-16": '{"name": "q"}'.encode("utf-16"),
        "bad escape": b'{"name": "\\x41"}',
        "deep nesting": b'{"name": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    }.items()
]
CASES += [
    invalid("POST", QUEUES, body, ("name",), f"create queue: name with {k}")
    for k, body in {
        "escaped NUL": b'{"name": "q\\u0000"}',
        "lone high surrogate": b'{"name": "\\ud800"}',
        "lone low surrogate": b'{"name": "\\udfff"}',
        "reversed surrogate pair": b'{"name": "\\ude00\\ud83d"}',
    }.items()
]

# --- PATCH /queues/:name ------------------------------------------------------
CASES += [
    invalid("PATCH", QUEUE, {"max_retries": v}, ("max_retries",), f"patch queue: mr {k}")
    for k, v in {**NOT_AN_INT, "101": 101}.items()
]
CASES += [
    invalid("PATCH", QUEUE, {"rate_limit": v}, ("rate_limit",), f"patch queue: rl {k}")
    for k, v in {**NOT_AN_INT, "zero": 0}.items()
    if k != "null"
]
CASES += [
    invalid("PATCH", QUEUE, {"max_concurrency": v}, ("max_concurrency",), f"patch queue: mc {k}")
    for k, v in {**NOT_AN_INT, "zero": 0, "100001": 100_001}.items()
    if k != "null"
]
CASES += [
    invalid("PATCH", QUEUE, {"paused": v}, ("paused",), f"patch queue: paused {k}")
    for k, v in NOT_A_BOOL.items()
]
CASES += [
    invalid("PATCH", QUEUE, {"name": "renamed"}, ("name",), "patch queue: name is not patchable"),
    invalid("PATCH", QUEUE, {"paused": True, "pasued": 1}, ("pasued",), "patch queue: typo"),
    invalid("PATCH", QUEUE, b"[]", ("non_field_errors",), "patch queue: body is a list"),
    invalid("PATCH", QUEUE, b"3", ("non_field_errors",), "patch queue: body is a number"),
    parse_error("PATCH", QUEUE, b'{"paused": true, "paused": false}', "patch queue: dup key"),
    parse_error("PATCH", QUEUE, b'{"max_retries": NaN}', "patch queue: NaN"),
    parse_error("PATCH", QUEUE, b'{"paused": tru', "patch queue: truncated"),
]

# --- POST /queues/:name/tasks -------------------------------------------------
CASES += [
    invalid("POST", TASKS, {}, ("payload",), "enqueue: no payload"),
    invalid("POST", TASKS, {"payload": None}, ("payload",), "enqueue: null payload"),
    invalid("POST", TASKS, b"", ("payload",), "enqueue: empty body"),
]
CASES += [
    invalid("POST", TASKS, {**OK, "priority": v}, ("priority",), f"enqueue: priority {k}")
    for k, v in {**NOT_AN_INT, "zero": 0, "11": 11, "negative": -1, "1e-999": 0.0}.items()
]
CASES += [
    invalid("POST", TASKS, {**OK, "scheduled_at": v}, ("scheduled_at",), f"enqueue: time {k}")
    for k, v in BAD_TIMES.items()
]
CASES += [
    invalid("POST", TASKS, {**OK, "delay_seconds": v}, ("delay_seconds",), f"enqueue: delay {k}")
    for k, v in {
        "string": "5",
        "bool": True,
        "null": None,
        "list": [5],
        "object": {"s": 5},
        "negative": -1,
        "negative float": -0.001,
        "huge int": BIG_INT,
        "huge float": 1e300,
    }.items()
]
CASES += [
    invalid("POST", TASKS, {**OK, "idempotency_key": v}, ("idempotency_key",), f"enqueue: key {k}")
    for k, v in {**NOT_A_STRING, "empty": "", "201 chars": "k" * 201}.items()
]
CASES += [
    invalid("POST", TASKS, {**OK, "max_retries": v}, ("max_retries",), f"enqueue: mr {k}")
    for k, v in {**NOT_AN_INT, "negative": -1, "101": 101}.items()
]
CASES += [
    invalid(
        "POST",
        TASKS,
        {**OK, "scheduled_at": "2030-01-01T00:00:00Z", "delay_seconds": 5},
        ("delay_seconds",),
        "enqueue: scheduled_at and delay_seconds",
    ),
    invalid("POST", TASKS, {**OK, "prio": 1}, ("prio",), "enqueue: unknown field"),
    invalid("POST", TASKS, {**OK, "status": "done"}, ("status",), "enqueue: status"),
    invalid("POST", TASKS, {**OK, "attempts": 9}, ("attempts",), "enqueue: attempts"),
    invalid("POST", TASKS, {**OK, "queue": "other"}, ("queue",), "enqueue: queue"),
    invalid("POST", TASKS, b"[]", ("non_field_errors",), "enqueue: body is a list"),
    invalid("POST", TASKS, b'"payload"', ("non_field_errors",), "enqueue: body is a string"),
    invalid("POST", TASKS, b"1.5", ("non_field_errors",), "enqueue: body is a number"),
]
# Strings Postgres jsonb cannot store, anywhere in the payload.
CASES += [
    invalid("POST", TASKS, body, (field,), f"enqueue: {k}")
    for k, body, field in [
        ("NUL in payload", b'{"payload": "a\\u0000b"}', "payload"),
        ("NUL in nested string", b'{"payload": {"k": ["x", "\\u0000"]}}', "payload.k[1]"),
        ("NUL in payload key", b'{"payload": {"a\\u0000": 1}}', "payload.a\\u0000"),
        ("lone surrogate", b'{"payload": "\\ud800"}', "payload"),
        ("lone surrogate in list", b'{"payload": [1, "\\udfff"]}', "payload[1]"),
        ("lone surrogate in key", b'{"payload": {"\\ud800": 1}}', "payload.\\ud800"),
        ("NUL in top-level key", b'{"payload": 1, "\\u0000": 1}', "\\u0000"),
        ("surrogate top-level key", b'{"payload": 1, "\\ud800x": 1}', "\\ud800x"),
        ("upper-case surrogate escape", b'{"payload": ["\\uDBFF"]}', "payload[0]"),
        (
            "NUL in idempotency key",
            b'{"payload": 1, "idempotency_key": "\\u0000"}',
            "idempotency_key",
        ),
    ]
]
CASES += [
    parse_error("POST", TASKS, body, f"enqueue: {k}")
    for k, body in {
        "NaN payload": b'{"payload": NaN}',
        "Infinity payload": b'{"payload": Infinity}',
        "-Infinity in payload list": b'{"payload": [1, -Infinity]}',
        "1e999 payload": b'{"payload": 1e999}',
        "-1e999 nested": b'{"payload": {"x": -1e999}}',
        "1e999 priority": b'{"payload": 1, "priority": 1e999}',
        "5000-digit integer payload": b'{"payload": ' + b"7" * 5000 + b"}",
        "5000-digit negative integer": b'{"payload": [-' + b"7" * 5000 + b"]}",
        "duplicate top-level key": b'{"payload": 1, "payload": 2}',
        "duplicate key in payload": b'{"payload": {"a": 1, "a": 2}}',
        "duplicate key deep in payload": b'{"payload": [{"x": {"a": 1, "b": 2, "a": 1}}]}',
        "invalid UTF-8 in payload": b'{"payload": "\xc3\x28"}',
        "overlong UTF-8 NUL": b'{"payload": "\xc0\x80"}',
        "UTF-8 encoded surrogate": b'{"payload": "\xed\xa0\x80"}',
        "truncated": b'{"payload": {"a": [1, 2',
        "deeply nested payload": b'{"payload": ' + b'{"a": ' * 50_000 + b"1" + b"}" * 50_001,
    }.items()
]
CASES += [
    unsupported("POST", TASKS, raw(OK), "text/plain", "enqueue: text/plain"),
    unsupported("POST", TASKS, b"payload=1", "application/x-www-form-urlencoded", "enqueue: form"),
]

# --- POST /queues/:name/tasks/batch ------------------------------------------
CASES += [
    invalid("POST", BATCH, body, ("tasks",), f"batch: tasks {k}")
    for k, body in {
        "missing": {},
        "null": {"tasks": None},
        "a string": {"tasks": "x"},
        "an object": {"tasks": {"0": OK}},
        "empty": {"tasks": []},
        "1001 items": {"tasks": [{"payload": i} for i in range(1001)]},
    }.items()
]
CASES += [
    invalid(
        "POST",
        BATCH,
        batch_of(OK, OK, OK, {"payload": 1, "priority": "5"}),
        ("tasks[3].priority",),
        "batch: priority string in item 3",
    ),
    invalid(
        "POST",
        BATCH,
        batch_of(OK, {"payload": 1, "priority": True}),
        ("tasks[1].priority",),
        "batch: priority bool in item 1",
    ),
    invalid(
        "POST",
        BATCH,
        batch_of(OK, {"payload": 1, "priority": 1.5}),
        ("tasks[1].priority",),
        "batch: priority float in item 1",
    ),
    invalid(
        "POST",
        BATCH,
        batch_of({"payload": 1, "priority": BIG_INT}),
        ("tasks[0].priority",),
        "batch: priority 10**30",
    ),
    invalid(
        "POST",
        BATCH,
        batch_of(OK, {"payload": None}),
        ("tasks[1].payload",),
        "batch: null payload in item 1",
    ),
    invalid("POST", BATCH, batch_of(OK, {}), ("tasks[1].payload",), "batch: no payload"),
    invalid(
        "POST",
        BATCH,
        batch_of(OK, {"payload": 1, "prio": 2}),
        ("tasks[1].prio",),
        "batch: unknown field in item",
    ),
    invalid("POST", BATCH, batch_of(OK, 5), ("tasks[1]",), "batch: item is a number"),
    invalid("POST", BATCH, batch_of([OK]), ("tasks[0]",), "batch: item is a list"),
    invalid("POST", BATCH, batch_of(OK, None), ("tasks[1]",), "batch: item is null"),
    invalid(
        "POST",
        BATCH,
        batch_of(
            {"payload": 1, "priority": "1"},
            OK,
            {"payload": 1, "scheduled_at": "2030-01-01T00:00:00"},
        ),
        ("tasks[0].priority", "tasks[2].scheduled_at"),
        "batch: two bad items",
    ),
    invalid(
        "POST",
        BATCH,
        batch_of({"payload": 1, "scheduled_at": "2030-01-01T00:00:00Z", "delay_seconds": 1}),
        ("tasks[0].delay_seconds",),
        "batch: scheduled_at and delay_seconds",
    ),
    invalid("POST", BATCH, {"tasks": [OK], "atomic": True}, ("atomic",), "batch: unknown field"),
    invalid("POST", BATCH, [OK], ("non_field_errors",), "batch: body is a list of tasks"),
    invalid(
        "POST",
        BATCH,
        b'{"tasks": [{"payload": 1}, {"payload": {"k": "\\u0000"}}]}',
        ("tasks[1].payload.k",),
        "batch: NUL in item payload",
    ),
    parse_error("POST", BATCH, b'{"tasks": [{"payload": {"a": 1, "a": 2}}]}', "batch: dup key"),
    parse_error("POST", BATCH, b'{"tasks": [{"payload": NaN}]}', "batch: NaN in item"),
    parse_error("POST", BATCH, b'{"tasks": [{"payload": 1}, ', "batch: truncated"),
    unsupported("POST", BATCH, raw(batch_of(OK)), "text/plain", "batch: text/plain"),
]

# --- the worker protocol: a worker id and queue names as sent ------------------
WORKER_BODIES: dict[str, dict[str, Any]] = {
    "/workers/claim": {"queues": ["mq"]},
    "/workers/heartbeat": {"task_id": "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"},
    "/workers/heartbeat/batch": {"items": [{"task_id": "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"}]},
    "/workers/ack": {"task_id": "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"},
    "/workers/ack/batch": {"items": [{"task_id": "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10"}]},
    "/workers/nack": {"task_id": "6f1c1f9e-8a51-4a7e-9a43-3c1b9f7d2a10", "error": "boom"},
}
CASES += [
    invalid("POST", path, {**body, "worker_id": v}, ("worker_id",), f"{path}: worker_id {k}")
    for path, body in WORKER_BODIES.items()
    for k, v in {
        "padded with a newline": " w1\n",
        "trailing newline": "w1\n",
        "leading tab": "\tw1",
        "trailing space": "w1 ",
        "control character": "w\u00011",
    }.items()
]
CASES += [
    invalid("POST", "/workers/claim", {"worker_id": "w1", "queues": v}, (f,), f"claim: queues {k}")
    for k, v, f in [
        ("leading space", [" mq"], "queues[0]"),
        ("trailing newline", ["x", "mq\n"], "queues[1]"),
        ("control character", ["m\u0001q"], "queues[0]"),
    ]
]

# --- wrong content type everywhere a body is read ----------------------------
CASES += [
    unsupported("POST", QUEUES, raw({"name": "q"}), "text/plain", "create queue: text/plain"),
    unsupported("POST", QUEUES, b"name=q", "application/x-www-form-urlencoded", "create: form"),
    unsupported(
        "POST",
        QUEUES,
        b'--b\r\nContent-Disposition: form-data; name="name"\r\n\r\nq\r\n--b--\r\n',
        "multipart/form-data; boundary=b",
        "create queue: multipart",
    ),
    unsupported("POST", QUEUES, raw({"name": "q"}), "application/xml", "create queue: xml"),
    unsupported("POST", QUEUES, raw({"name": "q"}), None, "create queue: no content type"),
    unsupported("PATCH", QUEUE, raw({"paused": True}), "text/plain", "patch queue: text/plain"),
    unsupported("PATCH", QUEUE, b"paused=1", "application/x-www-form-urlencoded", "patch: form"),
]

# --- ids in URLs --------------------------------------------------------------
CASES += [
    not_found(method, path.replace("{task}", task_id), f"{method} {path}: task id {k}")
    for method, path in [("GET", TASK), ("DELETE", TASK), ("GET", EVENTS)]
    for k, task_id in {
        "word": "not-a-uuid",
        "integer": "123",
        "uuid with junk": "{task}x",
        "uuid prefix": "0b5e6a2c",
        "uuid with extra group": "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d-0000",
        "random uuid": "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d",
        "task of another queue": "{other_task}",
        "percent-encoded NUL": "%00",
    }.items()
]
CASES += [
    not_found("GET", "/queues/no-such-queue", "unknown queue"),
    not_found("GET", "/queues/no-such-queue/tasks", "tasks of unknown queue"),
    not_found("POST", "/queues/no-such-queue/pause", "pause unknown queue"),
    not_found("GET", "/queues/" + "q" * 300, "queue name too long to exist"),
    not_found("GET", "/queues/%00", "queue name is NUL"),
    not_found("GET", "/queues/a%00b/tasks", "queue name holds NUL"),
    not_found("DELETE", "/queues/%00", "delete queue named NUL"),
]

# --- query parameters ---------------------------------------------------------
CASES += [
    query(TASKS, f"status={v}", ("status",), f"list tasks: status {k}")
    for k, v in {"unknown": "finished", "upper case": "PENDING", "NUL": "%00"}.items()
]
CASES += [
    query(TASKS, f"{name}=", (name,), f"list tasks: {name} empty")
    for name in ("status", "created_after", "created_before")
]
CASES += [
    query(TASKS, "claimed_by=a%00b", ("claimed_by",), "list tasks: claimed_by NUL"),
    query(TASKS, "claimed_by=" + "w" * 201, ("claimed_by",), "list tasks: claimed_by too long"),
]
CASES += [
    query(path, f"limit={v}", ("limit",), f"{path}: limit {k}")
    for path in (QUEUES, TASKS, EVENTS)
    for k, v in {
        "0": "0",
        "501": "501",
        "abc": "abc",
        "negative": "-1",
        "float": "1.5",
        "empty": "",
        "huge": str(BIG_INT),
        "superscript two": "%C2%B2",
        "arabic digits": "%D9%A1%D9%A0",
        "spaces": "%205",
        # Past Python's 4,300-digit limit, int() raises ValueError (a 500, before).
        "5000 digits": "9" * 5000,
        "5000 zeros": "0" * 5000,
    }.items()
]
CASES += [
    query(path, "limit=" + "7" * 4301, ("limit",), f"{path}: limit of 4301 digits")
    for path in (SCHEDULES, "/workers", "/audit", "/queues/{queue}/dlq")
]
CASES += [
    query(TASKS, f"{name}={v}", (name,), f"list tasks: {name} {k}")
    for name in ("created_after", "created_before")
    for k, v in {
        "words": "yesterday",
        "naive": "2020-01-01T00:00:00",
        "year 10000": "10000-01-01T00:00:00Z",
        "offset as space": "2020-01-01T00:00:00 00:00",
        "NUL": "2020-01-01T00:00:00Z%00",
    }.items()
]
_SOME_TIME = {"t": "2020-01-01T00:00:00+00:00"}
_SOME_ID = "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d"
CASES += [
    query(path, f"cursor={c}", ("cursor",), f"{path}: cursor {k}")
    for path, cursors in [
        (
            TASKS,
            {
                "garbage": "!!!",
                "bad base64": "a",
                "not json": cursor(b"not json"),
                "not utf-8": cursor(b"\xff\xfe"),
                "an object": cursor({"a": 1}),
                "too short": cursor([_SOME_TIME]),
                "too long": cursor([_SOME_TIME, "x", "y"]),
                "strings": cursor(["x", "y"]),
                "nulls": cursor([None, None]),
                "bools": cursor([True, False]),
                "bad time": cursor([{"t": "yesterday"}, "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d"]),
                "time in id": cursor([_SOME_TIME, _SOME_TIME]),
                "huge int id": cursor([_SOME_TIME, 10**50]),
                "list in id": cursor([_SOME_TIME, [1]]),
            },
        ),
        (
            QUEUES,
            {
                # A `\ud800` escape decodes to a lone surrogate, which Postgres refuses (a 500).
                "lone surrogate": cursor(b'["\\ud800", "' + _SOME_ID.encode() + b'"]'),
                "lone low surrogate": cursor(b'["a\\udfff", "' + _SOME_ID.encode() + b'"]'),
                "strings": cursor(["a", "not-a-uuid"]),
                "NUL in name": cursor(["a\u0000", "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d"]),
                "time as id": cursor(["a", _SOME_TIME]),
                "huge int id": cursor(["a", 10**50]),
            },
        ),
        ("/workers", {"lone surrogate": cursor(b'["\\ud800"]'), "NUL": cursor(["w\u0000"])}),
        (
            SCHEDULES,
            {"lone surrogate": cursor(b'["n\\ud83d", "' + _SOME_ID.encode() + b'"]')},
        ),
        (
            EVENTS,
            {
                "one value (an earlier version's)": cursor([5]),
                "string id": cursor(["x", 1]),
                "time id": cursor([_SOME_TIME, 1]),
                "float id": cursor([1.5, 1]),
                "float half": cursor([1, 0.5]),
                "bool half": cursor([1, True]),
                "too long": cursor([1, 1, 1]),
            },
        ),
    ]
    for k, c in cursors.items()
]
AUDIT = "/audit"
CASES += [
    query(AUDIT, f"{name}={v}", (name,), f"audit: {name} {k}")
    for name, values in {
        "action": {"unknown": "queue.explode", "upper case": "QUEUE.PAUSE", "empty": ""},
        "actor": {"NUL": "a%00b", "too long": "a" * 201, "empty": ""},
        "queue": {"NUL": "a%00b", "too long": "q" * 101, "empty": ""},
        "after": {"words": "yesterday", "naive": "2020-01-01T00:00:00", "empty": ""},
        "before": {"year 10000": "10000-01-01T00:00:00Z", "NUL": "2020-01-01T00:00:00Z%00"},
        "limit": {"0": "0", "501": "501", "float": "1.5"},
        "cursor": {
            "garbage": "!!!",
            "strings": cursor(["x", "y"]),
            "time as id": cursor([_SOME_TIME, _SOME_TIME]),
            "too short": cursor([_SOME_TIME]),
        },
    }.items()
    for k, v in values.items()
]

# --- size limits --------------------------------------------------------------
CASES += [
    too_large(
        "POST",
        TASKS,
        {"payload": "x" * 100},
        "enqueue: payload over a lowered limit",
        TASKFORGE_MAX_PAYLOAD_BYTES=64,
    ),
    too_large(
        "POST",
        TASKS,
        {"payload": {"k": "\u00e9" * 40}},
        "enqueue: limit counts UTF-8 bytes",
        TASKFORGE_MAX_PAYLOAD_BYTES=64,
    ),
    too_large(
        "POST",
        BATCH,
        batch_of(OK, {"payload": "x" * 100}),
        "batch: one item too large",
        TASKFORGE_MAX_PAYLOAD_BYTES=64,
    ),
    too_large("POST", TASKS, {"payload": "x" * 262_144}, "enqueue: payload over default limit"),
    too_large(
        "POST",
        QUEUES,
        {"name": "q", "pad": "x" * 300},
        "create queue: body over limit",
        TASKFORGE_MAX_REQUEST_BYTES=200,
    ),
    too_large(
        "POST",
        TASKS,
        {"payload": "x" * 300},
        "enqueue: body over request limit",
        TASKFORGE_MAX_REQUEST_BYTES=200,
    ),
    too_large(
        "PATCH",
        QUEUE,
        b" " * 300 + b"{}",
        "patch queue: body over request limit",
        TASKFORGE_MAX_REQUEST_BYTES=200,
    ),
    too_large(
        "POST",
        BATCH,
        b"not even json" * 30,
        "batch: junk over request limit",
        TASKFORGE_MAX_REQUEST_BYTES=200,
    ),
]


# --- schedules: POST /queues/:name/schedules, PATCH and the paths ---------------
CRON = {"name": "new", "cron": "@daily", "payload": 1}
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "name": v}, ("name",), f"create schedule: name {k}")
    for k, v in {
        **NOT_A_STRING,
        "empty": "",
        "slash": "a/b",
        "NUL": "a\u0000b",
        "leading space": " new",
        "trailing newline": "new\n",
        "control character": "n\u007fw",
    }.items()
]
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "cron": v}, ("cron",), f"create schedule: cron {k}")
    for k, v in {
        **NOT_A_STRING,
        "empty": "",
        "six fields": "0 0 * * * *",
        "four fields": "0 * * *",
        "out of range": "60 * * * *",
        "extension": "0 0 L * *",
        "never": "0 0 30 2 *",
        "reboot": "@reboot",
        "NUL": "0 0 * * \u0000",
        "201 chars": "*" * 201,
    }.items()
]
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "timezone": v}, ("timezone",), f"create: tz {k}")
    for k, v in {
        **NOT_A_STRING,
        "empty": "",
        "unknown": "Mars/Olympus",
        "path": "/etc/localtime",
        "NUL": "UTC\u0000",
    }.items()
]
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "priority": v}, ("priority",), f"create: prio {k}")
    for k, v in {**NOT_AN_INT, "zero": 0, "11": 11}.items()
]
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "max_retries": v}, ("max_retries",), f"create: mr {k}")
    for k, v in {**NOT_AN_INT, "negative": -1, "101": 101}.items()
    if k != "null"  # null is "the queue's"
]
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "paused": v}, ("paused",), f"create: paused {k}")
    for k, v in NOT_A_BOOL.items()
]
CASES += [
    invalid("POST", SCHEDULES, {**CRON, "payload": None}, ("payload",), "create: payload null"),
    invalid("POST", SCHEDULES, {"name": "x", "cron": "@daily"}, ("payload",), "create: no payload"),
    invalid("POST", SCHEDULES, {**CRON, "crom": "x"}, ("crom",), "create schedule: unknown field"),
    invalid("POST", SCHEDULES, {**CRON, "id": "x"}, ("id",), "create schedule: read-only id"),
    invalid("POST", SCHEDULES, b"[]", ("non_field_errors",), "create schedule: body is a list"),
    invalid("PATCH", SCHEDULE, {"name": "renamed"}, ("name",), "patch schedule: name"),
    invalid("PATCH", SCHEDULE, {"cron": "* * * * * *"}, ("cron",), "patch schedule: 6 fields"),
    invalid("PATCH", SCHEDULE, {"payload": None}, ("payload",), "patch schedule: payload null"),
    invalid("PATCH", SCHEDULE, {"next_run_at": None}, ("next_run_at",), "patch: next_run_at"),
    invalid("PATCH", SCHEDULE, {"paused": "no"}, ("paused",), "patch schedule: paused string"),
    query(SCHEDULES, "limit=0", ("limit",), "list schedules: limit 0"),
    query(SCHEDULES, "cursor=%25%25", ("cursor",), "list schedules: bad cursor"),
    parse_error("POST", SCHEDULES, b'{"name": "x",', "create schedule: truncated JSON"),
    parse_error("PATCH", SCHEDULE, b'{"paused": true, "paused": false}', "patch: duplicate key"),
    unsupported("POST", SCHEDULES, b"name=x", "application/x-www-form-urlencoded", "sched: form"),
    not_found("GET", "/queues/nope/schedules", "list schedules: unknown queue"),
    not_found("GET", "/queues/{queue}/schedules/nope", "get schedule: unknown"),
    not_found("GET", "/queues/{queue}/schedules/bad%00name", "get schedule: NUL in the path"),
    not_found("DELETE", "/queues/{queue}/schedules/nope", "delete schedule: unknown"),
    not_found("PATCH", "/queues/other-q/schedules/{schedule}", "patch: another queue's name"),
    too_large(
        "POST",
        SCHEDULES,
        {**CRON, "payload": "x" * 100},
        "create schedule: payload over limit",
        TASKFORGE_MAX_PAYLOAD_BYTES=64,
    ),
    too_large(
        "PATCH",
        SCHEDULE,
        b" " * 300 + b"{}",
        "patch schedule: body over request limit",
        TASKFORGE_MAX_REQUEST_BYTES=200,
    ),
]


@pytest.fixture
def world() -> dict[str, str]:
    """A queue `mq` holding a task and a schedule, and a task of another queue."""
    task = TaskFactory(queue=QueueFactory(name="mq"))
    ScheduleFactory(queue=task.queue, name="nightly")
    other = TaskFactory(queue=QueueFactory(name="other-q"))
    return {"queue": "mq", "task": str(task.id), "other_task": str(other.id), "schedule": "nightly"}


def snapshot() -> tuple[Any, ...]:
    return (
        sorted(Queue.objects.values_list("name", "max_retries", "rate_limit", "paused")),
        sorted(Task.objects.values_list("id", "status", "updated_at")),
        TaskEvent.objects.count(),
        AuditEntry.objects.count(),
        sorted(Schedule.objects.values_list("name", "cron", "timezone", "paused", "updated_at")),
    )


def send(client: APIClient, case: Case, world: dict[str, str]) -> TestResponse:
    path = case.path.format(**world)
    if case.content_type is None:
        # No Content-Type header at all (APIClient would default one).
        return send_raw(client, case.method, path, case.body, content_type="", CONTENT_TYPE="")
    return send_raw(client, case.method, path, case.body, content_type=case.content_type)


def assert_error_body(response: TestResponse, case: Case) -> None:
    assert response.status_code == case.status, response.content[:500]
    assert response["Content-Type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["code"] == case.code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "Traceback" not in error["message"]
    if case.fields is None:
        assert set(error) == {"code", "message"}
    else:
        assert set(error) == {"code", "message", "fields"}
        assert set(error["fields"]) == set(case.fields)
        for messages in error["fields"].values():
            assert messages
            assert all(isinstance(m, str) and m for m in messages)


@pytest.mark.parametrize("case", CASES)
def test_malformed_input__answers_4xx_json_and_stores_nothing(
    case: Case, world: dict[str, str], admin_client: APIClient, settings: Any
) -> None:
    for name, value in case.settings:
        setattr(settings, name, value)
    before = snapshot()

    response = send(admin_client, case, world)

    assert_error_body(response, case)
    assert snapshot() == before


# --- the boundaries of the limits above: just inside is accepted --------------


# --- query strings Django refuses to parse ---------------------------------------

MANY_PARAMS = "&".join(f"p{n}=1" for n in range(1001))


@pytest.mark.parametrize(
    ("method", "path", "role"),
    [
        ("GET", QUEUES, "producer"),
        ("GET", QUEUE, "worker"),
        ("GET", TASKS, "producer"),
        ("POST", "/workers/claim", "worker"),  # a hot endpoint, through DRF with a query
        ("GET", "/workers", "admin"),
        ("GET", "/audit", "admin"),
        ("GET", "/api/schema/", None),  # public
    ],
)
def test_query_string__over_1000_parameters_is_400_after_401(
    method: str,
    path: str,
    role: str | None,
    world: dict[str, str],
    make_client: Callable[[str | None], APIClient],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression: Django's TooManyFieldsSent, raised by content negotiation before
    authentication, was a 500 on every endpoint, logged with the whole URL."""
    url = f"{path.format(**world)}?{MANY_PARAMS}"
    if role is not None:
        response = send_raw(make_client(None), method, url, b"{}", content_type=JSON)
        assert response.status_code == status.HTTP_401_UNAUTHORIZED
        assert response.json()["error"]["code"] == "unauthenticated"

    response = send_raw(make_client(role), method, url, b"{}", content_type=JSON)

    assert_error_body(
        response, Case(method, url, b"", 400, "invalid", fields=("non_field_errors",))
    )
    assert "1000 parameters" in response.json()["error"]["message"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_query_string__1000_parameters_are_read(
    world: dict[str, str], producer_client: APIClient
) -> None:
    params = "&".join(f"p{n}=1" for n in range(999))
    response = producer_client.get(f"/queues/mq/tasks?{params}&limit=1")
    assert response.status_code == status.HTTP_200_OK, response.content[:300]


def test_limit__leading_zeros_past_4300_digits_are_still_the_number(
    world: dict[str, str], producer_client: APIClient
) -> None:
    response = producer_client.get("/queues/mq/tasks?limit=" + "0" * 5000 + "1")
    assert response.status_code == status.HTTP_200_OK, response.content[:300]
    assert len(response.json()["results"]) == 1


def test_payload_limit__payload_of_exactly_the_limit_is_accepted(
    world: dict[str, str], producer_client: APIClient, settings: Any
) -> None:
    payload = "x" * 62  # '"' + 62 + '"' = 64 bytes of JSON
    settings.TASKFORGE_MAX_PAYLOAD_BYTES = 64

    response = producer_client.post("/queues/mq/tasks", {"payload": payload}, format="json")

    assert response.status_code == status.HTTP_201_CREATED
    assert response.json()["payload"] == payload


def test_request_limit__body_of_exactly_the_limit_is_accepted(
    world: dict[str, str], admin_client: APIClient, settings: Any
) -> None:
    body = b'{"name": "edge"}'
    settings.TASKFORGE_MAX_REQUEST_BYTES = len(body)

    response = send_raw(admin_client, "POST", "/queues", body, content_type=JSON)

    assert response.status_code == status.HTTP_201_CREATED


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        pytest.param(b'{"payload": "\\ud83d\\ude00"}', "\U0001f600", id="escaped surrogate pair"),
        pytest.param('{"payload": "\U0001f600"}'.encode(), "\U0001f600", id="raw UTF-8 emoji"),
        pytest.param(b'{"payload": ' + b"7" * 40 + b"}", int("7" * 40), id="40-digit integer"),
        pytest.param(b'{"payload": 1e308}', 1e308, id="largest-ish double"),
        pytest.param(b'{"payload": {"a": {"a": 1}}}', {"a": {"a": 1}}, id="same key, two levels"),
        pytest.param(b'{"payload": "\\\\u0000"}', "\\u0000", id="escaped backslash, then u0000"),
        pytest.param(b'{"payload": "\\ud83d\\ude00"}', "\U0001f600", id="escaped surrogate pair"),
    ],
)
def test_enqueue__strict_parser_still_accepts_valid_json(
    body: bytes,
    expected: Any,
    world: dict[str, str],
    producer_client: APIClient,
) -> None:
    response = send_raw(producer_client, "POST", "/queues/mq/tasks", body, content_type=JSON)

    assert response.status_code == status.HTTP_201_CREATED, response.content
    assert response.json()["payload"] == expected
    stored = Task.objects.get(pk=response.json()["id"]).payload
    if isinstance(expected, float):  # jsonb keeps the number, not its float-ness
        stored = float(stored)
    assert stored == expected


def test_make_client_fixture_type(make_client: Callable[[str | None], APIClient]) -> None:
    """The malformed table runs as admin; a producer meets the same parser."""
    client = make_client("producer")
    QueueFactory(name="pq")

    response = send_raw(client, "POST", "/queues/pq/tasks", b'{"payload": NaN}', content_type=JSON)

    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "parse_error"


@pytest.mark.parametrize(
    ("body", "python_words"),
    [
        pytest.param(b'{"payload": ' + b"7" * 5000 + b"}", "sys.", id="5000-digit integer"),
        pytest.param(
            b'{"payload": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
            "recursion",
            id="deep nesting",
        ),
        pytest.param(b'{"payload": 1, "delay_seconds": 1' + b"0" * 30 + b"}", "String", id="big"),
    ],
)
def test_malformed_input__messages_speak_json_not_python(
    body: bytes, python_words: str, world: dict[str, str], producer_client: APIClient
) -> None:
    """Regression: these answered "use sys.set_int_max_str_digits()", "maximum
    recursion depth exceeded" and "String value too large." for a number."""
    response = send_raw(producer_client, "POST", "/queues/mq/tasks", body, content_type=JSON)

    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert python_words.lower() not in response.content.decode().lower()
