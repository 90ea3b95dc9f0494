"""Assertions shared by the cross-cutting tests."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rest_framework.response import _MonkeyPatchedResponse as TestResponse
    from rest_framework.test import APIClient

# The fields of a transition's JSON log line (API.md, Operations).
TRANSITION_FIELDS = {
    "ts",
    "event",
    "task_id",
    "queue",
    "worker_id",
    "from_status",
    "to_status",
    "attempt",
    "duration_ms",
}


def assert_error(response: Any, code: int, error_code: str) -> dict[str, Any]:
    """The response is API.md's error body with this status and code (no `fields`)."""
    assert response.status_code == code, response.content
    assert response["Content-Type"] == "application/json"
    body: dict[str, Any] = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message"}
    assert body["error"]["code"] == error_code
    assert isinstance(body["error"]["message"], str)
    assert body["error"]["message"]
    return body


def send_raw(client: APIClient, method: str, path: str, body: bytes, **extra: Any) -> TestResponse:
    """`client.generic` with a body of bytes, sent as they are (invalid UTF-8 included).

    Django encodes a str body and passes bytes through; DRF's stubs accept only a str.
    """
    return client.generic(method, path, body, **extra)  # type: ignore[arg-type]
