"""Django's own error pages as API errors: no HTML page ever leaves the API.

The dashboard under /admin/ keeps Django's HTML pages.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.views import defaults

from taskforge.api.responses import error_response

logger = logging.getLogger(__name__)


def _is_dashboard(request: HttpRequest) -> bool:
    return request.path.startswith("/admin/")


def bad_request(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_dashboard(request):
        return defaults.bad_request(request, exception)
    return error_response(400, "invalid", "Bad request.")


def permission_denied(request: HttpRequest, exception: Exception) -> HttpResponse:
    if _is_dashboard(request):
        return defaults.permission_denied(request, exception)
    return error_response(403, "forbidden", "Forbidden.")


def page_not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_dashboard(request):
        return defaults.page_not_found(request, exception)
    return error_response(404, "not_found", "No such endpoint.")


def server_error(request: HttpRequest) -> HttpResponse:
    if _is_dashboard(request):
        return defaults.server_error(request)
    return error_response(500, "internal", "An unexpected error occurred.")
