"""/healthz (the process serves) and /readyz (Postgres and Redis answer)."""

from __future__ import annotations

import psycopg
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

READY_TIMEOUT_SECONDS = 2


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
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
