"""EXPLAIN (ANALYZE) the hot statements under whatever statistics the database holds.

    DATABASE_URL=... REDIS_URL=... SECRET_KEY=x python bench/explain.py [--live 3000]

Run it on an empty database and on one with history (`bench/run.py --retained N --keep-db`,
then DATABASE_URL pointing at the benchmark database): a plan must not change with the
statistics.  It makes `--live` tasks in a queue of its own (pending, some buffered, some
executing), EXPLAINs each hot statement with real parameters inside a transaction that is
rolled back, prints each plan's shape (the scan nodes) and time, and deletes its queue.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SCAN = re.compile(
    r"((?:Parallel )?(?:Index Only Scan|Index Scan|Bitmap Index Scan|Seq Scan)(?: Backward)?"
    r"(?: using \w+)? on \w+|Nested Loop|Hash Join|Merge Join|Sort)"
)


class Rollback(Exception):
    pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=3000, help="live tasks to make")
    parser.add_argument("--verbose", action="store_true", help="print whole plans")
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "taskforge.settings")
    import django

    django.setup()
    from django.db import connection
    from django.utils import timezone

    from queues.models import Queue
    from tasks import sql, stats, transitions
    from tasks.models import Task
    from workers import sql as worker_sql

    now = timezone.now()
    queue = Queue.objects.create(name=f"explain-{uuid.uuid4().hex[:6]}", max_retries=3)
    try:
        new = [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(args.live)]
        transitions.create(new, now=now)
        buffered = [row[0] for row in transitions.buffer_due(queue, limit=args.live // 2)]
        executing = transitions.hand_out(buffered[: args.live // 4], worker_id="explain")
        held = [str(task.pk) for task in executing][:100]
        claimed = buffered[args.live // 4 :][:100]
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE tasks_task")
            cursor.execute(
                "SELECT count(*), count(*) FILTER (WHERE status = 'done') FROM tasks_task"
            )
            total, done = cursor.fetchone()
        print(f"tasks_task: {total:,} rows, {done:,} done; live in the probe queue: {args.live:,}")
        statements: list[tuple[str, Any, dict[str, Any]]] = [
            (
                "buffer_due (100)",
                sql.BUFFER_DUE,
                {"queue_id": queue.id, "now": now, "limit": 100, "better_than": None},
            ),
            (
                "hand_out (100)",
                sql.HAND_OUT,
                {
                    "ids": claimed,
                    "worker_id": "explain",
                    "key_id": None,
                    "now": now,
                    "push": False,
                    "run": False,
                },
            ),
            (
                "hand_out (1)",
                sql.HAND_OUT,
                {
                    "ids": claimed[:1],
                    "worker_id": "explain",
                    "key_id": None,
                    "now": now,
                    "push": False,
                    "run": False,
                },
            ),
            (
                "ack (100)",
                sql.ACK,
                {
                    "worker_id": "explain",
                    "key_id": None,
                    "now": now,
                    "ids": held,
                    "attempts": [None] * len(held),
                    "results": [None] * len(held),
                },
            ),
            (
                "ack (1)",
                sql.ACK,
                {
                    "worker_id": "explain",
                    "key_id": None,
                    "now": now,
                    "ids": held[:1],
                    "attempts": [None],
                    "results": [None],
                },
            ),
            (
                "heartbeat (100)",
                worker_sql.HEARTBEAT,
                {
                    "worker_id": "explain",
                    "key_id": None,
                    "now": now,
                    "ids": held,
                    "attempts": [None] * len(held),
                },
            ),
        ]
        for name, text, params in statements:
            explain(name, text, params, args.verbose)
        orm: list[tuple[str, Callable[[], object]]] = [
            ("stats", lambda: stats.queue_stats(queue)),
            (
                "reconcile scan",
                lambda: list(
                    Task.objects.filter(status="claimed")
                    .order_by("status_changed_at", "id")
                    .values_list("id")[:500]
                ),
            ),
            (
                "expired leases",
                lambda: list(Task.objects.lease_expired(now).values_list("id")[:100]),
            ),
            (
                "task list",
                lambda: list(Task.objects.filter(queue=queue).order_by("-created_at", "-id")[:51]),
            ),
        ]
        from django.test.utils import CaptureQueriesContext

        for name, run in orm:
            with CaptureQueriesContext(connection) as captured:
                run()
            for query in captured.captured_queries:
                explain(name, query["sql"], None, args.verbose)
    finally:
        Task.objects.filter(queue=queue).delete()
        queue.delete()
    return 0


def explain(name: str, statement: Any, params: dict[str, Any] | None, verbose: bool) -> None:
    """EXPLAIN (ANALYZE) a tasks.sql Statement (with its planner settings) or an SQL text."""
    from django.db import transaction

    from taskforge.lib import pg

    text = getattr(statement, "text", statement)
    off = getattr(statement, "off", ())

    plan: list[str] = []
    started = time.perf_counter()
    try:
        with transaction.atomic(), pg.cursor() as cursor, pg.planner_off(cursor, off):
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + text, params)
            plan = [row[0] for row in cursor.fetchall()]
            raise Rollback
    except Rollback:
        pass
    took = (time.perf_counter() - started) * 1000
    shape = [m.group(1) for line in plan for m in [SCAN.search(line)] if m]
    execution = next((line for line in plan if line.startswith("Execution Time")), "")
    print(f"\n{name}: {execution} ({took:.1f} ms with the round trip)")
    print("  " + " > ".join(shape))
    if verbose:
        print("\n".join("    " + line for line in plan))


if __name__ == "__main__":
    sys.exit(main())
