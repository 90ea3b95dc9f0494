"""The dead-letter browser: filters, replay (selected or all matching), discard."""

from __future__ import annotations

import uuid
from typing import Any

from django.contrib import messages
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from dashboard import formatting as fmt
from dashboard import queries, roles, snapshot
from dashboard.forms import DlqFilterForm
from dashboard.views.base import action, back, page, pager
from dlq import services as dlq_services
from dlq.models import DeadLetterTask
from queues.models import Queue
from taskforge.audit.log import of_request

# Dead-letter queue -----------------------------------------------------------------


def _dlq_filters(form: DlqFilterForm) -> queries.DlqFilter:
    data = form.cleaned_data
    return queries.DlqFilter(
        queue=data.get("queue"),
        died_after=data.get("died_after"),
        died_before=data.get("died_before"),
        cursor=data.get("cursor") or None,
    )


@page(roles.VIEW_DLQ)
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
    depths: list[dict[str, Any]] = [
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
            "can_act": request.user.has_perm(roles.REPLAY) or request.user.has_perm(roles.DISCARD),
            **pager(request, result),
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


@action(roles.REPLAY)
def dlq_replay(request: HttpRequest) -> HttpResponse:
    """Replay the selected entries (`ids`), or every entry matching the filters (`all`)."""
    default = reverse("dashboard:dlq")
    if request.POST.get("all"):
        form = DlqFilterForm(request.POST)
        if not form.is_valid():
            messages.error(request, "The filters are not valid; nothing was replayed.")
            return back(request, default)
        filters = _dlq_filters(form)
        queues = (
            [filters.queue] if filters.queue is not None else list(Queue.objects.order_by("name"))
        )
        replayed = dlq_services.replay_matching(
            queues,
            died_after=filters.died_after,
            died_before=filters.died_before,
            actor=of_request(request),
        )
    else:
        ids = _selected_ids(request)
        if not ids:
            messages.warning(request, "Select the tasks to replay first.")
            return back(request, default)
        replayed = dlq_services.replay_selected(ids, actor=of_request(request))
    snapshot.invalidate()
    messages.success(request, f"Replayed {replayed:,} task{'s' if replayed != 1 else ''}.")
    return back(request, default)


@action(roles.REPLAY)
def dlq_replay_one(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    entry = DeadLetterTask.objects.select_related("queue").filter(task_id=task_id).first()
    default = reverse("dashboard:task", kwargs={"task_id": task_id})
    if entry is None:
        messages.error(request, "This task is not in the dead-letter queue.")
        return back(request, default)
    try:
        dlq_services.replay_one(entry.queue, str(task_id), actor=of_request(request))
    except dlq_services.NotDead:
        messages.error(request, "This task is not dead any more; nothing was replayed.")
    else:
        snapshot.invalidate()
        messages.success(request, "Task replayed: it is pending again with a fresh attempt budget.")
    return back(request, default)


@action(roles.DISCARD)
def dlq_discard_one(request: HttpRequest, task_id: uuid.UUID) -> HttpResponse:
    entry = DeadLetterTask.objects.select_related("queue").filter(task_id=task_id).first()
    default = reverse("dashboard:dlq")
    try:
        if entry is None:
            raise dlq_services.NotDead()
        dlq_services.discard(entry.queue, str(task_id), actor=of_request(request))
    except dlq_services.NotDead:
        messages.error(request, "This task is not dead; nothing was discarded.")
        return back(request, reverse("dashboard:task", kwargs={"task_id": task_id}))
    snapshot.invalidate()
    messages.success(request, f"Discarded task {task_id} for good.")
    return back(request, default)


@action(roles.DISCARD)
def dlq_discard(request: HttpRequest) -> HttpResponse:
    """Delete the selected dead tasks (`ids`) for good."""
    discarded = dlq_services.discard_selected(_selected_ids(request), actor=of_request(request))
    snapshot.invalidate()
    if discarded:
        messages.success(
            request, f"Discarded {discarded:,} task{'s' if discarded != 1 else ''} for good."
        )
    else:
        messages.warning(request, "Nothing was discarded: no selected task is dead.")
    return back(request, reverse("dashboard:dlq"))
