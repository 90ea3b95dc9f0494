"""The one exception handler: every API error leaves in API.md's shape.

`{"error": {"code", "message", "fields"?}}` for validation errors, auth and
permission failures, missing objects, our domain errors, outages (503) and,
last, anything unexpected (500 `internal`, logged with its traceback).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, TooManyFieldsSent
from django.db import DatabaseError
from django.http import Http404
from rest_framework import exceptions as drf
from rest_framework import status
from rest_framework.renderers import JSONRenderer
from rest_framework.response import Response
from rest_framework.views import set_rollback

from taskforge.api.bodies import Invalid
from taskforge.api.responses import error_body
from taskforge.errors import TaskForgeError
from taskforge.lib import outages, pg

logger = logging.getLogger(__name__)

_DRF_CODES: list[tuple[type[drf.APIException], str]] = [
    (drf.ParseError, "parse_error"),
    (drf.ValidationError, "invalid"),
    (drf.NotAuthenticated, "unauthenticated"),
    (drf.AuthenticationFailed, "unauthenticated"),
    (drf.PermissionDenied, "forbidden"),
    (drf.NotFound, "not_found"),
    (drf.MethodNotAllowed, "method_not_allowed"),
    (drf.NotAcceptable, "not_acceptable"),
    (drf.UnsupportedMediaType, "unsupported_media_type"),
    (drf.Throttled, "throttled"),
]


class PayloadTooLarge(drf.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request or its payload is too large."
    default_code = "payload_too_large"


def flatten_errors(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's nested error detail as `{"tasks[3].priority": ["..."]}`."""
    fields: dict[str, list[str]] = {}
    if isinstance(detail, dict):
        for key, value in detail.items():
            if key == "non_field_errors":
                path = prefix or "non_field_errors"
            elif isinstance(key, int):  # a list item's errors, keyed by its index
                path = f"{prefix}[{key}]"
            else:
                path = f"{prefix}.{key}" if prefix else str(key)
            for name, messages in flatten_errors(value, path).items():
                fields.setdefault(name, []).extend(messages)
    elif isinstance(detail, list):
        if all(isinstance(item, str) for item in detail):
            fields[prefix or "non_field_errors"] = [str(item) for item in detail]
        else:
            for index, item in enumerate(detail):
                if item:
                    for name, messages in flatten_errors(item, f"{prefix}[{index}]").items():
                        fields.setdefault(name, []).extend(messages)
    else:
        fields[prefix or "non_field_errors"] = [str(detail)]
    return fields


def _code_for(exc: drf.APIException) -> str:
    for cls, code in _DRF_CODES:
        if isinstance(exc, cls):
            return code
    return getattr(exc, "default_code", "error")


def _message_for(exc: drf.APIException) -> str:
    detail = exc.detail
    if isinstance(detail, str):
        return str(detail)
    return "The request is not valid."


def _render_as_json(context: dict[str, Any]) -> None:
    """Errors are JSON whatever the view renders (the schema view: YAML, docs: HTML).

    DRF renders an error response with the renderer negotiated for the view;
    it keeps one already set on the request.
    """
    request = context.get("request")
    if request is not None:
        request.accepted_renderer = JSONRenderer()
        request.accepted_media_type = "application/json"


def validation_message(fields: dict[str, list[str]]) -> str:
    """The `message` of a 400 `invalid`: the one message, or the fields named."""
    if list(fields) == ["non_field_errors"] and len(fields["non_field_errors"]) == 1:
        return fields["non_field_errors"][0]
    message = "Invalid input: " + ", ".join(sorted(fields)[:10])
    if len(fields) > 10:
        message += f" and {len(fields) - 10} more"
    return message + "."


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """Render `exc` as an API error response; never returns None."""
    _render_as_json(context)
    status_code, body, headers = error_answer(exc)
    return Response(body, status=status_code, headers=headers)


def error_answer(exc: Exception) -> tuple[int, dict[str, Any], dict[str, str]]:
    """The status, body and headers that answer `exc`: DRF's views and the hot ones'."""
    headers: dict[str, str] = {}
    if isinstance(exc, Invalid):
        set_rollback()
        fields = exc.fields
        return (
            status.HTTP_400_BAD_REQUEST,
            error_body("invalid", validation_message(fields), fields),
            headers,
        )
    if isinstance(exc, Http404):
        exc = drf.NotFound(str(exc) if str(exc) else "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        exc = PayloadTooLarge()
    elif isinstance(exc, TooManyFieldsSent):
        # Django's message names its setting; this one the limit (API.md: 400 `invalid`).
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        exc = drf.ValidationError(f"The query string has more than {limit} parameters.")

    if isinstance(exc, TaskForgeError):
        set_rollback()
        if exc.status_code == status.HTTP_401_UNAUTHORIZED:
            headers["WWW-Authenticate"] = 'Bearer realm="taskforge"'
        return exc.status_code, error_body(exc.code, exc.message), headers

    if isinstance(exc, drf.APIException):
        set_rollback()
        if isinstance(exc, drf.NotAuthenticated | drf.AuthenticationFailed):
            headers["WWW-Authenticate"] = 'Bearer realm="taskforge"'
            exc.status_code = status.HTTP_401_UNAUTHORIZED
        wait = getattr(exc, "wait", None)  # Throttled's seconds to wait
        if wait:
            headers["Retry-After"] = str(int(wait))
        if isinstance(exc, drf.ValidationError):
            fields = flatten_errors(exc.detail)
            body = error_body("invalid", validation_message(fields), fields)
        else:
            body = error_body(_code_for(exc), _message_for(exc))
        return exc.status_code, body, headers

    set_rollback()
    if outages.is_outage(exc):
        logger.warning("request.unavailable", extra={"error": repr(exc)})
        if outages.read_only(exc):
            pg.discard_connection()  # on a standby: the next one finds the primary
        if isinstance(exc, DatabaseError):
            pg.check_pool_soon()  # the pool's other connections may be dead too
        return (
            status.HTTP_503_SERVICE_UNAVAILABLE,
            error_body("unavailable", "A backing service (Postgres or Redis) is unavailable."),
            {"Retry-After": "1"},
        )
    if isinstance(exc, DatabaseError):
        logger.exception("request.database_error", exc_info=exc)
    else:
        logger.exception("request.internal_error", exc_info=exc)
    return (
        status.HTTP_500_INTERNAL_SERVER_ERROR,
        error_body("internal", "An unexpected error occurred."),
        headers,
    )
