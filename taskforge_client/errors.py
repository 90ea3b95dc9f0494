"""Exceptions raised by the TaskForge client.

Every API error (any non-2xx answer) becomes a `TaskForgeError` subclass carrying the
answer's `code`, HTTP `status`, `message` and, for validation errors, `fields`.
"""

from __future__ import annotations

from typing import Any


class TaskForgeError(Exception):
    """Base class of every error the client raises.

    Attributes:
        code: the API's snake_case error code (`not_found`, `lease_lost`, ...), or
            `connection_error` when the server could not be reached.
        status: the HTTP status, or None when there was no answer.
        message: the API's message for a person.
        fields: per-field validation messages (`invalid` errors only), else an empty dict.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str = "error",
        status: int | None = None,
        fields: dict[str, list[str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.fields: dict[str, list[str]] = dict(fields or {})

    def __str__(self) -> str:
        where = f"{self.status} " if self.status is not None else ""
        text = f"{where}{self.code}: {self.message}"
        if self.fields:
            text += f" {self.fields}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The error in the API's shape: `{"error": {"code", "message", "fields"?}}`."""
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.fields:
            body["fields"] = self.fields
        if self.status is not None:
            body["status"] = self.status
        return {"error": body}


class ConnectionFailed(TaskForgeError):
    """The server could not be reached (refused, reset, timed out), after any retries."""


class Invalid(TaskForgeError):
    """400: `invalid` or `parse_error`; see `fields`."""


class Unauthorized(TaskForgeError):
    """401 `unauthenticated`: the API key is missing or unknown."""


class Forbidden(TaskForgeError):
    """403 `forbidden`: the key's role may not do this."""


class NotFound(TaskForgeError):
    """404 `not_found`."""


class MethodNotAllowed(TaskForgeError):
    """405 `method_not_allowed`."""


class Conflict(TaskForgeError):
    """409: `queue_exists`, `queue_not_empty`, `invalid_state` or `lease_lost`."""


class LeaseLost(Conflict):
    """409 `lease_lost`: this worker no longer holds the task's lease."""


class PayloadTooLarge(TaskForgeError):
    """413 `payload_too_large`."""


class UnsupportedMediaType(TaskForgeError):
    """415 `unsupported_media_type`."""


class ServerError(TaskForgeError):
    """500 `internal` or another unexpected 5xx answer."""


class Unavailable(ServerError):
    """503 `unavailable`: Postgres or Redis is down behind the API."""


_BY_STATUS: dict[int, type[TaskForgeError]] = {
    400: Invalid,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    409: Conflict,
    413: PayloadTooLarge,
    415: UnsupportedMediaType,
    503: Unavailable,
}


def error_from_response(status: int, body: Any) -> TaskForgeError:
    """The exception for a non-2xx answer with (possibly non-JSON) `body`."""
    code, message, fields = "http_error", f"HTTP {status}", None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = str(err.get("code") or code)
        message = str(err.get("message") or message)
        raw_fields = err.get("fields")
        fields = raw_fields if isinstance(raw_fields, dict) else None
    elif isinstance(body, str) and body:
        message = body[:500]
    if code == "lease_lost":
        cls: type[TaskForgeError] = LeaseLost
    else:
        cls = _BY_STATUS.get(status, ServerError if status >= 500 else TaskForgeError)
    return cls(message, code=code, status=status, fields=fields)
