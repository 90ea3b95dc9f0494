"""EXPLAIN every query of the dashboard and the admin on a table of a million tasks.

Run against a scratch database (it is filled with generated rows):

    createdb taskforge_explain
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/taskforge_explain \\
    REDIS_URL=redis://127.0.0.1:6379/4 SECRET_KEY=x \\
        python -m dashboard.tests.explain_1m --seed 1000000

It migrates, seeds (only when the task table is empty), ANALYZEs, requests
each page as a staff user, and runs `EXPLAIN (ANALYZE, BUFFERS)` on every
SELECT the page made; it prints each page's statements with their time and
plan, and flags sequential scans and sorts of the task and event tables.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

SEED_SQL = [
    # Leftovers of an interrupted seed (the task table is empty when seeding).
    "TRUNCATE queues_queue, workers_worker CASCADE",
    # 20 queues; 1 in 5 tasks in "bulk", the rest spread.
    """
    INSERT INTO queues_queue (id, name, max_retries, rate_limit, paused, created_at)
    SELECT gen_random_uuid(), CASE WHEN n = 0 THEN 'bulk' ELSE 'queue-' || n END, 3, NULL,
           n = 7, now() - interval '30 days'
    FROM generate_series(0, 19) AS n
    """,
    # Tasks over the last 30 days, oldest first (ids are time-ordered like UUIDv7:
    # the uuid's first 48 bits are the creation time in ms).  Status mix: 90 %
    # done, 3 % cancelled, 1 % dead, 3 % pending (some scheduled ahead), 1 %
    # retry, 1 % executing, 1 % claimed.
    """
    WITH q AS (SELECT array_agg(id ORDER BY name) AS ids FROM queues_queue),
    g AS (
        SELECT n, now() - (interval '30 days') * (1 - n::float / %(count)s) AS at,
               ('x' || substr(md5(n::text || 'r'), 1, 7))::bit(28)::int %% 100 AS r
        FROM generate_series(1, %(count)s) AS n
    )
    INSERT INTO tasks_task (id, queue_id, payload, status, priority, scheduled_at, claimed_at,
        claimed_by, heartbeat_at, attempts, max_retries, last_error, result, idempotency_key,
        created_at, updated_at, status_changed_at, finished_at)
    SELECT
        (lpad(to_hex((extract(epoch FROM g.at) * 1000)::bigint), 12, '0')
         || '7' || substr(md5(g.n::text), 1, 3) || '8' || substr(md5(g.n::text), 4, 15))::uuid,
        q.ids[1 + CASE WHEN g.n %% 5 = 0 THEN 0 ELSE 1 + g.n %% 19 END],
        jsonb_build_object('n', g.n, 'to', 'user' || g.n || '@example.com'),
        s.status,
        1 + g.n %% 10,
        CASE WHEN s.status = 'pending' AND g.r = 93 THEN now() + interval '1 hour' ELSE g.at END,
        CASE WHEN s.status IN ('executing', 'done', 'dead', 'retry') THEN g.at END,
        CASE WHEN s.status IN ('executing', 'done', 'dead', 'retry')
             THEN 'worker-' || (g.n %% 200) END,
        CASE WHEN s.status = 'executing' THEN now() - interval '5 seconds' * (g.n %% 5)
             WHEN s.status IN ('done', 'dead', 'retry') THEN g.at END,
        CASE WHEN s.status IN ('done', 'executing') THEN 1
             WHEN s.status IN ('dead') THEN 4 WHEN s.status = 'retry' THEN 2 ELSE 0 END,
        3,
        CASE WHEN s.status IN ('dead', 'retry') THEN 'RuntimeError: upstream said 503' END,
        CASE WHEN s.status = 'done' THEN '{"ok": true}'::jsonb END,
        NULL, g.at, g.at, g.at,
        CASE WHEN s.status IN ('done', 'dead', 'cancelled') THEN g.at END
    FROM g, q, LATERAL (SELECT CASE
        WHEN g.r < 90 THEN 'done' WHEN g.r < 93 THEN 'cancelled' WHEN g.r < 94 THEN 'dead'
        WHEN g.r < 97 THEN 'pending' WHEN g.r < 98 THEN 'retry' WHEN g.r < 99 THEN 'executing'
        ELSE 'claimed' END AS status) AS s
    """,
    # One event per task that moved (its latest move; its creation is the
    # task row's); the newest tasks' events fall into the stats' last-minute window.
    """
    INSERT INTO tasks_taskevent (task_id, queue_id, at, from_status, to_status, worker_id,
                                 attempt, error)
    SELECT id, CASE WHEN status IN ('done', 'dead', 'retry') THEN queue_id END,
           updated_at + interval '1 second',
           CASE WHEN status IN ('done', 'dead', 'retry') THEN 'executing'
                WHEN status = 'executing' THEN 'claimed' ELSE 'pending' END,
           status, claimed_by, attempts, last_error
    FROM tasks_task WHERE status <> 'pending'
    """,
    """
    INSERT INTO dlq_deadlettertask (task_id, queue_id, payload, last_error, attempts, died_at,
                                    replayed_at, replay_count, deaths)
    SELECT id, queue_id, payload, last_error, attempts, finished_at, NULL, 0, 1
    FROM tasks_task WHERE status = 'dead'
    """,
    # The DLQ depths TaskForge keeps beside its moves (dlq.depth).
    """
    INSERT INTO tasks_deadcount (queue_id, dead)
    SELECT queue_id, count(*) FROM tasks_task WHERE status = 'dead' GROUP BY queue_id
    """,
    """
    INSERT INTO workers_worker (worker_id, last_seen_at)
    SELECT 'worker-' || n, now() - interval '1 second' * (n * 3)
    FROM generate_series(0, 199) AS n
    """,
]

FLAGS = [
    (re.compile(r"Seq Scan on (tasks_task|tasks_taskevent|dlq_deadlettertask)\b"), "SEQ SCAN"),
    (re.compile(r"Sort Method: (external|top-N heapsort|quicksort).*"), "SORT"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1_000_000, help="tasks to generate")
    parser.add_argument("--verbose", action="store_true", help="print whole plans")
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
    import django

    django.setup()
    from django.contrib.auth.models import User
    from django.core.management import call_command
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_test_environment

    from dashboard import snapshot
    from queues.models import Queue
    from tasks.models import Task

    setup_test_environment()
    call_command("migrate", verbosity=0)
    if not Task.objects.exists():
        print(f"seeding {args.seed:,} tasks ...", flush=True)
        started = time.monotonic()
        with connection.cursor() as cursor:
            for statement in SEED_SQL:
                cursor.execute(statement, {"count": args.seed})
            cursor.execute("ANALYZE")
        print(f"seeded in {time.monotonic() - started:.0f} s", flush=True)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE tasks_task")
        cursor.execute("SELECT count(*) FROM tasks_task")
        print(f"tasks_task rows: {cursor.fetchone()[0]:,}")

    user, _ = User.objects.get_or_create(username="explain", defaults={"is_staff": True})
    user.is_superuser = user.is_staff = True
    user.save()
    client = Client()
    client.force_login(user)

    bulk = Queue.objects.get(name="bulk")
    one_task = Task.objects.filter(queue=bulk, status="dead").order_by("-created_at").first()
    assert one_task is not None
    worker = one_task.claimed_by
    pages = [
        ("overview", "/admin/dashboard/"),
        ("tasks, all queues", "/admin/dashboard/tasks/"),
        ("tasks, one queue", "/admin/dashboard/tasks/?queue=bulk"),
        ("tasks, queue+status dead", "/admin/dashboard/tasks/?queue=bulk&status=dead"),
        ("tasks, status retry, all queues", "/admin/dashboard/tasks/?status=retry"),
        ("tasks, worker", f"/admin/dashboard/tasks/?worker={worker}"),
        (
            "tasks, queue + 1 day range",
            "/admin/dashboard/tasks/?queue=bulk&created_after=2000-01-01T00:00"
            "&created_before=2100-01-01T00:00",
        ),
        ("task page", f"/admin/dashboard/tasks/{one_task.pk}"),
        ("dlq, all queues", "/admin/dashboard/dlq/"),
        ("dlq, one queue", "/admin/dashboard/dlq/?queue=bulk"),
        ("workers", "/admin/dashboard/workers/"),
        ("admin tasks", "/admin/tasks/task/"),
        ("admin tasks, status dead", "/admin/tasks/task/?status__exact=dead"),
        ("admin tasks, queue", f"/admin/tasks/task/?queue__id__exact={bulk.pk}"),
        (
            "admin tasks, queue+status",
            f"/admin/tasks/task/?queue__id__exact={bulk.pk}&status__exact=retry",
        ),
        ("admin tasks, page 20", "/admin/tasks/task/?p=20"),
        ("admin events", "/admin/tasks/taskevent/"),
        ("admin events, queue", f"/admin/tasks/taskevent/?queue__id__exact={bulk.pk}"),
        ("admin dlq", "/admin/dlq/deadlettertask/"),
    ]
    # Deep page of the inspector: follow "Older" 20 times.
    url = "/admin/dashboard/tasks/?queue=bulk"
    for _ in range(20):
        response = client.get(url)
        url = response.context["next_url"]
    pages.append(("tasks, one queue, page 21", url))

    worst: list[tuple[float, str, str]] = []
    for label, path in pages:
        snapshot.invalidate()
        with CaptureQueriesContext(connection) as captured:
            started = time.monotonic()
            response = client.get(path)
            elapsed = (time.monotonic() - started) * 1000
        if hasattr(response, "streaming_content"):
            b"".join(response.streaming_content)
        print(
            f"\n=== {label}: {path} -> {response.status_code}, {elapsed:.0f} ms, "
            f"{len(captured.captured_queries)} queries"
        )
        for query in captured.captured_queries:
            sql = query["sql"]
            if not sql.lstrip("( ").upper().startswith("SELECT") or "django_session" in sql:
                continue
            with connection.cursor() as cursor:
                cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql)
                plan = [row[0] for row in cursor.fetchall()]
            timing = re.search(r"Execution Time: ([\d.]+)", plan[-1])
            assert timing is not None, plan[-1]
            total = float(timing.group(1))
            flags = sorted({name for line in plan for rx, name in FLAGS if rx.search(line)})
            worst.append((total, label, sql[:160]))
            print(f"  {total:8.2f} ms {' '.join(flags):<16} {sql[:150]}")
            shown = (
                plan
                if args.verbose
                else [
                    line
                    for line in plan
                    if any(k in line for k in ("Scan", "Sort", "Limit", "Append", "Aggregate"))
                ][:8]
            )
            for line in shown:
                print(f"             {line}")
    print("\nslowest statements:")
    for total, label, sql in sorted(worst, reverse=True)[:10]:
        print(f"  {total:8.2f} ms  {label}: {sql}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
