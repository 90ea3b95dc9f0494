"""The schedules page: every cron schedule with its next and last run; pause and resume."""

from __future__ import annotations

from typing import Any

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from dashboard import formatting as fmt
from dashboard import roles
from dashboard.views.base import action, back, page
from taskforge.audit.log import of_request
from tasks import schedules as schedule_services
from tasks.models import Schedule

SCHEDULES_SHOWN = 500


@page(roles.VIEW_SCHEDULES)
def schedules(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    found = list(
        Schedule.objects.select_related("queue").order_by("queue__name", "name")[
            : SCHEDULES_SHOWN + 1
        ]
    )
    cut = len(found) > SCHEDULES_SHOWN
    rows: list[dict[str, Any]] = []
    for schedule in found[:SCHEDULES_SHOWN]:
        upcoming = schedule.upcoming_run_at(now)
        rows.append(
            {
                "schedule": schedule,
                "next_run": fmt.timestamp(upcoming),
                "next_run_in": fmt.age((upcoming - now).total_seconds()),
                "last_run": fmt.timestamp(schedule.last_run_at) if schedule.last_run_at else None,
                "last_run_ago": fmt.ago(schedule.last_run_at, now) if schedule.last_run_at else "",
                "tasks_url": reverse("dashboard:tasks") + f"?queue={schedule.queue.name}",
            }
        )
    return render(
        request,
        "dashboard/schedules.html",
        {
            "rows": rows,
            "cut": cut,
            "paused_count": sum(1 for row in rows if row["schedule"].paused),
            "nav": "schedules",
        },
    )


@action(roles.PAUSE_SCHEDULE)
def schedule_pause(request: HttpRequest, schedule_id: Any) -> HttpResponse:
    return _set_paused(request, schedule_id, paused=True)


@action(roles.PAUSE_SCHEDULE)
def schedule_resume(request: HttpRequest, schedule_id: Any) -> HttpResponse:
    return _set_paused(request, schedule_id, paused=False)


def _set_paused(request: HttpRequest, schedule_id: Any, *, paused: bool) -> HttpResponse:
    schedule = Schedule.objects.filter(pk=schedule_id).first()
    if schedule is None:
        messages.error(request, "No such schedule (deleted meanwhile?).")
    elif schedule_services.set_paused([schedule.pk], paused, actor=of_request(request)):
        if paused:
            messages.success(request, f"Paused schedule {schedule.name}: it enqueues nothing.")
        else:
            messages.success(
                request,
                f"Resumed schedule {schedule.name}; the latest time it missed, if any, "
                "is enqueued once now.",
            )
    return back(request, reverse("dashboard:schedules"))
