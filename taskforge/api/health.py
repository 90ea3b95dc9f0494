"""/healthz (the process serves) and /readyz (Postgres and Redis answer).

/readyz is public, so it says which check failed and never why (API.md
v1.1): the reason (an error naming hosts, ports or roles) goes to the log,
and into the answer only for a caller with an admin key.  Its checks run at
most once a second per process, however often probes and strangers call.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from redis.cluster import RedisCluster
from rest_framework.exceptions import AuthenticationFailed

from taskforge.api.authentication import ApiKeyAuthentication
from taskforge.api.responses import error_response
from taskforge.lib import pg, sql
from taskforge.lib.redisconn import connect
from taskforge.lib.ttlcache import TTLCache

logger = logging.getLogger(__name__)

READY_TIMEOUT_SECONDS = 2
READY_CACHE_SECONDS = 1.0
_ready_cache: TTLCache[dict[str, str]] = TTLCache(READY_CACHE_SECONDS)

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
    reasons = _ready_cache.get("checks")
    if reasons is None:
        reasons = {"postgres": _check_postgres(), "redis": _check_redis()}
        for name, reason in reasons.items():
            if reason != "ok":
                logger.warning("readyz.check_failed", extra={"check": name, "reason": reason})
        _ready_cache.put("checks", reasons)
    ready = all(reason == "ok" for reason in reasons.values())
    detailed = not ready and _is_admin(request)
    checks = {
        name: reason if detailed or reason == "ok" else "failed" for name, reason in reasons.items()
    }
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": checks},
        status=200 if ready else 503,
    )


def forget_readiness() -> None:
    """Run the checks again at the next call (tests)."""
    _ready_cache.clear()


def _is_admin(request: HttpRequest) -> bool:
    try:
        found = ApiKeyAuthentication().authenticate(request)  # type: ignore[arg-type]
    except (AuthenticationFailed, DatabaseError):  # unknown key, or no database to ask
        return False
    return found is not None and found[0].role == "admin"


def _check_postgres() -> str:
    # A fresh short-lived connection: the pooled one may hang on a dead
    # server for the full TCP timeout, and readiness must answer quickly.
    try:
        with pg.connect_own(connect_timeout=READY_TIMEOUT_SECONDS) as conn:
            # LOCAL: behind a transaction pooler a plain SET would outlive this
            # check on the server connection and bind whoever gets it next.
            conn.execute(sql.LOCAL_STATEMENT_TIMEOUT, [str(READY_TIMEOUT_SECONDS * 1000)])
            conn.execute(sql.PROBE)
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).strip()[:200]}"
    return "ok"


def _check_redis() -> str:
    # A fresh client, as for Postgres.  For a cluster: every primary answers
    # and the cluster says all its slots are served.
    client = None
    try:
        client = connect(
            settings.REDIS_URL,
            socket_connect_timeout=READY_TIMEOUT_SECONDS,
            socket_timeout=READY_TIMEOUT_SECONDS,
        )
        if isinstance(client, RedisCluster):
            client.ping(target_nodes=RedisCluster.PRIMARIES)
            state = client.cluster_info().get("cluster_state")
            if state != "ok":
                return f"error: cluster_state is {state}"
        else:
            client.ping()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {str(exc).strip()[:200]}"
    finally:
        if client is not None:
            client.close()
    return "ok"
