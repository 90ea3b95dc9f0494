"""Bounded parsing (API.md v1.1 Conventions; issue 14, item 4).

A body over its endpoint's limit is refused before it is parsed (413), the
memory a request takes stays within a small multiple of its body, and JSON
nested deeper than 100 levels is a 400 in a body and in a cursor.
"""

from __future__ import annotations

import base64
import io
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import LazySettings
from django.http import HttpResponse
from rest_framework.request import Request
from rest_framework.test import APIClient, APIRequestFactory

from taskforge.api.middleware import BodyLimitMiddleware, single_task_limit
from taskforge.api.parsers import StrictJSONParser
from taskforge.lib import jsonutil
from tasks.api.views import TaskListView
from tests.helpers import assert_error

TASKS = "/queues/q/tasks"
SINGLE_TASK_PATHS = [TASKS, "/workers/heartbeat", "/workers/ack", "/workers/nack"]


@pytest.fixture
def queue(admin_client: APIClient) -> str:
    assert admin_client.post("/queues", {"name": "q"}, format="json").status_code == 201
    return "q"


def client_for(path: str, producer_client: APIClient, worker_client: APIClient) -> APIClient:
    return worker_client if path.startswith("/workers") else producer_client


def peak_bytes(call: Callable[[], Any]) -> tuple[Any, int]:
    """What `call` returns, and the peak of memory allocated while it ran."""
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        result = call()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak


def empty_objects(size: int) -> bytes:
    """`{"payload": [{},{},...]}` of about `size` bytes: the issue's amplifying body."""
    count = (size - 16) // 3
    return b'{"payload": [' + b"{}," * (count - 1) + b"{}]}"


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def as_cursor(text: bytes) -> str:
    return base64.urlsafe_b64encode(text).decode().rstrip("=")


# -- refused before parsing -------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("path", SINGLE_TASK_PATHS)
def test_single_task_body__over_its_limit_is_413_before_parsing(
    path: str, queue: str, producer_client: APIClient, worker_client: APIClient
) -> None:
    """Regression for issue 14: a 9 MB body of `[{},...]` (under the request limit) was
    parsed into ~200 MB of objects before the payload check refused it."""
    body = empty_objects(9_000_000)
    client = client_for(path, producer_client, worker_client)
    response, peak = peak_bytes(lambda: client.post(path, body, content_type="application/json"))
    assert_error(response, 413, "payload_too_large")
    # The test client copies the body once; nothing is parsed.
    assert peak < 1.5 * len(body), peak


@pytest.mark.django_db
def test_single_task_body__limit_is_twice_the_payload_limit_plus_4096(
    queue: str, producer_client: APIClient, settings: LazySettings
) -> None:
    settings.TASKFORGE_MAX_PAYLOAD_BYTES = 1000
    assert single_task_limit() == 6096
    at_limit = b'{"payload": "' + b"x" * (6096 - 15) + b'"}'
    assert len(at_limit) == 6096
    # At the limit the body is read, and the payload check (1000 bytes) answers.
    response = producer_client.post(TASKS, at_limit, content_type="application/json")
    assert_error(response, 413, "payload_too_large")
    assert b"payload" in response.content.lower()
    over = b'{"payload": "' + b"x" * (6096 - 14) + b'"}'
    response = producer_client.post(TASKS, over, content_type="application/json")
    assert_error(response, 413, "payload_too_large")
    assert response.json()["error"]["message"] == "The request body is larger than 6096 bytes."


@pytest.mark.django_db
def test_other_bodies__keep_the_request_limit(
    queue: str, producer_client: APIClient, settings: LazySettings
) -> None:
    """A batch may be larger than one task's limit, up to TASKFORGE_MAX_REQUEST_BYTES."""
    settings.TASKFORGE_MAX_PAYLOAD_BYTES = 1000
    tasks = [{"payload": "x" * 900} for _ in range(20)]  # ~18 KB, over 6096
    response = producer_client.post(f"{TASKS}/batch", {"tasks": tasks}, format="json")
    assert response.status_code == 201, response.content
    settings.TASKFORGE_MAX_REQUEST_BYTES = 10_000
    response = producer_client.post(f"{TASKS}/batch", {"tasks": tasks}, format="json")
    assert_error(response, 413, "payload_too_large")


# -- memory of an accepted body ---------------------------------------------------------------


@pytest.mark.django_db
def test_accepted_body__costs_a_small_multiple_of_its_size(
    queue: str, producer_client: APIClient
) -> None:
    """A payload near the limit: the body, its text, the parsed value, its compact
    JSON (size check, insert) and the answer, which holds the payload again.

    Most of the peak is the answer: orjson reserves up to 8 bytes per character
    of a string while it encodes (address space it mostly never touches)."""
    body = b'{"payload": {"blob": "' + b"y" * 250_000 + b'", "n": [1, 2, 3]}}'
    response, peak = peak_bytes(
        lambda: producer_client.post(TASKS, body, content_type="application/json")
    )
    assert response.status_code == 201, response.content
    assert peak < 20 * len(body), peak


def test_parsing_an_accepted_body__costs_a_small_multiple_of_its_size() -> None:
    """The parse alone, as a view gets it (`request.data`): the text and the value."""
    body = b'{"payload": {"blob": "' + b"y" * 250_000 + b'", "n": [1, 2, 3]}}'
    request = APIRequestFactory().post(TASKS, body, content_type="application/json")
    assert (
        BodyLimitMiddleware(lambda r: HttpResponse()).process_view(
            request, TaskListView.as_view(), (), {}
        )
        is None
    )

    data, peak = peak_bytes(lambda: Request(request, parsers=[StrictJSONParser()]).data)

    assert data["payload"]["n"] == [1, 2, 3]
    assert peak < 4 * len(body), peak


@pytest.mark.django_db
def test_amplifying_body__within_the_single_task_limit_is_bounded(
    queue: str, producer_client: APIClient
) -> None:
    """The worst a single-task body can cost: `[{},...]` just under its limit.

    Empty objects are the densest JSON in Python objects (~72 bytes each per
    3 bytes of text), and orjson reserves tens of times its output while the
    payload check encodes them: ~90x the body as tracemalloc counts it (~48 MB),
    ~25x resident (orjson never touches most of what it reserves). The endpoint's
    limit is what bounds it; before, a 10 MB body went this way."""
    body = empty_objects(single_task_limit() - 10)
    response, peak = peak_bytes(
        lambda: producer_client.post(TASKS, body, content_type="application/json")
    )
    assert_error(response, 413, "payload_too_large")  # the payload check, after parsing
    assert peak < 100 * single_task_limit(), peak


# -- chunked bodies ---------------------------------------------------------------------------


class CountingStream(io.RawIOBase):
    """A chunked request's input: `size` bytes of `body`, counting what was read."""

    def __init__(self, body: bytes) -> None:
        self.source = io.BytesIO(body)
        self.read_count = 0

    def readable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data = self.source.read(size)
        self.read_count += len(data)
        return data


def send_chunked(client: APIClient, path: str, stream: CountingStream) -> Any:
    """As a WSGI server passes a chunked body: no Content-Length, an input that ends."""
    extra: dict[str, Any] = {
        "wsgi.input": stream,
        "wsgi.input_terminated": True,
        "HTTP_TRANSFER_ENCODING": "chunked",
    }
    return client.generic("POST", path, "", content_type="application/json", **extra)


@pytest.mark.django_db
def test_chunked_body__over_its_limit_is_counted_and_refused(
    queue: str, producer_client: APIClient
) -> None:
    stream = CountingStream(empty_objects(5_000_000))
    response = send_chunked(producer_client, TASKS, stream)
    assert_error(response, 413, "payload_too_large")
    assert stream.read_count == single_task_limit() + 1


@pytest.mark.django_db
def test_chunked_body__within_its_limit_is_read(queue: str, producer_client: APIClient) -> None:
    """Before, Django read a body without Content-Length as empty (a 400)."""
    response = send_chunked(producer_client, TASKS, CountingStream(b'{"payload": {"a": 1}}'))
    assert response.status_code == 201, response.content
    assert response.json()["payload"] == {"a": 1}


# -- nesting ----------------------------------------------------------------------------------


@pytest.mark.django_db
def test_payload_nested_100_levels__is_accepted(queue: str, producer_client: APIClient) -> None:
    body = b'{"payload": ' + nested(99) + b"}"
    response = producer_client.post(TASKS, body, content_type="application/json")
    assert response.status_code == 201, response.content


@pytest.mark.django_db
@pytest.mark.parametrize("depth", [101, 937, 100_000])
def test_body_nested_past_100_levels__is_parse_error(
    depth: int, queue: str, producer_client: APIClient
) -> None:
    """Regression for issue 14: a payload nested 937 levels answered 500."""
    body = b'{"payload": ' + nested(depth - 1) + b"}"
    response = producer_client.post(TASKS, body, content_type="application/json")
    assert_error(response, 400, "parse_error")
    assert "nested deeper than 100" in response.json()["error"]["message"]


@pytest.mark.django_db
def test_brackets_inside_strings__do_not_count_as_nesting(
    queue: str, producer_client: APIClient
) -> None:
    body = b'{"payload": "' + b"[{" * 500 + b'\\"[" }'
    response = producer_client.post(TASKS, body, content_type="application/json")
    assert response.status_code == 201, response.content


@pytest.mark.django_db
@pytest.mark.parametrize("depth", [101, 937, 5000, 100_000])
def test_cursor_nested_past_100_levels__is_invalid(
    depth: int, queue: str, producer_client: APIClient, admin_client: APIClient
) -> None:
    """Regression for issue 14: a deeply nested ?cursor= answered 500."""
    cursor = as_cursor(nested(depth))
    for client, path in [
        (producer_client, f"{TASKS}?cursor={cursor}"),
        (admin_client, f"/workers?cursor={cursor}"),
        (admin_client, f"/queues/q/dlq?cursor={cursor}"),
    ]:
        response = client.get(path)
        assert response.status_code == 400, (path[:40], response.content)
        assert response.json()["error"]["code"] == "invalid"
        assert set(response.json()["error"]["fields"]) == {"cursor"}


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"1", 0),
        (b"[]", 1),
        (b'{"a": [{"b": []}]}', 4),
        (b'["]]]", "[[[", "\\"[", {}]', 2),
        (nested(100), 100),
    ],
)
def test_nesting_depth__counts_brackets_outside_strings(text: bytes, depth: int) -> None:
    assert jsonutil.nesting_depth(text) == depth


def test_loads__refuses_deep_nesting_before_parsing() -> None:
    assert jsonutil.loads(nested(100)) == jsonutil.loads(nested(100))
    with pytest.raises(jsonutil.Refused, match="deeper than 100"):
        jsonutil.loads(nested(101))
