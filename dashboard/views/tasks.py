"""The task inspector: search, one task's page, its live status, cancel."""

from __future__ import annotations

import base64
import json
import re
import uuid
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.http import (
    HttpRequest,
    HttpResponse,
    JsonResponse,
)
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone

from dashboard import formatting as fmt
from dashboard import queries, roles, snapshot
from dashboard.forms import TaskSearchForm
from dashboard.views.base import action, back, not_found, page, pager
from dlq.models import DeadLetterTask
from queues import push
from queues.models import Queue
from taskforge.audit.log import of_request
from taskforge.lib.timeutil import isoformat
from tasks import events as task_events
from tasks import lifecycle
from tasks import services as task_services
from tasks import stats as task_stats
from tasks.exceptions import InvalidTransition
from tasks.models import Task, TaskEvent, TaskStatus, lease_timeout
from workers import heartbeats

S = TaskStatus
EVENTS_SHOWN = 500
TOP_KEYS = 10  # fairness keys shown on a queue's page


# Task inspector --------------------------------------------------------------------


@page(roles.VIEW_TASKS)
def tasks(request: HttpRequest) -> HttpResponse:
    form = TaskSearchForm(request.GET or None)
    result: queries.Page | None = None
    if not request.GET:
        result = queries.task_page(queries.TaskFilter())
    elif form.is_valid():
        data = form.cleaned_data
        if data["id"] is not None:
            if Task.objects.filter(pk=data["id"]).exists():
                return redirect("dashboard:task", task_id=data["id"])
            form.add_error("id", "No task has this id (a discarded task is gone for good).")
        else:
            try:
                result = queries.task_page(
                    queries.TaskFilter(
                        queue=data["queue"],
                        status=data["status"] or None,
                        worker_id=data["worker"].strip() or None,
                        created_after=data["created_after"],
                        created_before=data["created_before"],
                        cursor=data["cursor"] or None,
                        fairness_key=data["fairness_key"] or None,
                    )
                )
            except queries.BadCursor:
                form.add_error(None, "That page link is not valid any more; start from the top.")
    queues = {queue.pk: queue for queue in Queue.objects.all()}
    # A queue's page: its fairness keys with the largest backlog.
    chosen = form.cleaned_data.get("queue") if form.is_bound and form.is_valid() else None
    top_keys = task_stats.top_keys(chosen, limit=TOP_KEYS) if chosen is not None else []
    rows = []
    now = timezone.now()
    for task in result.rows if result else []:
        task.queue = queues[task.queue_id]
        rows.append({"task": task, "created_ago": fmt.ago(task.created_at, now)})
    return render(
        request,
        "dashboard/tasks.html",
        {
            "form": form,
            "rows": rows,
            "top_keys": top_keys,
            "chosen_queue": chosen,
            **pager(request, result),
            "nav": "tasks",
        },
    )


def _gap(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    return f"{seconds:.1f}s" if seconds < 10 else fmt.age(seconds)


def _took(delta: timedelta) -> str:
    """A request's duration: milliseconds under a second."""
    seconds = delta.total_seconds()
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else _gap(delta)


def _relative(at: datetime | None, now: datetime) -> str:
    if at is None:
        return ""
    if at > now:
        return "in " + fmt.age((at - now).total_seconds())
    return fmt.ago(at, now)


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _heartbeat_rows(beats: list[datetime], timeout: float) -> list[dict[str, Any]]:
    """Newest first, each with the gap to the beat before it (late when over the timeout)."""
    rows = []
    for index, at in enumerate(beats):
        gap = None
        if index + 1 < len(beats):
            gap = (at - beats[index + 1]).total_seconds()
        rows.append(
            {
                "at": fmt.timestamp(at),
                "gap": None if gap is None else f"+{gap:.1f}s",
                "late": gap is not None and gap > timeout,
            }
        )
    return rows


@page(roles.VIEW_TASKS)
def task_detail(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    task = Task.objects.select_related("queue").filter(pk=task_id).first()
    if task is None:
        return not_found(request, f"task {task_id}")
    now = timezone.now()
    events = task_events.chain(task, EVENTS_SHOWN + 1)
    events_cut = len(events) > EVENTS_SHOWN
    events = events[:EVENTS_SHOWN]
    event_rows = []
    previous: datetime | None = None
    for event in events:
        event_rows.append(
            {
                "event": event,
                "at": fmt.timestamp(event.at),
                "after": None if previous is None else _gap(event.at - previous),
            }
        )
        previous = event.at
    timeout = lease_timeout().total_seconds()
    pushed = (
        task.queue.push is not None
        or task.http_request is not None
        or (task.claimed_by or "").startswith("push:")
    )
    beats = heartbeats.history(task.pk, since=task.claimed_at) if task.claimed_at else []
    lease_expires_at = task.lease_expires_at
    dead_letter = DeadLetterTask.objects.filter(task_id=task.pk).first()
    return render(
        request,
        "dashboard/task_detail.html",
        {
            "task": task,
            "events": event_rows,
            "events_cut": events_cut,
            "payload": _pretty(task.payload),
            "result": None if task.result is None else _pretty(task.result),
            "beats": None if beats is None else _heartbeat_rows(beats, timeout),
            "beats_unavailable": beats is None,
            "heartbeat_timeout": timeout,
            "lease_expires_at": fmt.timestamp(lease_expires_at) if lease_expires_at else None,
            "lease_expired": lease_expires_at is not None and lease_expires_at < now,
            "times": [
                (label, fmt.timestamp(at) if at else None, _relative(at, now))
                for label, at in [
                    ("Created", task.created_at),
                    ("Scheduled", task.scheduled_at),
                    ("Claimed", task.claimed_at),
                    # A push process does not heartbeat: its lease anchor is no heartbeat.
                    ("Last heartbeat", None if pushed else task.heartbeat_at),
                    ("Updated", task.updated_at),
                    ("Finished", task.finished_at),
                ]
            ],
            "push_method": task.http_request["http_method"] if task.http_request else "POST",
            "push_url": _push_url(task),
            "http_target": _http_target(task),
            "push_attempts": _push_attempts(events) if pushed else None,
            "dead_letter": dead_letter,
            "can_cancel": task.is_cancellable,
            "is_dead": task.status == S.DEAD,
            "is_live": task.status in lifecycle.IN_PROGRESS,
            "watch_version": _watch_version(task.updated_at, task.heartbeat_at),
            "nav": "tasks",
        },
    )


def _push_url(task: Task) -> str | None:
    """Where the task's attempts go: its own URL (a Cloud Tasks task's), or its
    queue's push target; without user info or query."""
    if task.http_request is not None:
        return push.display_url(task.http_request["url"])
    return push.display_url(task.queue.push["url"]) if task.queue.push else None


def _http_target(task: Task) -> dict[str, Any] | None:
    """A Cloud Tasks task's name, method, URL (without user info or query), header names
    and body size (API-cloudtasks.md "Native view": never a header's value)."""
    http = task.http_request
    if http is None:
        return None
    body = http.get("body") or ""
    return {
        "name": task.name or str(task.pk),
        "method": http["http_method"],
        "url": push.display_url(http["url"]),
        "headers": sorted(http.get("headers") or {}),
        "body_bytes": len(base64.b64decode(body)) if body else 0,
        "deadline": http.get("dispatch_deadline_seconds"),
        "oidc": bool(http.get("oidc_token")),
    }


_HTTP_ERROR = re.compile(r"HTTP (\d{3}): (.*)", re.S)


def _push_attempts(events: list[TaskEvent]) -> list[dict[str, Any]]:
    """Each push attempt that ended: the target's answer (status, body excerpt) and its time.

    Read from the events: hand-out (`executing`) to the move that ended the
    attempt; `last_error` holds "HTTP <status>: <body excerpt>" (workers.pusher).
    """
    rows = []
    started: TaskEvent | None = None
    for event in events:
        if event.to_status == S.EXECUTING:
            started = event
            continue
        if event.from_status != S.EXECUTING or started is None:
            continue
        error = event.error or ""
        match = _HTTP_ERROR.fullmatch(error)
        if event.to_status == S.DONE:
            outcome, answer = "2xx", ""
        elif match:
            outcome, answer = match.group(1), match.group(2)
        else:
            outcome, answer = "no answer", error
        rows.append(
            {
                "attempt": event.attempt,
                "by": started.worker_id,
                "outcome": outcome,
                "ok": event.to_status == S.DONE,
                "took": _took(event.at - started.at),
                "answer": answer,
            }
        )
        started = None
    return rows


def _watch_version(updated_at: datetime, heartbeat_at: datetime | None) -> str:
    """Changes whenever the task moves or heartbeats (the task page reloads then)."""
    return f"{isoformat(updated_at)}|{isoformat(heartbeat_at)}"


@page(roles.VIEW_TASKS)
def task_status(request: HttpRequest, task_id: uuid.UUID) -> JsonResponse:
    """The task page polls this while the task is live, and reloads when it moved."""
    row = Task.objects.filter(pk=task_id).values("status", "updated_at", "heartbeat_at").first()
    if row is None:
        return JsonResponse({"status": None}, status=404)
    return JsonResponse(
        {"status": row["status"], "version": _watch_version(row["updated_at"], row["heartbeat_at"])}
    )


@action(roles.CANCEL)
def task_cancel(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    default = reverse("dashboard:task", kwargs={"task_id": task_id})
    try:
        task_services.cancel(task_id, actor=of_request(request))
    except task_services.UnknownTask:
        messages.error(request, "No such task.")
    except InvalidTransition:
        messages.error(
            request, "This task can no longer be cancelled: it is executing or finished."
        )
    else:
        snapshot.invalidate()
        messages.success(request, "Task cancelled.")
    return back(request, default)
