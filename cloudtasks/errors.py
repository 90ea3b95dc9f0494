"""google.rpc.Status answers (API-cloudtasks.md "Conventions under /v2/").

Every non-2xx answer under /v2/ is `{"error": {"code": <HTTP status>, "message",
"status", "details"}}`; a bad input names its field in a BadRequest detail.
"""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from taskforge.lib import jsonutil

BAD_REQUEST_TYPE = "type.googleapis.com/google.rpc.BadRequest"


class RpcError(Exception):
    """An answer other than 200: the HTTP status, the google.rpc code name, a message."""

    def __init__(self, http: int, status: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.http = http
        self.status = status
        self.message = message
        self.field = field

    def body(self) -> dict[str, Any]:
        details: list[dict[str, Any]] = []
        if self.field is not None:
            details.append(
                {
                    "@type": BAD_REQUEST_TYPE,
                    "fieldViolations": [{"field": self.field, "description": self.message}],
                }
            )
        return {
            "error": {
                "code": self.http,
                "message": self.message,
                "status": self.status,
                "details": details,
            }
        }


def invalid(field: str, message: str) -> RpcError:
    """400 INVALID_ARGUMENT naming `field` (a path from the request's top)."""
    return RpcError(400, "INVALID_ARGUMENT", message, field)


def not_found(message: str = "Requested entity was not found.") -> RpcError:
    return RpcError(404, "NOT_FOUND", message)


def already_exists(message: str = "Requested entity already exists") -> RpcError:
    return RpcError(409, "ALREADY_EXISTS", message)


def failed_precondition(message: str) -> RpcError:
    return RpcError(400, "FAILED_PRECONDITION", message)


def unauthenticated(message: str) -> RpcError:
    return RpcError(401, "UNAUTHENTICATED", message)


def permission_denied(message: str) -> RpcError:
    return RpcError(403, "PERMISSION_DENIED", message)


def unimplemented(method: str) -> RpcError:
    return RpcError(501, "UNIMPLEMENTED", f"{method} is not served by TaskForge.")


def unavailable() -> RpcError:
    return RpcError(503, "UNAVAILABLE", "The service is unavailable; try again.")


def internal() -> RpcError:
    return RpcError(500, "INTERNAL", "Internal error.")


def response(error: RpcError) -> HttpResponse:
    answer = HttpResponse(
        jsonutil.dumps(error.body()), status=error.http, content_type="application/json"
    )
    if error.http == 401:
        answer["WWW-Authenticate"] = 'Bearer realm="taskforge"'
    return answer


def ok(body: dict[str, Any]) -> HttpResponse:
    return HttpResponse(jsonutil.dumps(body), content_type="application/json")
