"""The /v2/ endpoints (API-cloudtasks.md "Methods"): one plain Django view on the
normal route, which authenticates, routes the path and verb, checks the role
and the query, and runs the method.  Every answer but a 200 is a
google.rpc.Status (`cloudtasks.errors`), never HTML or a traceback.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from cloudtasks import errors, methods
from cloudtasks import protojson as pj
from cloudtasks.errors import RpcError
from taskforge import tracing
from taskforge.api.authentication import ApiKeyAuthentication
from taskforge.api.models import Role
from taskforge.audit.log import Actor
from taskforge.conf import conf
from taskforge.lib.redisconn import REDIS_FAILURES
from workers import oidc

logger = logging.getLogger(__name__)

_P = r"projects/(?P<project>[A-Za-z0-9.:-]{1,100})/locations/(?P<location>[A-Za-z0-9-]{1,100})"
_Q = _P + r"/queues/(?P<queue>[^/:]+)"
_T = _Q + r"/tasks/(?P<task>[^/:]+)"

ANY = frozenset(Role.values)
ADMIN = frozenset({Role.ADMIN})
PRODUCER = frozenset({Role.PRODUCER, Role.ADMIN})

COMMON_PARAMS = frozenset({"$alt", "alt", "$prettyPrint", "prettyPrint", "$.xgafv", "$xgafv"})


@dataclass(frozen=True, slots=True)
class Route:
    pattern: re.Pattern[str]
    verb: str
    method: Callable[[methods.Call], dict[str, Any]]
    roles: frozenset[str]
    params: frozenset[str] = frozenset()


def _r(
    pattern: str,
    verb: str,
    method: Callable[[methods.Call], dict[str, Any]],
    roles: frozenset[str],
    *params: str,
) -> Route:
    return Route(re.compile(f"^{pattern}$"), verb, method, roles, frozenset(params))


ROUTES = (
    _r(_P + "/queues", "GET", methods.list_queues, ANY, "pageSize", "pageToken", "filter"),
    _r(_P + "/queues", "POST", methods.create_queue, ADMIN),
    _r(_Q, "GET", methods.get_queue, ANY),
    _r(_Q, "PATCH", methods.update_queue, ADMIN, "updateMask"),
    _r(_Q, "DELETE", methods.delete_queue, ADMIN),
    _r(_Q + ":purge", "POST", methods.purge_queue, ADMIN),
    _r(_Q + ":pause", "POST", methods.pause_queue, ADMIN),
    _r(_Q + ":resume", "POST", methods.resume_queue, ADMIN),
    _r(_Q + "/tasks", "GET", methods.list_tasks, PRODUCER, "responseView", "pageSize", "pageToken"),
    _r(_Q + "/tasks", "POST", methods.create_task, PRODUCER),
    _r(_T, "GET", methods.get_task, PRODUCER, "responseView"),
    _r(_T, "DELETE", methods.delete_task, PRODUCER),
    _r(_T + ":run", "POST", methods.run_task, ADMIN),
)

# Cloud Tasks methods TaskForge does not serve: 501 naming the method.
UNIMPLEMENTED = (
    (re.compile(f"^{_Q}:getIamPolicy$"), "GetIamPolicy"),
    (re.compile(f"^{_Q}:setIamPolicy$"), "SetIamPolicy"),
    (re.compile(f"^{_Q}:testIamPermissions$"), "TestIamPermissions"),
    (re.compile(f"^{_Q}/tasks:batchCreate$"), "BatchCreateTasks"),
    (re.compile(f"^{_Q}/tasks:batchDelete$"), "BatchDeleteTasks"),
    (re.compile(f"^{_P}/cmekConfig$"), "GetCmekConfig / UpdateCmekConfig"),
    (re.compile(r"^projects/[^/]+/locations(/[^/]+)?$"), "GetLocation / ListLocations"),
    (re.compile(r"^(projects/[^/]+/locations/[^/]+/)?operations(/.*)?$"), "Operations"),
)


def body_limit() -> int:
    """The largest /v2 body read: twice the task limit plus 64 KiB (API-cloudtasks.md)."""
    return 2 * conf.CLOUDTASKS_MAX_TASK_BYTES + 65536


@csrf_exempt
def v2(request: HttpRequest, path: str) -> HttpResponse:
    """Every request under /v2/."""
    try:
        return errors.ok(_serve(request, path))
    except RpcError as error:
        return errors.response(error)
    except DatabaseError:
        logger.warning("cloudtasks.unavailable", exc_info=True)
        return errors.response(errors.unavailable())
    except REDIS_FAILURES:
        logger.warning("cloudtasks.unavailable", exc_info=True)
        return errors.response(errors.unavailable())
    except Exception:
        logger.exception("cloudtasks.internal_error", extra={"path": request.path})
        return errors.response(errors.internal())


def _serve(request: HttpRequest, path: str) -> dict[str, Any]:
    actor, role = _authenticate(request)
    verb = request.method or "GET"
    for pattern, name in UNIMPLEMENTED:
        if pattern.match(path):
            raise errors.unimplemented(name)
    match = None
    route = None
    for candidate in ROUTES:
        found = candidate.pattern.match(path)
        if found is not None and candidate.verb == verb:
            match, route = found, candidate
            break
    if route is None or match is None:
        raise errors.not_found(f"No method {verb} {request.path}.")
    if role not in route.roles:
        raise errors.permission_denied("The API key's role may not call this method.")
    query = _query(request, route.params)
    out = pj.Output(
        enum_numbers="enum-encoding=int" in (query.get("$alt") or query.get("alt") or "")
    )
    raw = b""
    if verb in ("POST", "PATCH"):
        length = request.META.get("CONTENT_LENGTH")
        if length and length.isdigit() and int(length) > body_limit():
            raise errors.invalid("task", f"The request body is larger than {body_limit()} bytes.")
        raw = request.body
        if len(raw) > body_limit():
            raise errors.invalid("task", f"The request body is larger than {body_limit()} bytes.")
    call = methods.Call(
        project=match.group("project"),
        location=match.group("location"),
        queue_id=match.groupdict().get("queue"),
        task_id=match.groupdict().get("task"),
        query=query,
        body=pj.parse_body(raw),
        actor=actor,
        out=out,
        trace=tracing.from_headers(request.META),
    )
    return route.method(call)


def _authenticate(request: HttpRequest) -> tuple[Actor, str]:
    try:
        found = ApiKeyAuthentication().authenticate(cast(Request, request))
    except AuthenticationFailed as exc:
        raise errors.unauthenticated(str(exc.detail)) from exc
    if found is None:
        raise errors.unauthenticated("Use 'Authorization: Bearer <api key>'.")
    principal, key = found
    return Actor.api_key(key.name), principal.role


def _query(request: HttpRequest, allowed: frozenset[str]) -> dict[str, str]:
    query: dict[str, str] = {}
    for name, values in request.GET.lists():
        if name not in allowed and name not in COMMON_PARAMS:
            raise errors.invalid(name, f"Unknown query parameter {name!r}.")
        if len(values) > 1:
            raise errors.invalid(name, f"Query parameter {name!r} is given more than once.")
        query[name] = values[0]
    alt = query.get("$alt", query.get("alt"))
    if alt is not None and alt not in ("json", "json;enum-encoding=int"):
        raise errors.invalid("$alt", "$alt must be json or json;enum-encoding=int.")
    return query


def jwks(request: HttpRequest) -> HttpResponse:
    """GET /.well-known/jwks.json (public): the keys ID tokens are signed with."""
    return _public(request, oidc.jwks)


def openid_configuration(request: HttpRequest) -> HttpResponse:
    """GET /.well-known/openid-configuration (public)."""
    return _public(request, oidc.configuration)


def _public(request: HttpRequest, answer: Callable[[], dict[str, Any]]) -> HttpResponse:
    if request.method not in ("GET", "HEAD"):
        return errors.response(RpcError(405, "METHOD_NOT_ALLOWED", "Use GET."))
    try:
        if request.path.endswith("jwks.json"):
            oidc.signing_key()  # the key exists before anyone asks for a token
        return errors.ok(answer())
    except DatabaseError:
        logger.warning("cloudtasks.unavailable", exc_info=True)
        return errors.response(errors.unavailable())
