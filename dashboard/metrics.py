"""GET /metrics: Prometheus exposition (API.md, "Operations").

The counters and histograms come from `taskforge.metrics` (every process's,
in multiprocess mode); the gauges (queue depth, the oldest due task's age,
pause, running tasks against the queue's cap, DLQ depth, each worker's
heartbeat age and state) are read from Postgres at scrape time, here, where
every app may be read.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from queues.models import Queue
from taskforge.api.health import probe
from taskforge.api.responses import error_response
from taskforge.conf import conf
from taskforge.lib import sql
from taskforge.metrics import counted_collector
from tasks.stats import queues_stats
from workers.models import Worker

logger = logging.getLogger("taskforge.metrics")

# API.md's stats: `pending` is due, `scheduled` is pending but not yet due.
DEPTH_STATUSES = ("pending", "scheduled", "claimed", "executing", "retry")
# A scrape must not hold a database connection for long, whatever the backlog.
SCRAPE_STATEMENT_TIMEOUT_MS = 5000


@dataclass
class _Readings:
    """What one scrape read from Postgres."""

    depth: dict[str, dict[str, int]]
    dlq: dict[str, int]
    oldest_pending: dict[str, float]
    paused: dict[str, bool]
    keys: dict[str, int]  # fairness keys with live tasks, by queue
    caps: dict[str, int]
    # (worker id, seconds since seen, Worker.state)
    workers: list[tuple[str, float, str]]


class DatabaseGauges:
    """Queue depth, oldest due task, pause, running tasks and caps, DLQ depth, and each
    worker's heartbeat age and state, from Postgres.

    `tasks.stats.queues_stats` for every queue (grouped counts over the live
    statuses only, never the done and cancelled history) and the workers
    seen within TASKFORGE_WORKER_FORGET_SECONDS (workers_worker.last_seen_at
    index): a worker id is a label while its worker is remembered, and
    leaves `/metrics` when it is forgotten (no process keeps it).  When Postgres does not
    answer, the gauges are left out and the counters still scrape.
    """

    def collect(self) -> Iterator[Metric]:
        try:
            read = self._read()
        except DatabaseError as exc:
            logger.warning("metrics.gauges_unavailable", extra={"error": repr(exc)})
            return
        queue_depth = GaugeMetricFamily(
            "taskforge_queue_depth",
            "Tasks by queue and live status (pending: due; scheduled: pending, not yet due).",
            labels=["queue", "status"],
        )
        for queue, counts in read.depth.items():
            for status in DEPTH_STATUSES:
                queue_depth.add_metric([queue, status], counts[status])
        oldest = GaugeMetricFamily(
            "taskforge_queue_oldest_pending_age_seconds",
            "How late the oldest due task not yet handed out is, by queue (0: none); "
            "GET /queues/:name/stats' oldest_pending_age_seconds.",
            labels=["queue"],
        )
        for queue, age in read.oldest_pending.items():
            oldest.add_metric([queue], age)
        paused = GaugeMetricFamily(
            "taskforge_queue_paused", "1 while the queue is paused, else 0.", labels=["queue"]
        )
        for queue, is_paused in read.paused.items():
            paused.add_metric([queue], 1 if is_paused else 0)
        running = GaugeMetricFamily(
            "taskforge_queue_running",
            "Tasks executing now, by queue (compare taskforge_queue_max_concurrency).",
            labels=["queue"],
        )
        for queue, counts in read.depth.items():
            running.add_metric([queue], counts["executing"])
        cap = GaugeMetricFamily(
            "taskforge_queue_max_concurrency",
            "The queue's max_concurrency; only queues that have one.",
            labels=["queue"],
        )
        for queue, value in read.caps.items():
            cap.add_metric([queue], value)
        dlq_depth = GaugeMetricFamily(
            "taskforge_dlq_depth", "Dead tasks (the dead-letter queue) by queue.", labels=["queue"]
        )
        for queue, count in read.dlq.items():
            dlq_depth.add_metric([queue], count)
        heartbeat_age = GaugeMetricFamily(
            "taskforge_worker_heartbeat_age_seconds",
            "Seconds since each worker was last seen (workers seen within "
            "TASKFORGE_WORKER_FORGET_SECONDS).",
            labels=["worker_id"],
        )
        state = GaugeMetricFamily(
            "taskforge_worker_state",
            "1 for each worker's state, as the dashboard shows it: active (seen within the "
            "heartbeat timeout), left (quiet, holding no task) or stale (quiet while holding "
            "tasks, or after the watchdog reclaimed some).",
            labels=["worker_id", "state"],
        )
        for worker_id, age, worker_state in read.workers:
            heartbeat_age.add_metric([worker_id], age)
            state.add_metric([worker_id, worker_state], 1)
        queue_keys = GaugeMetricFamily(
            "taskforge_queue_keys",
            "Fairness keys with live tasks by queue, the anonymous key included.",
            labels=["queue"],
        )
        for queue, count in read.keys.items():
            queue_keys.add_metric([queue], count)
        yield from (
            queue_depth,
            oldest,
            paused,
            running,
            cap,
            dlq_depth,
            heartbeat_age,
            state,
            queue_keys,
        )

    @staticmethod
    def _read() -> _Readings:
        now = timezone.now()
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute(sql.LOCAL_STATEMENT_TIMEOUT, [str(SCRAPE_STATEMENT_TIMEOUT_MS)])
            queues = list(Queue.objects.order_by("name"))
            # The same counts as GET /queues/:name/stats, for every queue at once.
            stats = queues_stats(queues, now)
            seen = list(Worker.objects.remembered(now).with_holding().order_by("worker_id"))
        return _Readings(
            depth={queue.name: stats[queue.id]["depth"] for queue in queues},
            dlq={queue.name: stats[queue.id]["dlq_depth"] for queue in queues},
            oldest_pending={
                queue.name: stats[queue.id]["oldest_pending_age_seconds"] or 0.0 for queue in queues
            },
            paused={queue.name: queue.paused for queue in queues},
            keys={queue.name: stats[queue.id]["keys"] for queue in queues},
            caps={q.name: q.max_concurrency for q in queues if q.max_concurrency is not None},
            workers=[
                (
                    worker.worker_id,
                    max((now - worker.last_seen_at).total_seconds(), 0.0),
                    worker.state(now, holding=getattr(worker, "holding")),  # noqa: B009
                )
                for worker in seen
            ],
        )


class _Scrape:
    """What one scrape exposes: the counted metrics plus the database gauges."""

    def __init__(self, sources: Iterable[Collector]) -> None:
        self._sources = list(sources)

    def collect(self) -> Iterator[Metric]:
        for source in self._sources:
            yield from source.collect()


@probe
def metrics(request: HttpRequest) -> HttpResponse:
    """No API key; `Authorization: Bearer $TASKFORGE_METRICS_TOKEN` when that is set."""
    token = conf.METRICS_TOKEN
    if token and not _bearer_matches(request, token):
        response = error_response(
            401, "unauthenticated", "Missing or wrong metrics token (TASKFORGE_METRICS_TOKEN)."
        )
        response["WWW-Authenticate"] = 'Bearer realm="taskforge-metrics"'
        return response
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    return HttpResponse(
        encoder(_Scrape([counted_collector(), DatabaseGauges()])), content_type=content_type
    )


def _bearer_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
    # Constant-time, so response timing does not reveal the token.
    return scheme.lower() == "bearer" and hmac.compare_digest(
        given.strip().encode(), token.encode()
    )
