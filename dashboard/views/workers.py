"""The workers page: who was seen, who left, who is stale, what each holds."""

from __future__ import annotations

from typing import Any

from django.http import (
    HttpRequest,
    HttpResponse,
)
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from dashboard import formatting as fmt
from dashboard import roles
from dashboard.views.base import page
from tasks.models import lease_timeout
from workers.models import ACTIVE, LEFT, STALE, Worker, held_tasks

WORKERS_SHOWN = 500
TASKS_PER_WORKER_SHOWN = 20
ANY_TASK = "00000000-0000-0000-0000-000000000000"


# Workers ---------------------------------------------------------------------------


@page(roles.VIEW_WORKERS)
def workers(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    # The same hour as GET /workers.
    seen = list(Worker.objects.recent(now).order_by("-last_seen_at")[: WORKERS_SHOWN + 1])
    cut = len(seen) > WORKERS_SHOWN
    seen = seen[:WORKERS_SHOWN]
    held = held_tasks((worker.worker_id for worker in seen), TASKS_PER_WORKER_SHOWN)
    # One reverse() for all links: a page of busy workers has thousands.
    task_url = reverse("dashboard:task", kwargs={"task_id": ANY_TASK})
    rows: list[dict[str, Any]] = []
    for worker in seen:
        count, shown = held.get(worker.worker_id, (0, []))
        rows.append(
            {
                "worker": worker,
                "state": worker.state(now, holding=count > 0),
                "last_seen": fmt.timestamp(worker.last_seen_at),
                "last_seen_ago": fmt.ago(worker.last_seen_at, now),
                # The link texts made here: two template filters per link were
                # most of the page's time with 200 busy workers.
                "tasks": [
                    {
                        "id": task_id,
                        "url": task_url.replace(ANY_TASK, task_id),
                        "label": f"{task_id[:8]}…{task_id[-4:]}",
                    }
                    for task_id in shown
                ],
                "task_count": count,
                "more": count - len(shown),
            }
        )
    # Stale first (worth a look), then active, then those that left.
    order = {STALE: 0, ACTIVE: 1, LEFT: 2}
    rows.sort(key=lambda row: (order[row["state"]], row["worker"].worker_id))
    counts = {state: sum(1 for row in rows if row["state"] == state) for state in order}
    return render(
        request,
        "dashboard/workers.html",
        {
            "rows": rows,
            "cut": cut,
            "stale_count": counts[STALE],
            "active_count": counts[ACTIVE],
            "left_count": counts[LEFT],
            "timeout": lease_timeout().total_seconds(),
            "nav": "workers",
        },
    )
