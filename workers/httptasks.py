"""Delivering tasks with an HTTP target (the Cloud Tasks API's; API-cloudtasks.md "Delivery").

The push processes (`workers.pusher`) take these from every queue's push lane
and send each attempt as the task says: its method, URL, headers and body
bytes exactly, with the `X-CloudTasks-*` headers, TaskForge's own, and an
OIDC ID token when the task asks for one (`workers.oidc`).  What each attempt
got is kept on the task (`http_attempts`: responses, executions, the last
attempt) before its outcome is recorded, so the next attempt's headers and
the task's `lastAttempt` read it.
"""

from __future__ import annotations

import base64
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from django.db import connection
from multidict import CIMultiDict

from queues import push
from taskforge.lib import jsonutil
from tasks.models import Task
from workers import oidc, sql

if TYPE_CHECKING:
    from workers.delivery import Outcome

USER_AGENT = "Google-Cloud-Tasks"

# google.rpc.Code of an HTTP status (API-cloudtasks.md "Task": lastAttempt.responseStatus).
_RPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 10, 429: 8, 499: 1, 501: 12, 503: 14, 504: 4}
DEADLINE_EXCEEDED = 4
UNAVAILABLE = 14


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """One attempt of a task with an HTTP target, as its push process sends it."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    deadline: float
    task_name: str
    retry_count: int
    execution_count: int
    previous_response: int | None
    eta: float
    # The attempt's OIDC ID token (workers.oidc), minted when the attempt is
    # handed out, in the feeder's thread (the key is read from Postgres there).
    token: str | None


def request_of(task: Task) -> HttpRequest:
    """The attempt a handed-out task (status executing, attempts counted) is to send."""
    http = task.http_request
    assert http is not None
    state: dict[str, Any] = task.http_attempts or {}
    return HttpRequest(
        method=http["http_method"],
        url=http["url"],
        headers=dict(http.get("headers") or {}),
        body=base64.b64decode(http["body"]) if http.get("body") else b"",
        deadline=float(http.get("dispatch_deadline_seconds", 600)),
        task_name=task.name if task.name is not None else str(task.pk),
        retry_count=task.attempts - 1,
        execution_count=int(state.get("execution_count", 0)),
        previous_response=state.get("previous_response"),
        eta=task.scheduled_at.timestamp(),
        token=token_for(http, url=http["url"]),
    )


def target_of(request: HttpRequest) -> push.PushTarget:
    """The request as a push target, for what names it in errors and logs."""
    return push.PushTarget(url=request.url, timeout_seconds=math.ceil(request.deadline))


def headers_of(
    request: HttpRequest,
    *,
    task_id: str,
    queue: str,
    attempt: int,
    secret: str,
    now: float,
    token: str | None,
) -> CIMultiDict[str]:
    """The attempt's headers: the task's own, then Cloud Tasks' and TaskForge's, which win."""
    headers: CIMultiDict[str] = CIMultiDict(request.headers)
    headers["User-Agent"] = USER_AGENT
    headers["X-CloudTasks-QueueName"] = queue
    headers["X-CloudTasks-TaskName"] = request.task_name
    headers["X-CloudTasks-TaskRetryCount"] = str(request.retry_count)
    headers["X-CloudTasks-TaskExecutionCount"] = str(request.execution_count)
    headers["X-CloudTasks-TaskETA"] = f"{request.eta:.6f}"
    if request.previous_response is not None:
        headers["X-CloudTasks-TaskPreviousResponse"] = str(request.previous_response)
        headers["X-CloudTasks-TaskRetryReason"] = ""
    headers[push.TASK_ID_HEADER] = task_id
    headers[push.QUEUE_HEADER] = queue
    headers[push.ATTEMPT_HEADER] = str(attempt)
    if secret:
        headers[push.SIGNATURE_HEADER] = push.signature(secret, request.body, int(now))
    if token is not None:
        headers.popall("Authorization", None)
        headers["Authorization"] = f"Bearer {token}"
    return headers


def token_for(http: dict[str, Any], *, url: str) -> str | None:
    """A fresh OIDC ID token for an attempt, when its task asks for one (workers.oidc):
    `aud` its audience, else its URL."""
    token = http.get("oidc_token")
    if not token:
        return None
    return oidc.mint(audience=token.get("audience") or url, email=token["service_account_email"])


def rpc_code(status: int | None, kind: str) -> int:
    """The google.rpc.Code of an attempt's outcome."""
    if status is None:
        return DEADLINE_EXCEEDED if kind == "timeout" else UNAVAILABLE
    if 200 <= status < 300:
        return 0
    if status in _RPC_CODES:
        return _RPC_CODES[status]
    return 9 if 400 <= status < 500 else 13


@dataclass(frozen=True, slots=True)
class Attempt:
    """What one attempt got, for the task's `http_attempts`."""

    task_id: str
    attempt: int
    dispatched_at: datetime
    scheduled_at: float
    status: int | None
    kind: str
    message: str


def record(attempts: Sequence[Attempt], *, now: datetime) -> None:
    """Keep what each attempt got on its task, in one statement (before its outcome)."""
    if not attempts:
        return
    rows = []
    for a in attempts:
        last: dict[str, Any] = {
            "scheduleTime": _time(datetime.fromtimestamp(a.scheduled_at, UTC)),
            "dispatchTime": _time(a.dispatched_at),
            "responseStatus": {"code": rpc_code(a.status, a.kind), "message": a.message},
        }
        if a.status is not None:
            last["responseTime"] = _time(now)
        rows.append(
            (
                a.task_id,
                a.attempt,
                int(a.status is not None),
                int(a.status is not None and not 500 <= a.status <= 599),
                a.status,
                jsonutil.dumps(last).decode(),
            )
        )
    with connection.cursor() as cursor:
        cursor.execute(
            sql.RECORD_HTTP_ATTEMPTS, [list(column) for column in zip(*rows, strict=True)]
        )


def record_outcomes(outcomes: Sequence[Outcome]) -> None:
    """`record` the attempts of tasks with an HTTP target among these outcomes."""
    now = datetime.now(UTC)
    record(
        [
            Attempt(
                o.job.task_id,
                o.job.attempt,
                o.job.dispatched_at or now,
                o.job.http.eta,
                o.status,
                o.kind,
                o.error or "OK",
            )
            for o in outcomes
            if o.job.http is not None
        ],
        now=now,
    )


def _time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
