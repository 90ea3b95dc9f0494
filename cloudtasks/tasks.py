"""A Cloud Tasks Task, seen from a TaskForge task (API-cloudtasks.md "Task")."""

from __future__ import annotations

from typing import Any

from cloudtasks import protojson as pj
from cloudtasks.taskbody import DEFAULT_DEADLINE, METHODS, VIEWS
from tasks.models import Task

USER_AGENT = "Google-Cloud-Tasks"


def task_id(task: Task) -> str:
    """A task's ID over /v2: the name given at creation, else its native id."""
    return task.name if task.name is not None else str(task.pk)


def shown(task: Task, queue_path: str, *, view: str, out: pj.Output) -> dict[str, Any]:
    """The Task message; `view` FULL includes the body."""
    body: dict[str, Any] = {
        "name": f"{queue_path}/tasks/{task_id(task)}",
        "scheduleTime": pj.show_time(task.scheduled_at),
        "createTime": pj.show_time(task.created_at),
        "dispatchCount": task.attempts,
        "view": out.enum(view, VIEWS),
    }
    http = task.http_request
    attempts: dict[str, Any] = task.http_attempts or {}
    body["responseCount"] = attempts.get("response_count", 0)
    if http is not None:
        request: dict[str, Any] = {
            "url": http["url"],
            "httpMethod": out.enum(http["http_method"], METHODS),
            "headers": {**http.get("headers", {}), "User-Agent": USER_AGENT},
        }
        if view == "FULL" and http.get("body"):
            request["body"] = http["body"]
        oidc = http.get("oidc_token")
        if oidc:
            request["oidcToken"] = {
                "serviceAccountEmail": oidc["service_account_email"],
                "audience": oidc.get("audience", ""),
            }
        body["httpRequest"] = request
        body["dispatchDeadline"] = pj.show_duration(
            http.get("dispatch_deadline_seconds", DEFAULT_DEADLINE)
        )
    if task.first_claimed_at is not None:
        body["firstAttempt"] = {"dispatchTime": pj.show_time(task.first_claimed_at)}
    last = attempts.get("last")
    if last:
        body["lastAttempt"] = last
    elif task.claimed_at is not None:
        body["lastAttempt"] = {
            "scheduleTime": pj.show_time(task.claimed_at),
            "dispatchTime": pj.show_time(task.claimed_at),
        }
    if task.retry_config:
        config = task.retry_config
        body["retryConfig"] = {
            "maxAttempts": config.get("max_attempts", 100),
            "minBackoff": pj.show_duration(config["min_backoff_seconds"]),
            "maxBackoff": pj.show_duration(config["max_backoff_seconds"]),
            "maxDoublings": config["max_doublings"],
            "maxRetryDuration": pj.show_duration(config["max_retry_duration_seconds"]),
        }
    return body
