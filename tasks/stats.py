"""Per-queue statistics of API.md (GET /queues/:name/stats, the dashboard)."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from django.db.models import Count, Min, Q
from django.utils import timezone

from queues.models import Queue
from taskforge.lib import pg
from tasks import signals, sql
from tasks.lifecycle import IN_PROGRESS
from tasks.models import Task, TaskEvent, TaskStatus

S = TaskStatus
WINDOW = timedelta(seconds=60)


def queue_stats(queue: Queue, now: datetime | None = None) -> dict[str, Any]:
    """Depth by status, DLQ depth, throughput and error rate over the last minute."""
    return queues_stats([queue], now)[queue.id]


def queues_stats(
    queues: Sequence[Queue], now: datetime | None = None
) -> dict[uuid.UUID, dict[str, Any]]:
    """`queue_stats` for many queues in three grouped queries, whatever their number.

    Counts run over task_not_done_idx (the statuses on their way, never the
    done/cancelled history; status and scheduled_at are in the index, so
    Postgres can answer from it alone); the DLQ depth is the sum of a few
    rows per queue, which the DLQ keeps and answers through
    `tasks.signals.dlq_depths` (dlq.depth), not a count of the dead tasks (the
    DLQ keeps them for its own retention); acks and failed attempts over
    taskevent_outcome_idx (outcomes of attempts only) for the last 60 s.  The
    cost grows with the live backlog, not with history or the DLQ.
    """
    now = now or timezone.now()
    ids = [queue.id for queue in queues]
    due = Q(scheduled_at__lte=now)
    counted = (
        Task.objects.filter(queue_id__in=ids, status__in=IN_PROGRESS)
        .values("queue_id")
        .annotate(
            pending=Count("status", filter=Q(status=S.PENDING) & due),
            scheduled=Count("status", filter=Q(status=S.PENDING) & ~due),
            claimed=Count("status", filter=Q(status=S.CLAIMED)),
            executing=Count("status", filter=Q(status=S.EXECUTING)),
            retry=Count("status", filter=Q(status=S.RETRY)),
            oldest_due=Min("scheduled_at", filter=Q(status__in=[S.PENDING, S.CLAIMED]) & due),
            named_keys=Count("fairness_key", distinct=True),
            anonymous=Count("status", filter=Q(fairness_key__isnull=True)),
        )
        .order_by()
    )
    with pg.planned_without(pg.NO_PARALLEL):
        depths = {row["queue_id"]: _without_queue_id(row) for row in counted}
    for _, answer in signals.dlq_depths.send(sender=Queue, queue_ids=ids):
        for queue_id, count in cast(Mapping[uuid.UUID, int], answer).items():
            if count:
                depths.setdefault(queue_id, {})["dead"] = count
    attempts = {
        row["queue_id"]: _without_queue_id(row)
        for row in TaskEvent.objects.filter(
            queue_id__in=ids, at__gt=now - WINDOW, at__lte=now, from_status=S.EXECUTING
        )
        .values("queue_id")
        .annotate(
            acks=Count("to_status", filter=Q(to_status=S.DONE)),
            failures=Count("to_status", filter=Q(to_status__in=[S.RETRY, S.DEAD])),
        )
        .order_by()
    }
    return {
        queue.id: _stats(queue, depths.get(queue.id), attempts.get(queue.id), now)
        for queue in queues
    }


def _without_queue_id(row: Mapping[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in row.items() if name != "queue_id"}


def _stats(
    queue: Queue, depth: dict[str, Any] | None, attempts: dict[str, Any] | None, now: datetime
) -> dict[str, Any]:
    counts = dict(depth or {})
    oldest = counts.pop("oldest_due", None)
    dead = counts.pop("dead", 0)
    keys = counts.pop("named_keys", 0) + (1 if counts.pop("anonymous", 0) else 0)
    for name in ("pending", "scheduled", "claimed", "executing", "retry"):
        counts.setdefault(name, 0)
    acks = (attempts or {}).get("acks", 0)
    failures = (attempts or {}).get("failures", 0)
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
        "keys": keys,
    }


@dataclass(frozen=True, slots=True)
class KeyRow:
    """One fairness key of a queue (GET /queues/:name/keys; None: the anonymous key)."""

    key: str | None
    pending: int
    executing: int
    retry: int
    oldest_pending_age_seconds: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "pending": self.pending,
            "executing": self.executing,
            "retry": self.retry,
            "oldest_pending_age_seconds": self.oldest_pending_age_seconds,
        }


def queue_keys(
    queue: Queue,
    *,
    after: tuple[bool, str | None] = (False, None),
    min_pending: int = 0,
    limit: int = 100,
    now: datetime | None = None,
) -> list[KeyRow]:
    """The queue's fairness keys with tasks on their way, in code point order, the
    anonymous key first; `after` = (the anonymous key was shown, the last key shown).

    One grouped read of the queue's live tasks after the cursor (task_not_done_idx).
    """
    now = now or timezone.now()
    params = {
        "queue_id": queue.id,
        "now": now,
        "started": after[0],
        "after": after[1],
        "min_pending": min_pending,
        "limit": limit,
    }
    return _key_rows(sql.KEYS_PAGE, params, now)


def top_keys(queue: Queue, *, limit: int = 10, now: datetime | None = None) -> list[KeyRow]:
    """The `limit` fairness keys with the largest backlog (the dashboard's queue page)."""
    now = now or timezone.now()
    return _key_rows(sql.TOP_KEYS, {"queue_id": queue.id, "now": now, "limit": limit}, now)


def _key_rows(statement: str, params: dict[str, Any], now: datetime) -> list[KeyRow]:
    with pg.cursor() as cursor:
        cursor.execute(statement, params)
        rows = cursor.fetchall()
    return [
        KeyRow(
            key,
            pending,
            executing,
            retry,
            None if oldest is None else round(max((now - oldest).total_seconds(), 0.0), 3),
        )
        for key, pending, executing, retry, oldest in rows
    ]
