"""The queue overview: one snapshot of every queue's health.

The overview page renders it and the SSE stream sends it every ~2 s.  Cost per
snapshot: three grouped queries for all queues (`tasks.stats.queues_stats`:
live-status counts over task_not_done_idx, the DLQ depths kept per queue
(dlq.depth), last-minute outcome counts over taskevent_outcome_idx), one aggregate over the
small workers table, and a queue list.  It is built at most about once per
`MAX_AGE_SECONDS`, however many browsers watch and however many API processes
serve them (`current`).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.core.cache import cache
from django.db.models import Count, Q
from django.urls import reverse
from django.utils import timezone

from dashboard import formatting as fmt
from queues import push
from queues.models import Queue
from taskforge.lib.timeutil import isoformat
from tasks.stats import queues_stats
from workers.models import Worker, stale_before

# Health thresholds: a queue is critical when most attempts fail or work waits
# for minutes, and needs attention (warn) on a smaller signal of the same kind.
ERROR_RATE_CRIT = 0.5
ERROR_RATE_WARN = 0.1
WAIT_CRIT_SECONDS = 300.0
WAIT_WARN_SECONDS = 60.0

MAX_AGE_SECONDS = 1.5

OK, WARN, CRIT = "ok", "warn", "crit"
_RANK = {OK: 0, WARN: 1, CRIT: 2}
LABELS = {OK: "Healthy", WARN: "Attention", CRIT: "Critical"}


def queue_health(stats: dict[str, Any]) -> tuple[str, list[str]]:
    """(level, reasons) of one queue from its stats, worst reason first."""
    found: list[tuple[str, str]] = []
    error_rate = stats["error_rate"] or 0
    wait = stats["oldest_pending_age_seconds"]
    depth = stats["depth"]
    if error_rate >= ERROR_RATE_CRIT:
        found.append((CRIT, f"{fmt.percent(error_rate)} of attempts failing"))
    elif error_rate >= ERROR_RATE_WARN:
        found.append((WARN, f"{fmt.percent(error_rate)} of attempts failing"))
    if stats["paused"]:
        waiting = depth["pending"] + depth["claimed"] + depth["retry"]
        found.append((WARN, f"paused, {fmt.number(waiting)} waiting" if waiting else "paused"))
    elif wait is not None and wait >= WAIT_CRIT_SECONDS:
        found.append((CRIT, f"oldest task waiting {fmt.age(wait)}"))
    elif wait is not None and wait >= WAIT_WARN_SECONDS:
        found.append((WARN, f"oldest task waiting {fmt.age(wait)}"))
    if stats["dlq_depth"]:
        found.append((WARN, f"{fmt.number(stats['dlq_depth'])} dead"))
    found.sort(key=lambda item: -_RANK[item[0]])
    level = found[0][0] if found else OK
    return level, [reason for _, reason in found]


def _cell_levels(stats: dict[str, Any]) -> dict[str, str]:
    """Which cells of the row to colour, with the thresholds of queue_health()."""
    levels = {}
    error_rate = stats["error_rate"] or 0
    if error_rate >= ERROR_RATE_WARN:
        levels["error_rate"] = CRIT if error_rate >= ERROR_RATE_CRIT else WARN
    wait = stats["oldest_pending_age_seconds"]
    if wait is not None and wait >= WAIT_WARN_SECONDS:
        levels["oldest_pending_age"] = CRIT if wait >= WAIT_CRIT_SECONDS else WARN
    if stats["dlq_depth"]:
        levels["dlq_depth"] = WARN
    return levels


def _policy_text(policy: dict[str, Any] | None) -> str | None:
    """A queue's retry_policy for a person: "backoff 0.1-3600 s, 16 doublings, for 600 s"."""
    if not policy:
        return None
    text = (
        f"backoff {policy['min_backoff_seconds']:g}-{policy['max_backoff_seconds']:g} s, "
        f"{policy['max_doublings']} doublings"
    )
    if policy.get("max_retry_duration_seconds"):
        text += f", for {policy['max_retry_duration_seconds']:g} s"
    return text


def queue_row(queue: Queue, stats: dict[str, Any]) -> dict[str, Any]:
    level, reasons = queue_health(stats)
    depth = stats["depth"]
    tasks_url = reverse("dashboard:tasks")
    return {
        "name": queue.name,
        "paused": queue.paused,
        "max_concurrency": queue.max_concurrency,
        # Where the queue's tasks are pushed (queues.push), without user info or query.
        "push_url": push.display_url(queue.push["url"]) if queue.push else None,
        # Its rate (a fraction when set over the Cloud Tasks API) and retry policy.
        "rate_limit": None if queue.rate_limit is None else fmt.rate(queue.rate_limit),
        "retry_policy": _policy_text(queue.retry_policy),
        "health": level,
        "health_label": LABELS[level],
        "reasons": reasons,
        "levels": _cell_levels(stats),
        "depth": depth,
        "dlq_depth": stats["dlq_depth"],
        "throughput_per_second": stats["throughput_per_second"],
        "error_rate": stats["error_rate"],
        "oldest_pending_age_seconds": stats["oldest_pending_age_seconds"],
        "text": {
            **{name: fmt.number(value) for name, value in depth.items()},
            # Running against the cap, when the queue has one ("7 / 10").
            **(
                {"executing": f"{fmt.number(depth['executing'])} / {fmt.number(cap)}"}
                if (cap := queue.max_concurrency) is not None
                else {}
            ),
            "dlq_depth": fmt.number(stats["dlq_depth"]),
            "throughput": fmt.rate(stats["throughput_per_second"]),
            "error_rate": fmt.percent(stats["error_rate"]),
            "oldest_pending_age": fmt.age(stats["oldest_pending_age_seconds"]),
            "reasons": "; ".join(reasons) if reasons else "all good",
        },
        "urls": {
            "tasks": f"{tasks_url}?queue={queue.name}",
            "dlq": f"{reverse('dashboard:dlq')}?queue={queue.name}",
        },
    }


def build(now: datetime | None = None) -> dict[str, Any]:
    """A fresh snapshot (queries the database)."""
    now = now or timezone.now()
    queues = list(Queue.objects.order_by("name"))
    stats = queues_stats(queues, now)
    rows = [queue_row(queue, stats[queue.id]) for queue in queues]
    # The table holds one row per worker name.
    # A quiet worker that holds no task has left (a clean stop, as on every
    # deploy): not worth an alert. One that still holds tasks, or lost some to
    # the watchdog since it was last seen, is stale (workers.models).
    quiet = Q(last_seen_at__lt=stale_before(now))
    trouble = Q(holding=True) | Worker.objects.lost_tasks_since_seen()
    workers = (
        Worker.objects.recent(now)
        .with_holding()
        .aggregate(
            seen=Count("pk"),
            stale=Count("pk", filter=quiet & trouble),
            left=Count("pk", filter=quiet & ~trouble),
        )
    )
    active = workers["seen"] - workers["stale"] - workers["left"]
    unhealthy = [row for row in rows if row["health"] != OK]
    unhealthy.sort(key=lambda row: (-_RANK[row["health"]], row["name"]))
    waiting = sum(
        row["depth"]["pending"] + row["depth"]["claimed"] for row in rows if not row["paused"]
    )
    alerts: list[dict[str, str]] = []
    if waiting and active == 0:
        alerts.append(
            {"level": CRIT, "text": f"No active worker, and {fmt.number(waiting)} tasks are due"}
        )
    if workers["stale"]:
        plural = "s" if workers["stale"] != 1 else ""
        text = f"{workers['stale']} worker{plural} stopped heartbeating while holding tasks"
        alerts.append({"level": WARN, "text": text})
    levels = [row["health"] for row in unhealthy] + [alert["level"] for alert in alerts]
    worst = max(levels, key=_RANK.__getitem__, default=OK)
    return {
        "at": isoformat(now),
        "at_text": fmt.timestamp(now)[:19] + " UTC",
        "queues": rows,
        "workers": {"active": active, "stale": workers["stale"], "left": workers["left"]},
        "summary": {
            "health": worst,
            "title": _title(len(rows), len(unhealthy), bool(alerts)),
            "unhealthy": [
                {"name": row["name"], "health": row["health"], "why": row["text"]["reasons"]}
                for row in unhealthy
            ],
            "alerts": alerts,
            "queue_count": len(rows),
        },
    }


def _title(queues: int, unhealthy: int, alerts: bool) -> str:
    if unhealthy:
        plural = "s" if queues != 1 else ""
        verb = "needs" if unhealthy == 1 else "need"
        return f"{unhealthy} of {queues} queue{plural} {verb} attention"
    if alerts:
        return "Queues healthy; workers need attention"
    if queues:
        return f"All {queues} queue{'s' if queues != 1 else ''} healthy"
    return "No queues yet"


CACHE_KEY = "dashboard:snapshot"


def current() -> dict[str, Any]:
    """The latest snapshot, rebuilt when older than MAX_AGE_SECONDS.

    Kept in Django's cache (Redis), so the API processes share it: however
    many processes serve pages and streams, the snapshot is built about once
    per MAX_AGE_SECONDS.  Two processes may both rebuild an expired one;
    that costs a query each, nothing more.  With Redis unreachable the cache
    answers nothing and each call builds its own.
    """
    snapshot: dict[str, Any] | None = cache.get(CACHE_KEY)
    if snapshot is None:
        snapshot = build()
        cache.set(CACHE_KEY, snapshot, timeout=MAX_AGE_SECONDS)
    return snapshot


def invalidate() -> None:
    """Forget the cached snapshot (after an action, so the next page shows it)."""
    cache.delete(CACHE_KEY)
