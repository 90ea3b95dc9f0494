"""/healthz (the process serves) and /readyz (Postgres and Redis answer)."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from taskforge.api.responses import error_response

READY_TIMEOUT_SECONDS = 2

View = Callable[[HttpRequest], HttpResponse]


def probe(view: View) -> View:
    """GET and HEAD only, answering other methods with API.md's JSON 405.

    Django's `require_GET` answers an empty text/html 405, and the CSRF
    middleware an HTML 403 for a POST; probes change nothing, so no CSRF.
    """

    @wraps(view)
    def wrapper(request: HttpRequest) -> HttpResponse:
        if request.method not in ("GET", "HEAD"):
            response = error_response(
                405, "method_not_allowed", f'Method "{request.method}" not allowed.'
            )
            response["Allow"] = "GET, HEAD"
            return response
        return view(request)

    return csrf_exempt(wrapper)


@probe
def healthz(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"status": "ok"})


@probe
def readyz(request: HttpRequest) -> HttpResponse:
    checks = {"postgres": _check_postgres(), "redis": _check_redis()}
    ready = all(value == "ok" for value in checks.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks},
        status=200 if ready else 503,
    )


def _check_postgres() -> str:
    # A fresh short-lived connection: the pooled one may hang on a dead
    # server for the full TCP timeout, and readiness must answer quickly.
    params = connection.get_connection_params()
    params["connect_timeout"] = READY_TIMEOUT_SECONDS
    params.pop("cursor_factory", None)
    params.pop("context", None)
    try:
        with psycopg.connect(**params) as conn:
            conn.execute(f"SET statement_timeout = {READY_TIMEOUT_SECONDS * 1000}")
            conn.execute("SELECT 1")
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).strip()[:200]}"
    return "ok"


def _check_redis() -> str:
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=READY_TIMEOUT_SECONDS,
        socket_timeout=READY_TIMEOUT_SECONDS,
    )
    try:
        client.ping()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).strip()[:200]}"
    finally:
        client.close()
    return "ok"
