"""Micro-benchmarks of the leans on dependencies' internals (taskforge/lib/internals.py).

    make test ARGS="bench/internals.py -s"

A pytest module so that it gets the test database; run it explicitly (it is
not collected with the suite).  Each comparison interleaves its variants,
ROUNDS times, and prints the median time per operation of each.
"""

from __future__ import annotations

import logging
import os
import statistics
import tempfile
import timeit
from collections.abc import Callable, Mapping
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone
from prometheus_client import Counter, values
from psycopg.pq import Format

from queues.models import Queue
from taskforge import metrics
from taskforge.lib import internals
from taskforge.lib.logging import JsonFormatter
from tasks.models import Task

ROUNDS = 9


def compare(title: str, variants: Mapping[str, Callable[..., object]], number: int) -> None:
    """Print the median microseconds per call of each variant (rounds interleaved)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(ROUNDS):
        for name, run in variants.items():
            times[name].append(timeit.timeit(run, number=number) / number * 1e6)
    print(f"\n{title}")
    for name, samples in times.items():
        print(f"  {name:<44} {statistics.median(samples):9.2f} us")


class _Null:
    def write(self, text: str) -> None:
        pass

    def flush(self) -> None:
        pass


def test_log_record_with_and_without_caller_lookup() -> None:
    logger = logging.getLogger("bench.internals")
    logger.propagate = False
    logger.setLevel(logging.INFO)
    handler = logging.StreamHandler(_Null())
    handler.setFormatter(JsonFormatter())
    logger.addHandler(handler)
    extra = {
        "task_id": "0195f3c4-7a4e-7d11-9c5a-3b1f2e4d5c6b",
        "queue": "emails",
        "worker_id": "worker-1",
        "from_status": "executing",
        "to_status": "done",
        "attempt": 1,
        "duration_ms": 12.5,
    }
    saved = logging._srcfile
    # What the stdlib sets (settings.py may have cleared it already).
    srcfile = os.path.normcase(logging.addLevelName.__code__.co_filename)

    def stdlib() -> None:
        logging._srcfile = srcfile
        logger.info("task.acked", extra=extra)

    def lean() -> None:
        logging._srcfile = None
        logger.info("task.acked", extra=extra)

    try:
        compare(
            "log record (JsonFormatter, null stream)",
            {"caller lookup (stdlib)": stdlib, "_srcfile = None": lean},
            20_000,
        )
    finally:
        logging._srcfile = saved
        logger.removeHandler(handler)


def test_counter_inc_by_value_class() -> None:
    saved = values.ValueClass
    previous_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    with tempfile.TemporaryDirectory() as directory:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = directory
        try:
            counters: dict[str, Callable[..., object]] = {}
            for name, value_class in {
                "in memory (MutexValue)": values.MutexValue,
                "files, default pid names": values.MultiProcessValue(),
                "files, TaskForge's host-pid names": values.MultiProcessValue(
                    metrics.process_identifier
                ),
            }.items():
                values.ValueClass = value_class
                counter = Counter(f"bench_{len(counters)}", "bench", ["queue"], registry=None)
                counters[name] = counter.labels(queue="emails").inc
        finally:
            values.ValueClass = saved
            if previous_dir is None:
                del os.environ["PROMETHEUS_MULTIPROC_DIR"]
            else:
                os.environ["PROMETHEUS_MULTIPROC_DIR"] = previous_dir
        compare("counter inc", counters, 50_000)
        values.close_all_multiprocess_files()


TIMESTAMPS = """
SELECT now() - n * interval '1 second' AS a, now() AS b, now() AS c, now() AS d,
       now() AS e, now() AS f, now() AS g, now() AS h
FROM generate_series(1, %s) AS n
"""


@pytest.mark.django_db
def test_timestamptz_loaders() -> None:
    connection.ensure_connection()
    pg = connection.connection
    django_loader = pg.adapters.get_loader(internals.TIMESTAMPTZ_OID, Format.TEXT)(
        internals.TIMESTAMPTZ_OID, pg
    )
    assert internals.TIMESTAMPTZ_LOADER is not None
    c_loader = internals.TIMESTAMPTZ_LOADER(internals.TIMESTAMPTZ_OID, pg)
    data = b"2026-11-30 05:09:23.075089+00"
    assert django_loader.load(data) == c_loader.load(data)
    compare(
        "one timestamptz value, loader alone",
        {
            f"Django's ({type(django_loader).__name__})": lambda: django_loader.load(data),
            "psycopg's C loader": lambda: c_loader.load(data),
        },
        100_000,
    )

    def fetch(fast: bool) -> Callable[[], object]:
        def run() -> object:
            with connection.cursor() as cursor:
                if fast:
                    internals.load_timestamptz_in_c(cursor)
                cursor.execute(TIMESTAMPS, [1000])
                return cursor.fetchall()

        return run

    compare(
        "1000 rows x 8 timestamptz, execute + fetchall (divide by 8000 per value)",
        {"Django's loader": fetch(False), "psycopg's C loader": fetch(True)},
        20,
    )


@pytest.mark.django_db
@pytest.mark.parametrize("count", [1, 10, 100])
def test_raw_against_instances_from_rows(count: int) -> None:
    queue = Queue.objects.create(name="bench")
    now = timezone.now()
    Task.objects.bulk_create(
        Task(
            queue=queue,
            payload={"n": n, "to": "someone@example.com"},
            status="executing",
            scheduled_at=now,
            claimed_at=now,
            claimed_by="worker-1",
            heartbeat_at=now,
            attempts=1,
            max_retries=3,
            created_at=now - timedelta(seconds=n),
            updated_at=now,
            status_changed_at=now,
        )
        for n in range(count)
    )
    query = (
        "SELECT t.*, t.status_changed_at AS previous_changed_at"
        " FROM tasks_task t ORDER BY t.id LIMIT %s"
    )

    def raw() -> list[Task]:
        return list(Task.objects.raw(query, [count]))

    def rows() -> tuple[list[str], list[tuple[object, ...]]]:
        with connection.cursor() as cursor:
            cursor.execute(query, [count])
            return [column.name for column in cursor.description], cursor.fetchall()

    def built() -> list[Task]:
        return internals.instances_from_rows(Task, *rows())

    by_raw, by_rows = raw(), built()
    assert [vars(t) | {"_state": None} for t in by_raw] == [
        vars(t) | {"_state": None} for t in by_rows
    ]
    compare(
        f"{count} Task rows: query, fetch and build (same cursor, Django's loaders)",
        {
            "Task.objects.raw": raw,
            "cursor + instances_from_rows": built,
            "cursor alone (no instances)": rows,
        },
        max(20, 2000 // count),
    )
