"""A big dead-letter queue and a big event history, then the reads that count or list them.

    DATABASE_URL=.../taskforge_dlqbench REDIS_URL=... SECRET_KEY=x \\
        python bench/dlq_depth.py --fill --dead 500000 --history 1000000
    DATABASE_URL=... python bench/dlq_depth.py            # the timings only

Use a scratch database (migrated): `--fill` writes, by SQL, `--dead` dead tasks spread over
`--queues` queues (`dlqbench-0` ...), each with the three events and the DLQ entry TaskForge
writes, `--history` done tasks with their events in `dlqbench-history`, and 20 dead tasks in
`dlqbench-quiet`, a queue whose tasks are all older than the rest (its events are the last
ones a newest-first walk of the whole table reaches); then `VACUUM (ANALYZE)`.  The timings
are the median and max of `--runs` calls of each read, in ms.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PREFIX = "dlqbench"
CHUNK = 250_000

# Per series number i: the creation time and a UUIDv7-shaped id (time-ordered).
_SERIES = """
    SELECT i, at,
           (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
            || lpad(to_hex(i %% 4096), 3, '0') || '8'
            || lpad(to_hex(i + %(base)s), 15, '0'))::uuid AS id,
           %(queue_ids)s::uuid[] AS queue_ids
    FROM (
        SELECT i, %(start)s::timestamptz + (i::float8 / %(total)s) * %(span)s * interval '1 second'
                  AS at
        FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
    ) s
"""

_QUEUE = "queue_ids[1 + (i %% array_length(queue_ids, 1))]"

FILL_TASKS = f"""
INSERT INTO tasks_task (id, queue_id, payload, status, priority, scheduled_at, claimed_at,
                        claimed_by, claimed_key_id, heartbeat_at, attempts, max_retries,
                        last_error, result, idempotency_key, created_at, updated_at,
                        status_changed_at, finished_at)
SELECT id, {_QUEUE}, '{{"n": 1}}'::jsonb, %(status)s, 5, at, at + interval '2 ms',
       'bench-worker', NULL, at + interval '2 ms', 1, 0,
       CASE WHEN %(status)s = 'dead' THEN 'RuntimeError: upstream said 503' END,
       CASE WHEN %(status)s = 'done' THEN '{{"ok": true}}'::jsonb END,
       NULL, at, at + interval '5 ms', at + interval '5 ms', at + interval '5 ms'
FROM ({_SERIES}) g
"""  # nosec B608 - constants only

FILL_EVENTS = f"""
INSERT INTO tasks_taskevent (task_id, queue_id, at, from_status, to_status, worker_id, attempt,
                             error)
SELECT g.id, CASE WHEN e.from_status = 'executing' THEN {_QUEUE} END,
       g.at + e.offset_ms * interval '1 ms', e.from_status,
       coalesce(e.to_status, %(status)s), CASE WHEN e.worker THEN 'bench-worker' END, e.attempt,
       CASE WHEN e.to_status IS NULL AND %(status)s = 'dead'
            THEN 'RuntimeError: upstream said 503' END
FROM ({_SERIES}) g, LATERAL (
    VALUES (1, 'pending', 'claimed', false, 0), (2, 'claimed', 'executing', true, 1),
           (5, 'executing', NULL, true, 1)
) AS e(offset_ms, from_status, to_status, worker, attempt)
"""  # nosec B608 - constants only

FILL_DLQ = """
INSERT INTO dlq_deadlettertask (task_id, queue_id, payload, last_error, attempts, died_at,
                                replayed_at, replay_count, deaths)
SELECT id, queue_id, payload, last_error, attempts, finished_at, NULL, 0, 1
FROM tasks_task WHERE queue_id = ANY(%(queue_ids)s::uuid[]) AND status = 'dead'
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fill", action="store_true", help="write the rows first")
    parser.add_argument("--dead", type=int, default=500_000)
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--history", type=int, default=1_000_000, help="done tasks")
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
    import django

    django.setup()
    if args.fill:
        _fill(args.dead, args.queues, args.history)
    print(json.dumps(_time(args.runs), indent=2))
    return 0


def _fill(dead: int, queues: int, history: int) -> None:
    from django.db import connection

    from queues.models import Queue

    def make(name: str) -> str:
        return str(Queue.objects.create(name=name, max_retries=0).pk)

    now = time.time()
    plan = [
        # (queues, tasks, status, start, span): the quiet queue's tasks come first.
        ([make(f"{PREFIX}-quiet")], 20, "dead", now - 9 * 86400, 60),
        ([make(f"{PREFIX}-{n}") for n in range(queues)], dead, "dead", now - 7 * 86400, 6 * 86400),
        ([make(f"{PREFIX}-history")], history, "done", now - 7 * 86400, 6 * 86400),
    ]
    base = 0  # ids differ across the plan's lines too
    with connection.cursor() as cursor:
        for queue_ids, count, status, start, span in plan:
            for lo in range(0, count, CHUNK):
                hi = min(lo + CHUNK, count) - 1
                params: dict[str, Any] = {
                    "queue_ids": queue_ids,
                    "status": status,
                    "start": time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(start)),
                    "total": count,
                    "span": span,
                    "lo": lo,
                    "hi": hi,
                    "base": base,
                }
                cursor.execute(FILL_TASKS, params)
                cursor.execute(FILL_EVENTS, params)
                print(f"{status}: {hi + 1:,} of {count:,}", file=sys.stderr)
            cursor.execute(FILL_DLQ, {"queue_ids": queue_ids})
            base += count
        _after_fill()
        cursor.execute("VACUUM (ANALYZE) tasks_task, tasks_taskevent, dlq_deadlettertask")


def _after_fill() -> None:
    """Rows written by SQL bypass TaskForge's own bookkeeping: set the DLQ depths right."""
    from dlq import depth as dlqdepth

    dlqdepth.reconcile()
    dlqdepth.compact()


def _time(runs: int) -> dict[str, dict[str, float]]:
    from django.test import RequestFactory

    from dashboard import queries
    from dashboard.admin.tasks import TaskEventAdmin
    from dashboard.metrics import DatabaseGauges
    from queues.models import Queue
    from tasks.models import TaskEvent
    from tasks.stats import queues_stats

    queues = list(Queue.objects.order_by("name"))
    quiet = Queue.objects.get(name=f"{PREFIX}-quiet")
    busy = Queue.objects.get(name=f"{PREFIX}-0")
    admin = TaskEventAdmin(TaskEvent, None)  # type: ignore[arg-type]

    def events(queue: Any, **extra: str) -> Callable[[], Any]:
        request = RequestFactory().get("/", {"queue__id__exact": str(queue.pk), **extra})
        ordering = admin.get_ordering(request)

        def page() -> Any:
            # The change list's page: the admin's queryset with its filters, the first 51
            # rows on its ordering (the lookahead paginator's probe is the same, with the
            # primary key alone).
            events = admin.get_queryset(request).filter(queue=queue, **extra)
            return list(events.select_related("queue").order_by(*ordering)[:51])

        return page

    reads: dict[str, Callable[[], Any]] = {
        "dashboard_dlq_depths": queries.dlq_depths,
        "queues_stats_all": lambda: queues_stats(queues),
        "metrics_read": DatabaseGauges._read,
        "admin_events_quiet_queue": events(quiet),
        "admin_events_busy_queue": events(busy),
        "admin_events_quiet_queue_dead": events(quiet, to_status="dead"),
    }
    out: dict[str, dict[str, float]] = {}
    for name, read in reads.items():
        read()  # warm
        times = []
        for _ in range(runs):
            t0 = time.perf_counter()
            read()
            times.append((time.perf_counter() - t0) * 1000)
        out[name] = {
            "median_ms": round(statistics.median(times), 2),
            "max_ms": round(max(times), 2),
        }
    return out


if __name__ == "__main__":
    sys.exit(main())
