"""The queue overview and its actions: pause, resume, purge."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse

from dashboard import roles, snapshot
from dashboard.views.base import action, back, page, requires
from queues import services as queue_services
from queues.models import Queue
from taskforge.audit.log import of_request
from tasks import services as task_services

# Queue overview ------------------------------------------------------------------


@page(roles.VIEW_QUEUES)
def overview(request: HttpRequest) -> HttpResponse:
    data = snapshot.current()
    return render(
        request,
        "dashboard/overview.html",
        {"snapshot": data, "nav": "overview", "health_labels": snapshot.LABELS},
    )


@action(roles.PAUSE)
def queue_pause(request: HttpRequest, name: str) -> HttpResponse:
    return _set_paused(request, name, paused=True)


@action(roles.PAUSE)
def queue_resume(request: HttpRequest, name: str) -> HttpResponse:
    return _set_paused(request, name, paused=False)


def _set_paused(request: HttpRequest, name: str, *, paused: bool) -> HttpResponse:
    queue = get_object_or_404(Queue, name=name)
    queue_services.set_paused(queue, paused=paused, actor=of_request(request))
    snapshot.invalidate()
    if paused:
        messages.success(request, f"Paused queue {name}: it accepts tasks and hands out none.")
    else:
        messages.success(request, f"Resumed queue {name}.")
    return back(request, reverse("dashboard:overview"))


@staff_member_required
@requires(roles.PURGE)
def queue_purge(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the confirmation page; POST: cancel every pending, claimed and retry task."""
    queue = get_object_or_404(Queue, name=name)
    if request.method == "POST":
        if request.POST.get("confirm", "").strip() != name:
            messages.error(request, "Type the queue's name to confirm the purge.")
            return redirect("dashboard:queue-purge", name=name)
        cancelled = task_services.purge_queue(queue, actor=of_request(request))
        snapshot.invalidate()
        messages.success(request, f"Purged queue {name}: {cancelled:,} tasks cancelled.")
        return redirect("dashboard:overview")
    if request.method not in ("GET", "HEAD"):
        return HttpResponse(status=405, headers={"Allow": "GET, HEAD, POST"})
    row = next((r for r in snapshot.build()["queues"] if r["name"] == name), None)
    return render(
        request, "dashboard/purge_confirm.html", {"queue": queue, "row": row, "nav": "overview"}
    )
