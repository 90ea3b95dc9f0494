"""One JSON log line per HTTP request, through the one LOGGING configuration.

Why a middleware and not gunicorn's access log: gunicorn formats its access
log with %-atoms into a string it does not JSON-escape (a quote in a path
breaks the line), through its own logging setup rather than the settings'
JSON formatter; the middleware's lines go through `JsonFormatter` like every
other record, in every server (gunicorn, runserver, tests).  What it cannot
see: requests gunicorn refuses before Django (malformed HTTP) and workers
killed on timeout, which gunicorn's error log reports.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse, HttpResponseBase

from taskforge.api.peer import client_address
from taskforge.lib import logging as json_logging

logger = logging.getLogger("taskforge.request")


class RequestLogMiddleware:
    """Logs `http.request` with method, path, status, duration_ms, remote_addr and pid.

    First in MIDDLEWARE, so the duration covers every other middleware and a
    view's exception is already a 500 response here.  The path is logged
    without its query string (which may carry secrets).  For a streaming
    response the duration ends when the response starts, not when it ends.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        log_request(request, response, started)
        return response


def log_request(request: HttpRequest, response: HttpResponseBase, started: float) -> None:
    """The `http.request` line of a request answered `response`, begun at `started`
    (time.perf_counter())."""
    json_logging.info(
        logger,
        "http.request",
        {
            "method": request.method,
            "path": request.path,
            "status": response.status_code,
            "duration_ms": round((time.perf_counter() - started) * 1000, 3),
            "remote_addr": client_address(request),
            "pid": os.getpid(),
        },
    )
