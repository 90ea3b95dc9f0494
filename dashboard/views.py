"""Dashboard pages (GET) and actions (POST, CSRF-checked), staff only.

Pages read through `queries` and `snapshot`; actions call the domain layer
(`queues.services`, `tasks.services`, `dlq.services`) and redirect back
with a message (post/redirect/get).  Which task may be cancelled, which is
live, when a lease runs out: the models and `tasks.lifecycle` say, never
this module.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBase,
    HttpResponseRedirect,
    JsonResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from dashboard import formatting as fmt
from dashboard import queries, snapshot
from dashboard.forms import DlqFilterForm, TaskSearchForm
from dlq import services as dlq_services
from dlq.models import DeadLetterTask
from queues import services as queue_services
from queues.models import Queue
from taskforge.lib.timeutil import isoformat
from tasks import lifecycle
from tasks import services as task_services
from tasks.exceptions import InvalidTransition
from tasks.models import Task, TaskEvent, TaskStatus, lease_timeout
from workers import heartbeats
from workers.models import Worker, current_tasks

S = TaskStatus
EVENTS_SHOWN = 500
WORKERS_SHOWN = 500
TASKS_PER_WORKER_SHOWN = 20
ANY_TASK = "00000000-0000-0000-0000-000000000000"

View = Callable[..., HttpResponseBase]


def page(view: View) -> View:
    """A read-only page: staff login, GET (and HEAD) only."""
    return staff_member_required(require_GET(view))


def action(view: View) -> View:
    """A state-changing action: staff login, POST only (CSRF is checked by the middleware)."""
    return staff_member_required(require_POST(view))


def _back(request: HttpRequest, default: str) -> HttpResponseRedirect:
    """Redirect to the form's `next` when it is a path on this site, else to `default`."""
    target = request.POST.get("next") or ""
    if not url_has_allowed_host_and_scheme(
        target, allowed_hosts={request.get_host()}, require_https=request.is_secure()
    ):
        target = default
    return HttpResponseRedirect(target)


def _not_found(request: HttpRequest, what: str) -> HttpResponse:
    return render(request, "dashboard/not_found.html", {"what": what}, status=404)


# Queue overview ------------------------------------------------------------------


@page
def overview(request: HttpRequest) -> HttpResponse:
    data = snapshot.current()
    return render(
        request,
        "dashboard/overview.html",
        {"snapshot": data, "nav": "overview", "health_labels": snapshot.LABELS},
    )


@action
def queue_pause(request: HttpRequest, name: str) -> HttpResponse:
    return _set_paused(request, name, paused=True)


@action
def queue_resume(request: HttpRequest, name: str) -> HttpResponse:
    return _set_paused(request, name, paused=False)


def _set_paused(request: HttpRequest, name: str, *, paused: bool) -> HttpResponse:
    queue = get_object_or_404(Queue, name=name)
    queue_services.update_queue(queue, paused=paused)
    snapshot.invalidate()
    if paused:
        messages.success(request, f"Paused queue {name}: it accepts tasks and hands out none.")
    else:
        messages.success(request, f"Resumed queue {name}.")
    return _back(request, reverse("dashboard:overview"))


@staff_member_required
def queue_purge(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the confirmation page; POST: cancel every pending, claimed and retry task."""
    queue = get_object_or_404(Queue, name=name)
    if request.method == "POST":
        if request.POST.get("confirm", "").strip() != name:
            messages.error(request, "Type the queue's name to confirm the purge.")
            return redirect("dashboard:queue-purge", name=name)
        cancelled = task_services.purge_queue(queue)
        snapshot.invalidate()
        messages.success(request, f"Purged queue {name}: {cancelled:,} tasks cancelled.")
        return redirect("dashboard:overview")
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    row = next((r for r in snapshot.build()["queues"] if r["name"] == name), None)
    return render(
        request, "dashboard/purge_confirm.html", {"queue": queue, "row": row, "nav": "overview"}
    )


# Task inspector --------------------------------------------------------------------


@page
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
                    )
                )
            except queries.BadCursor:
                form.add_error(None, "That page link is not valid any more; start from the top.")
    queues = {queue.pk: queue for queue in Queue.objects.all()}
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
            **_pager(request, result),
            "nav": "tasks",
        },
    )


def _with_cursor(request: HttpRequest, cursor: str | None) -> str:
    """This page's URL with `cursor` in place of the current one (none: the first page)."""
    params = request.GET.copy()
    params.pop("cursor", None)
    if cursor is not None:
        params["cursor"] = cursor
    return f"{request.path}?{params.urlencode()}"


def _pager(request: HttpRequest, result: queries.Page | None) -> dict[str, str | None]:
    next_cursor = result.next_cursor if result else None
    return {
        "next_url": _with_cursor(request, next_cursor) if next_cursor else None,
        "first_url": _with_cursor(request, None) if request.GET.get("cursor") else None,
    }


def _gap(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    return f"{seconds:.1f}s" if seconds < 10 else fmt.age(seconds)


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


@page
def task_detail(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    task = Task.objects.select_related("queue").filter(pk=task_id).first()
    if task is None:
        return _not_found(request, f"task {task_id}")
    now = timezone.now()
    # Uses taskevent_task_idx (task, id).
    events = list(TaskEvent.objects.filter(task_id=task.pk).order_by("id")[: EVENTS_SHOWN + 1])
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
                    ("Last heartbeat", task.heartbeat_at),
                    ("Updated", task.updated_at),
                    ("Finished", task.finished_at),
                ]
            ],
            "dead_letter": dead_letter,
            "can_cancel": task.is_cancellable,
            "is_dead": task.status == S.DEAD,
            "is_live": task.status in lifecycle.IN_PROGRESS,
            "watch_version": _watch_version(task.updated_at, task.heartbeat_at),
            "nav": "tasks",
        },
    )


def _watch_version(updated_at: datetime, heartbeat_at: datetime | None) -> str:
    """Changes whenever the task moves or heartbeats (the task page reloads then)."""
    return f"{isoformat(updated_at)}|{isoformat(heartbeat_at)}"


@page
def task_status(request: HttpRequest, task_id: uuid.UUID) -> JsonResponse:
    """The task page polls this while the task is live, and reloads when it moved."""
    row = Task.objects.filter(pk=task_id).values("status", "updated_at", "heartbeat_at").first()
    if row is None:
        return JsonResponse({"status": None}, status=404)
    return JsonResponse(
        {"status": row["status"], "version": _watch_version(row["updated_at"], row["heartbeat_at"])}
    )


@action
def task_cancel(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    default = reverse("dashboard:task", kwargs={"task_id": task_id})
    try:
        task_services.cancel(task_id)
    except task_services.UnknownTask:
        messages.error(request, "No such task.")
    except InvalidTransition:
        messages.error(
            request, "This task can no longer be cancelled: it is executing or finished."
        )
    else:
        snapshot.invalidate()
        messages.success(request, "Task cancelled.")
    return _back(request, default)


# Dead-letter queue -----------------------------------------------------------------


def _dlq_filters(form: DlqFilterForm) -> queries.DlqFilter:
    data = form.cleaned_data
    return queries.DlqFilter(
        queue=data.get("queue"),
        died_after=data.get("died_after"),
        died_before=data.get("died_before"),
        cursor=data.get("cursor") or None,
    )


@page
def dlq(request: HttpRequest) -> HttpResponse:
    form = DlqFilterForm(request.GET)
    result: queries.Page | None = None
    if form.is_valid():
        try:
            result = queries.dlq_page(_dlq_filters(form))
        except queries.BadCursor:
            form.add_error(None, "That page link is not valid any more; start from the top.")
    queues = {queue.pk: queue for queue in Queue.objects.order_by("name")}
    now = timezone.now()
    rows = [
        {
            "entry": entry,
            "queue": queues[entry.queue_id],
            "died_ago": fmt.ago(entry.died_at, now),
        }
        for entry in (result.rows if result else [])
    ]
    depths = [
        {"name": queue.name, "dlq_depth": depth, "text": fmt.number(depth)}
        for queue, depth in queries.dlq_depths()
    ]
    valid = form.is_valid()
    selected = form.cleaned_data.get("queue") if valid else None
    time_filtered = valid and bool(
        form.cleaned_data.get("died_after") or form.cleaned_data.get("died_before")
    )
    scope = f"queue {selected.name}" if selected else "every queue"
    if time_filtered:
        label = "Replay all matching"
        question = f"Replay every dead task of {scope} that died in this time range?"
    else:
        depth = next((d for d in depths if selected and d["name"] == selected.name), None)
        total = depth["dlq_depth"] if depth else sum(d["dlq_depth"] for d in depths)
        label = f"Replay all {fmt.number(total)}"
        question = f"Replay all {fmt.number(total)} dead tasks of {scope}?"
    return render(
        request,
        "dashboard/dlq.html",
        {
            "form": form,
            "rows": rows,
            "depths": depths,
            "total_text": fmt.number(sum(d["dlq_depth"] for d in depths)),
            "selected_queue": selected,
            "time_filtered": time_filtered,
            "replay_all_fields": [
                (name, request.GET[name])
                for name in ("queue", "died_after", "died_before")
                if request.GET.get(name)
            ],
            "replay_all_label": label,
            "replay_all_question": question,
            **_pager(request, result),
            "nav": "dlq",
        },
    )


def _selected_ids(request: HttpRequest) -> list[str]:
    ids = []
    for raw in request.POST.getlist("ids"):
        try:
            ids.append(str(uuid.UUID(raw)))
        except ValueError:
            continue
    return ids


@action
def dlq_replay(request: HttpRequest) -> HttpResponse:
    """Replay the selected entries (`ids`), or every entry matching the filters (`all`)."""
    default = reverse("dashboard:dlq")
    if request.POST.get("all"):
        form = DlqFilterForm(request.POST)
        if not form.is_valid():
            messages.error(request, "The filters are not valid; nothing was replayed.")
            return _back(request, default)
        filters = _dlq_filters(form)
        queues = (
            [filters.queue] if filters.queue is not None else list(Queue.objects.order_by("name"))
        )
        replayed = dlq_services.replay_matching(
            queues, died_after=filters.died_after, died_before=filters.died_before
        )
    else:
        ids = _selected_ids(request)
        if not ids:
            messages.warning(request, "Select the tasks to replay first.")
            return _back(request, default)
        replayed = dlq_services.replay_selected(ids)
    snapshot.invalidate()
    messages.success(request, f"Replayed {replayed:,} task{'s' if replayed != 1 else ''}.")
    return _back(request, default)


@action
def dlq_replay_one(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    entry = DeadLetterTask.objects.select_related("queue").filter(task_id=task_id).first()
    default = reverse("dashboard:task", kwargs={"task_id": task_id})
    if entry is None:
        messages.error(request, "This task is not in the dead-letter queue.")
        return _back(request, default)
    try:
        dlq_services.replay_one(entry.queue, str(task_id))
    except dlq_services.NotDead:
        messages.error(request, "This task is not dead any more; nothing was replayed.")
    else:
        snapshot.invalidate()
        messages.success(request, "Task replayed: it is pending again with a fresh attempt budget.")
    return _back(request, default)


@action
def dlq_discard_one(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    entry = DeadLetterTask.objects.select_related("queue").filter(task_id=task_id).first()
    default = reverse("dashboard:dlq")
    try:
        if entry is None:
            raise dlq_services.NotDead()
        dlq_services.discard(entry.queue, str(task_id))
    except dlq_services.NotDead:
        messages.error(request, "This task is not dead; nothing was discarded.")
        return _back(request, reverse("dashboard:task", kwargs={"task_id": task_id}))
    snapshot.invalidate()
    messages.success(request, f"Discarded task {task_id} for good.")
    return _back(request, default)


@action
def dlq_discard(request: HttpRequest) -> HttpResponse:
    """Delete the selected dead tasks (`ids`) for good."""
    discarded = dlq_services.discard_selected(_selected_ids(request))
    snapshot.invalidate()
    if discarded:
        messages.success(
            request, f"Discarded {discarded:,} task{'s' if discarded != 1 else ''} for good."
        )
    else:
        messages.warning(request, "Nothing was discarded: no selected task is dead.")
    return _back(request, reverse("dashboard:dlq"))


# Workers ---------------------------------------------------------------------------


@page
def workers(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    # The same hour as GET /workers.
    seen = list(Worker.objects.recent(now).order_by("-last_seen_at")[: WORKERS_SHOWN + 1])
    cut = len(seen) > WORKERS_SHOWN
    seen = seen[:WORKERS_SHOWN]
    current = current_tasks(worker.worker_id for worker in seen)
    # One reverse() for all links: a page of busy workers has thousands.
    task_url = reverse("dashboard:task", kwargs={"task_id": ANY_TASK})
    rows = [
        {
            "worker": worker,
            "stale": worker.is_stale(now),
            "last_seen": fmt.timestamp(worker.last_seen_at),
            "last_seen_ago": fmt.ago(worker.last_seen_at, now),
            "tasks": [
                {"id": task_id, "url": task_url.replace(ANY_TASK, task_id)}
                for task_id in sorted(current.get(worker.worker_id, []))[:TASKS_PER_WORKER_SHOWN]
            ],
            "task_count": len(current.get(worker.worker_id, [])),
            "more": max(len(current.get(worker.worker_id, [])) - TASKS_PER_WORKER_SHOWN, 0),
        }
        for worker in seen
    ]
    rows.sort(key=lambda row: (not row["stale"], row["worker"].worker_id))
    stale = sum(1 for row in rows if row["stale"])
    return render(
        request,
        "dashboard/workers.html",
        {
            "rows": rows,
            "cut": cut,
            "stale_count": stale,
            "active_count": len(rows) - stale,
            "timeout": lease_timeout().total_seconds(),
            "nav": "workers",
        },
    )
