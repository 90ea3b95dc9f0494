"""Per-queue statistics of API.md (GET /queues/:name/stats)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db.models import Count, Min, Q
from django.utils import timezone

from queues.models import Queue
from tasks.models import Task, TaskEvent, TaskStatus

S = TaskStatus
WINDOW = timedelta(seconds=60)


def queue_stats(queue: Queue, now: datetime | None = None) -> dict[str, Any]:
    """Depth by status, DLQ depth, throughput and error rate over the last minute.

    Three index-only-ish aggregates: counts over task_queue_status_idx (live
    statuses only, never the done/cancelled history) and event counts over
    taskevent_queue_at_idx for the last 60 s.
    """
    now = now or timezone.now()
    live = Task.objects.filter(
        queue=queue, status__in=[S.PENDING, S.CLAIMED, S.EXECUTING, S.RETRY, S.DEAD]
    )
    due = Q(scheduled_at__lte=now)
    counts = live.aggregate(
        pending=Count("id", filter=Q(status=S.PENDING) & due),
        scheduled=Count("id", filter=Q(status=S.PENDING) & ~due),
        claimed=Count("id", filter=Q(status=S.CLAIMED)),
        executing=Count("id", filter=Q(status=S.EXECUTING)),
        retry=Count("id", filter=Q(status=S.RETRY)),
        dead=Count("id", filter=Q(status=S.DEAD)),
        oldest_due=Min("scheduled_at", filter=Q(status__in=[S.PENDING, S.CLAIMED]) & due),
    )
    attempts = TaskEvent.objects.filter(
        queue=queue, at__gt=now - WINDOW, at__lte=now, from_status=S.EXECUTING
    ).aggregate(
        acks=Count("id", filter=Q(to_status=S.DONE)),
        failures=Count("id", filter=Q(to_status__in=[S.RETRY, S.DEAD])),
    )
    acks, failures = attempts["acks"], attempts["failures"]
    oldest = counts.pop("oldest_due")
    dead = counts.pop("dead")
    return {
        "queue": queue.name,
        "paused": queue.paused,
        "depth": counts,
        "dlq_depth": dead,
        "throughput_per_second": round(acks / WINDOW.total_seconds(), 3),
        "error_rate": round(failures / (acks + failures), 4) if acks + failures else 0,
        "oldest_pending_age_seconds": (
            None if oldest is None else round(max((now - oldest).total_seconds(), 0.0), 3)
        ),
    }
