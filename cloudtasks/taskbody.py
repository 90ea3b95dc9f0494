"""Reading a CreateTask's Task message (API-cloudtasks.md "Task", "Bad input").

`read` turns the message into what `transitions.NewTask` stores: the task ID,
the `http_request` in its native form, the due time and the task's own retry
policy.  Every refusal is a 400 INVALID_ARGUMENT naming its field, before
anything is stored.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from cloudtasks import protojson as pj
from cloudtasks.errors import invalid
from queues import push, retrypolicy
from queues.retrypolicy import RetryPolicy
from taskforge.conf import conf

TASK_ID = re.compile(r"^[A-Za-z0-9_-]{1,500}$")
METHODS = ("HTTP_METHOD_UNSPECIFIED", "POST", "GET", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS")
WITH_BODY = frozenset({"POST", "PUT", "PATCH"})
VIEWS = ("VIEW_UNSPECIFIED", "BASIC", "FULL")

MAX_URL = 2083
MAX_HEADER_BYTES = 81920
MAX_SCHEDULE_AHEAD = timedelta(days=30)
MIN_DEADLINE, MAX_DEADLINE, DEFAULT_DEADLINE = 15.0, 1800.0, 600.0
MAX_EMAIL, MAX_AUDIENCE = 254, 2083

TASK_FIELDS = (
    "name",
    "httpRequest",
    "appEngineHttpRequest",
    "scheduleTime",
    "dispatchDeadline",
    "retryConfig",
)
# Output-only fields: ignored in a request, as Cloud Tasks does.
TASK_OUTPUT = (
    "createTime",
    "dispatchCount",
    "responseCount",
    "firstAttempt",
    "lastAttempt",
    "view",
)
HTTP_FIELDS = ("url", "httpMethod", "headers", "body", "oidcToken", "oauthToken")

_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Dropped at creation: Cloud Tasks ignores or replaces them.
_DROPPED = frozenset(
    {
        "host",
        "content-length",
        "user-agent",
        "connection",
        "keep-alive",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_DROPPED_PREFIXES = ("proxy-", "x-cloudtasks-", "x-google-", "x-appengine-", "taskforge-")


@dataclass(frozen=True, slots=True)
class TaskBody:
    task_id: str | None
    http_request: dict[str, Any]
    scheduled_at: datetime
    retry_config: dict[str, Any] | None


def read(value: Any, *, now: datetime, queue_path: str) -> TaskBody:
    """The Task of a CreateTask body, validated.

    Raises:
        RpcError: any bad input of the contract's table.
    """
    top = pj.fields(value, "task.", TASK_FIELDS, ignored=TASK_OUTPUT)
    if "appEngineHttpRequest" in top:
        raise invalid(
            "task.appEngineHttpRequest",
            "App Engine tasks are not supported by TaskForge; use httpRequest",
        )
    if "httpRequest" not in top:
        raise invalid("task.httpRequest", "A task needs an httpRequest.")
    task_id = None
    if "name" in top:
        task_id = task_id_of(pj.string(top["name"], "task.name"), queue_path)
    http = _http(top["httpRequest"])
    scheduled = now
    if "scheduleTime" in top:
        scheduled = pj.timestamp(top["scheduleTime"], "task.scheduleTime")
        if scheduled - now > MAX_SCHEDULE_AHEAD:
            raise invalid("task.scheduleTime", "scheduleTime is more than 30 days ahead.")
        scheduled = max(scheduled, now)
    deadline = DEFAULT_DEADLINE
    if "dispatchDeadline" in top:
        deadline = pj.duration(
            top["dispatchDeadline"], "task.dispatchDeadline", MIN_DEADLINE, MAX_DEADLINE
        )
    http["dispatch_deadline_seconds"] = deadline
    retry = _retry(top["retryConfig"]) if "retryConfig" in top else None
    _check_size(http)
    return TaskBody(task_id, http, scheduled, retry)


def task_id_of(name: str, queue_path: str) -> str:
    """The task ID of a full task name, which must be under the path's queue."""
    prefix = f"{queue_path}/tasks/"
    if not name.startswith(prefix):
        raise invalid("task.name", f"The task name must start with {prefix!r}.")
    task_id = name[len(prefix) :]
    if not TASK_ID.fullmatch(task_id):
        raise invalid("task.name", "A task ID is 1 to 500 of A-Z a-z 0-9 _ -.")
    return task_id


def _http(value: Any) -> dict[str, Any]:
    http = pj.fields(value, "task.httpRequest.", HTTP_FIELDS)
    if "oauthToken" in http:
        raise invalid(
            "task.httpRequest.oauthToken",
            "oauthToken is not supported; use oidcToken or an Authorization header",
        )
    if "url" not in http:
        raise invalid("task.httpRequest.url", "httpRequest.url is required.")
    url = check_url(pj.string(http["url"], "task.httpRequest.url"))
    method = "POST"
    if "httpMethod" in http:
        method = pj.enum(http["httpMethod"], "task.httpRequest.httpMethod", METHODS)
        if method == METHODS[0]:
            method = "POST"
    body: bytes | None = None
    if "body" in http:
        body = pj.bytes_(http["body"], "task.httpRequest.body")
        if body and method not in WITH_BODY:
            raise invalid("task.httpRequest.body", f"A {method} request has no body.")
    headers = _headers(http.get("headers", {}))
    oidc = _oidc(http["oidcToken"]) if "oidcToken" in http else None
    return {
        "url": url,
        "http_method": method,
        "headers": headers,
        "body": pj.show_bytes(body) if body else None,
        "oidc_token": oidc,
    }


def check_url(url: str) -> str:
    """A task's URL: its form here, then the push destination rule of API.md
    "Security (v1.2)" (`destination_allowed`).

    Raises:
        RpcError: naming `task.httpRequest.url`.
    """
    field = "task.httpRequest.url"
    if len(url) > MAX_URL:
        raise invalid(field, f"The URL is longer than {MAX_URL} characters.")
    if any(char.isspace() or unicodedata.category(char) == "Cc" for char in url):
        raise invalid(field, "The URL may not contain spaces or control characters.")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises ValueError for a port out of range)
    except ValueError as exc:
        raise invalid(field, "The URL is not valid.") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise invalid(field, "The URL must be http:// or https:// with a host.")
    if parts.fragment or "#" in url:
        raise invalid(field, "The URL may not have a fragment.")
    try:
        # The destination rule of push targets (API.md "Security (v1.2)"), on the
        # URL's origin: the host decides, and a task's URL may be longer than a
        # push queue's.  A host name is judged at each attempt (workers.destinations).
        push.check_url(f"{parts.scheme}://{parts.netloc}/")
    except push.InvalidPush as exc:
        raise invalid(field, str(exc).replace("'url'", "The URL")) from exc
    return url


def _headers(value: Any) -> dict[str, str]:
    if not isinstance(value, dict):
        raise invalid("task.httpRequest.headers", "headers must be an object of strings.")
    kept: dict[str, str] = {}
    size = 0
    for name, item in value.items():
        field = f"task.httpRequest.headers[{name!r}]"
        if not _TOKEN.fullmatch(name):
            raise invalid(field, "A header name must be an HTTP token.")
        if not isinstance(item, str) or any(c in item for c in "\r\n\x00"):
            raise invalid(field, "A header value must be a string without CR, LF or NUL.")
        size += len(name.encode()) + len(item.encode())
        lower = name.lower()
        if lower in _DROPPED or lower.startswith(_DROPPED_PREFIXES):
            continue
        kept[name] = item
    if size > MAX_HEADER_BYTES:
        raise invalid("task.httpRequest.headers", "The headers are larger than 80 KB.")
    return kept


def _oidc(value: Any) -> dict[str, str]:
    token = pj.fields(value, "task.httpRequest.oidcToken.", ("serviceAccountEmail", "audience"))
    field = "task.httpRequest.oidcToken.serviceAccountEmail"
    email = pj.string(token.get("serviceAccountEmail", ""), field)
    if not 1 <= len(email) <= MAX_EMAIL or email.count("@") != 1:
        raise invalid(field, "serviceAccountEmail must be an email address (1..254 characters).")
    audience = ""
    if "audience" in token:
        audience = pj.string(token["audience"], "task.httpRequest.oidcToken.audience")
        if len(audience) > MAX_AUDIENCE:
            raise invalid(
                "task.httpRequest.oidcToken.audience",
                f"audience is longer than {MAX_AUDIENCE} characters.",
            )
    return {"service_account_email": email, "audience": audience}


def _retry(value: Any) -> dict[str, Any]:
    fields = pj.fields(
        value,
        "task.retryConfig.",
        ("maxAttempts", "minBackoff", "maxBackoff", "maxDoublings", "maxRetryDuration"),
    )
    attempts = retrypolicy.DEFAULT_MAX_ATTEMPTS
    if "maxAttempts" in fields:
        attempts = (
            pj.integer(
                fields["maxAttempts"], "task.retryConfig.maxAttempts", -1, retrypolicy.MAX_ATTEMPTS
            )
            or retrypolicy.DEFAULT_MAX_ATTEMPTS
        )
    policy = RetryPolicy()
    values: dict[str, Any] = {}
    for name, native in (
        ("minBackoff", "min_backoff_seconds"),
        ("maxBackoff", "max_backoff_seconds"),
    ):
        if name in fields:
            seconds = pj.duration(
                fields[name], f"task.retryConfig.{name}", 0, retrypolicy.MAX_BACKOFF_SECONDS
            )
            if seconds:
                values[native] = seconds
    if "maxDoublings" in fields:
        values["max_doublings"] = pj.integer(
            fields["maxDoublings"], "task.retryConfig.maxDoublings", 0, retrypolicy.MAX_DOUBLINGS
        )
    if "maxRetryDuration" in fields:
        values["max_retry_duration_seconds"] = pj.duration(
            fields["maxRetryDuration"],
            "task.retryConfig.maxRetryDuration",
            0,
            retrypolicy.MAX_RETRY_DURATION_SECONDS,
        )
    try:
        policy = retrypolicy.checked(RetryPolicy(**values))
    except retrypolicy.InvalidPolicy as exc:
        raise invalid("task.retryConfig.minBackoff", str(exc)) from exc
    return {**policy.as_json(), "max_attempts": attempts}


def _check_size(http: dict[str, Any]) -> None:
    """Body + URL + header names and values + OIDC fields within the task limit."""
    body = http["body"] or ""
    size = len(body) * 3 // 4 + len(http["url"].encode())
    size += sum(len(k.encode()) + len(v.encode()) for k, v in http["headers"].items())
    if http["oidc_token"]:
        size += sum(len(v.encode()) for v in http["oidc_token"].values())
    if size > conf.CLOUDTASKS_MAX_TASK_BYTES:
        raise invalid("task", f"The task is larger than {conf.CLOUDTASKS_MAX_TASK_BYTES} bytes.")
