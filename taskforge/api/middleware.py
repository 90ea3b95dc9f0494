"""Request-size guard that answers before Django reads the body."""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from taskforge.api.responses import error_response
from taskforge.conf import conf


class RequestSizeLimitMiddleware:
    """413 `payload_too_large` for a body declared larger than the limit.

    A body without Content-Length is capped by DATA_UPLOAD_MAX_MEMORY_SIZE,
    which the exception handler maps to the same answer.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        length = request.META.get("CONTENT_LENGTH")
        if length and length.isdigit() and int(length) > conf.MAX_REQUEST_BYTES:
            return error_response(
                413,
                "payload_too_large",
                f"The request body is larger than {conf.MAX_REQUEST_BYTES} bytes.",
            )
        return self.get_response(request)
