"""taskforge.urls plus a view that shows the request as the application sees it, for
servers started by tests/test_header_names.py (settings: tests.settings_echo)."""

from __future__ import annotations

from django.http import HttpRequest, JsonResponse
from django.urls import re_path

from taskforge.urls import handler400, handler403, handler404, handler500
from taskforge.urls import urlpatterns as taskforge_urlpatterns

__all__ = ["handler400", "handler403", "handler404", "handler500", "urlpatterns"]


def echo(request: HttpRequest) -> JsonResponse:
    meta = request.META
    return JsonResponse(
        {
            "secure": request.is_secure(),
            "headers": {key: value for key, value in meta.items() if key.startswith("HTTP_")},
            "script_name": meta.get("SCRIPT_NAME", ""),
        }
    )


urlpatterns = [
    *taskforge_urlpatterns,
    # Also under /x/: a server that took SCRIPT_NAME from a request header would strip it.
    re_path(r"^(?:x/)?echo$", echo),
]
