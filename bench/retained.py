"""History for `bench/run.py --retained N`: N finished tasks with their events, made by SQL.

The rows are what TaskForge itself writes for a finished task: 90 % `done` (four events in two
rows: buffered by a dispatcher, then the ack, whose row records the hand-out; a result; the
creation is the task row's; a task its enqueue buffered has no row for that move either), 7 %
`dead` (the same, the last move to `dead` with its error; a DLQ entry; the queue's DLQ depth)
and 3 % `cancelled` (one event). They belong to one queue of their own (`bench-history`), were
created over the last six days (inside the default retention, so the watchdog leaves them alone
during the run) and carry the bench's payload. `generate_series` in chunks, then `VACUUM
(ANALYZE)`: the statistics then say what a server with months of history says, that nearly every
task is finished.

Also here: the reads that must not scan history, timed against that queue.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any

HISTORY_QUEUE = "bench-history"
CHUNK = 250_000
SPAN_SECONDS = 6 * 24 * 3600

# Per series number i: the creation time, the status, and a UUIDv7-shaped id (its first
# 48 bits the creation time in ms, so ids are time-ordered as TaskForge's are).
_SERIES = """
    SELECT i, at, status,
           (lpad(to_hex((extract(epoch FROM at) * 1000)::bigint), 12, '0') || '7'
            || lpad(to_hex(i %% 4096), 3, '0') || '8' || lpad(to_hex(i), 15, '0'))::uuid AS id
    FROM (
        SELECT i, %(start)s::timestamptz + (i::float8 / %(total)s) * %(span)s * interval '1 second'
                  AS at,
               CASE WHEN i %% 100 < 90 THEN 'done' WHEN i %% 100 < 97 THEN 'dead'
                    ELSE 'cancelled' END AS status
        FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
    ) s
"""

FILL_TASKS = f"""
INSERT INTO tasks_task (id, queue_id, payload, status, priority, scheduled_at, claimed_at,
                        claimed_by, claimed_key_id, heartbeat_at, attempts, max_retries,
                        last_error, result, idempotency_key, created_at, updated_at,
                        status_changed_at, finished_at)
SELECT id, %(queue_id)s::uuid, %(payload)s::jsonb, status, 5, at,
       CASE WHEN status <> 'cancelled' THEN at + interval '2 ms' END,
       CASE WHEN status <> 'cancelled' THEN 'history-worker-' || (i %% 16) END,
       CASE WHEN status <> 'cancelled' THEN 1 + i %% 4 END,
       CASE WHEN status <> 'cancelled' THEN at + interval '2 ms' END,
       CASE WHEN status = 'cancelled' THEN 0 ELSE 1 END, 0,
       CASE WHEN status = 'dead' THEN 'RuntimeError: upstream said 503' END,
       CASE WHEN status = 'done' THEN '{{"ok": true}}'::jsonb END,
       NULL, at, at + interval '5 ms', at + interval '5 ms', at + interval '5 ms'
FROM ({_SERIES}) g
"""  # nosec B608 - constants only

# The rows TaskForge writes (tasks.events): the dispatcher's buffering, and
# the attempt's outcome, which records its hand-out (claimed_at).
FILL_EVENTS = f"""
INSERT INTO tasks_taskevent (task_id, queue_id, at, from_status, to_status, worker_id, attempt,
                             error, claimed_at)
SELECT g.id, CASE WHEN e.from_status = 'executing' THEN %(queue_id)s::uuid END,
       g.at + e.offset_ms * interval '1 ms', e.from_status,
       e.to_status, CASE WHEN e.worker THEN 'history-worker-' || (g.i %% 16) END, e.attempt,
       CASE WHEN e.to_status = 'dead' THEN 'RuntimeError: upstream said 503' END,
       CASE WHEN e.worker THEN g.at + interval '2 ms' END
FROM ({_SERIES}) g, LATERAL (
    SELECT * FROM (VALUES (1, 'pending', 'claimed', false, 0),
                          (5, 'executing', g.status, true, 1))
        AS v(offset_ms, from_status, to_status, worker, attempt)
    WHERE g.status <> 'cancelled'
    UNION ALL
    SELECT * FROM (VALUES (5, 'pending', 'cancelled', false, 0))
        AS v(offset_ms, from_status, to_status, worker, attempt)
    WHERE g.status = 'cancelled'
) e
"""  # nosec B608 - constants only

FILL_DLQ = """
INSERT INTO dlq_deadlettertask (task_id, queue_id, payload, last_error, attempts, died_at,
                                replayed_at, replay_count, deaths)
SELECT id, queue_id, payload, last_error, attempts, finished_at, NULL, 0, 1
FROM tasks_task WHERE queue_id = %(queue_id)s::uuid AND status = 'dead'
"""

# The queue's DLQ depth, which TaskForge keeps beside its moves (dlq.depth).
FILL_DLQ_DEPTH = """
INSERT INTO tasks_deadcount (queue_id, dead)
SELECT %(queue_id)s::uuid, count(*) FROM tasks_task
WHERE queue_id = %(queue_id)s::uuid AND status = 'dead'
"""

VACUUM = "VACUUM (ANALYZE) tasks_task, tasks_taskevent, dlq_deadlettertask"

SIZES = """
SELECT c.relname, pg_total_relation_size(c.oid), pg_relation_size(c.oid)
FROM pg_class c WHERE c.relname IN ('tasks_task', 'tasks_taskevent', 'dlq_deadlettertask')
"""


def fill(
    libpq_url: str, queue_id: str, count: int, payload: Any, log: Callable[[str], None]
) -> dict[str, Any]:
    """Write `count` finished tasks with their events into the queue; VACUUM (ANALYZE)."""
    import psycopg

    started = time.monotonic()
    start = time.time() - SPAN_SECONDS - 3600
    with psycopg.connect(libpq_url, autocommit=True, connect_timeout=5) as conn:
        before = _sizes(conn)
        for lo in range(0, count, CHUNK):
            hi = min(lo + CHUNK, count) - 1
            params = {
                "queue_id": queue_id,
                "payload": json.dumps(payload),
                "start": _timestamp(start),
                "total": count,
                "span": SPAN_SECONDS,
                "lo": lo,
                "hi": hi,
            }
            with conn.transaction():
                conn.execute(FILL_TASKS, params)
                conn.execute(FILL_EVENTS, params)
            log(f"retained: {hi + 1:,} of {count:,} tasks written")
        conn.execute(FILL_DLQ, {"queue_id": queue_id})
        conn.execute(FILL_DLQ_DEPTH, {"queue_id": queue_id})
        filled = time.monotonic() - started
        conn.execute(VACUUM)
        # Write the fill's gigabytes out before measuring: otherwise the checkpoint
        # and the kernel's writeback run during the retained phases and slow them
        # all, the API's own CPU per request included (seen: +35 % for an enqueue).
        conn.execute("CHECKPOINT")
        os.sync()
        after = _sizes(conn)
    per_million = {
        name: round((after[name] - before.get(name, 0)) / count * 1e6 / 2**30, 3) for name in after
    }
    return {
        "tasks": count,
        "fill_s": round(filled, 1),
        "vacuum_analyze_s": round(time.monotonic() - started - filled, 1),
        "gib_total": round(sum(after.values()) / 2**30, 3),
        "gib_per_million_tasks": per_million,
    }


def _sizes(conn: Any) -> dict[str, int]:
    return {name: total for name, total, _ in conn.execute(SIZES).fetchall()}


def _timestamp(epoch: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S+00", time.gmtime(epoch))


def time_reads(
    request: Callable[[str], Any], queue: str, samples: int = 15
) -> dict[str, dict[str, float]]:
    """Median and max client-side ms of each read that must not scan the queue's history."""
    paths = {
        "stats": f"/queues/{queue}/stats",
        "task_list": f"/queues/{queue}/tasks",
        "task_list_dead": f"/queues/{queue}/tasks?status=dead",
        "task_list_pending": f"/queues/{queue}/tasks?status=pending",
        "dlq_list": f"/queues/{queue}/dlq",
    }
    out: dict[str, dict[str, float]] = {}
    for name, path in paths.items():
        request(path)  # warm
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            request(path)
            times.append((time.perf_counter() - t0) * 1000)
        times.sort()
        out[name] = {"median_ms": round(times[len(times) // 2], 2), "max_ms": round(times[-1], 2)}
    return out
