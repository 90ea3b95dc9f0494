"""Vacuuming and analyzing the task tables when Postgres has not: autovacuum off, or lagging.

Every move of a task writes a new version of its row (a status is in the
partial indexes' predicates, so no update is HOT), and retention deletes rows
in bulk.  Until a vacuum removes the dead versions, every statement that
meets them pays: the primary key's lookups visit each version, and the
partial indexes of the live statuses keep an entry per task that ever passed
through.  Measured with autovacuum off (`make bench`, e2e, four runs in one
service): Postgres CPU per task on the batched path grew 0.23 -> 0.36 ->
0.44 -> 0.54 -> 0.67 ms, run after run.

An analyze matters as much, for the plans rather than the rows.  The API runs
its hot statements prepared (taskforge.lib.internals.prepared_cursor), and a
prepared statement keeps the plan Postgres made for it until the table's
statistics change.  Made while the table is new or small, that plan reads the
table whole (a sequential scan is the cheapest way through ten pages), and it
keeps doing so as the table grows: with autovacuum off, the single path's
hand-out and ack read 66 -> 111 -> 148 -> 213 -> 240 heap pages per task
moved over one `make bench` e2e phase, Postgres CPU per task 1.7 -> 2.5 ms.  An
ANALYZE invalidates the cached plans; made again over the grown table, they go
through the primary key.

So the watchdog (`Vacuumer.poll`, every tick) reads Postgres's counts of each
table's rows every CHECK_SECONDS, and
- vacuums a table holding more than TASKFORGE_VACUUM_DEAD_ROWS dead rows and
  more than a twentieth of its live rows;
- analyzes a table changed (rows inserted, updated or deleted) more than
  ANALYZE_BASE + ANALYZE_SHARE of its live rows since its last analyze, the
  thresholds autovacuum uses by default;
- in one `VACUUM (ANALYZE)` when both are due.
TASKFORGE_VACUUM_DEAD_ROWS = 0 turns both off (autovacuum's job then).  The
work runs on a thread of its own, on a connection of its own, so the
watchdog's ticks go on meanwhile.  SKIP_LOCKED skips a table that is being
vacuumed or analyzed already (by autovacuum, or by another watchdog); neither
command takes a lock that a claim, an ack or an enqueue waits on.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from django.db import connection

from taskforge.conf import conf
from taskforge.lib import pg
from tasks import sql

logger = logging.getLogger(__name__)

TABLES = ("tasks_task", "tasks_taskevent")
CHECK_SECONDS = 10.0
# Besides TASKFORGE_VACUUM_DEAD_ROWS: dead rows past this share of the live ones.
DEAD_SHARE = 0.05
# Analyze past this many changed rows plus this share of the live ones
# (autovacuum_analyze_threshold and autovacuum_analyze_scale_factor's defaults).
ANALYZE_BASE = 50
ANALYZE_SHARE = 0.1


@dataclass(frozen=True, slots=True)
class Job:
    """What one table needs: a vacuum, an analyze, or both."""

    table: str
    dead_rows: int
    changed_rows: int
    vacuum: bool
    analyze: bool

    @property
    def command(self) -> str:
        if self.vacuum and self.analyze:
            return sql.VACUUM_ANALYZE.format(table=self.table)
        if self.vacuum:
            return sql.VACUUM.format(table=self.table)
        return sql.ANALYZE.format(table=self.table)


def due(threshold: int) -> list[Job]:
    """The tables to vacuum or analyze now (Postgres's statistics say which)."""
    with connection.cursor() as cursor:
        cursor.execute(sql.TABLE_COUNTS, {"tables": list(TABLES)})
        rows = cursor.fetchall()
    jobs = []
    for table, live, dead, changed in rows:
        vacuum = dead > max(threshold, live * DEAD_SHARE)
        analyze = changed > ANALYZE_BASE + live * ANALYZE_SHARE
        if vacuum or analyze:
            jobs.append(Job(table, dead, changed, vacuum, analyze))
    return jobs


def run(jobs: list[Job]) -> None:
    """Each job's command, on a connection of its own; failures are logged."""
    try:
        with pg.connect_own(autocommit=True) as own:
            for job in jobs:
                started = time.monotonic()
                own.execute(job.command)
                logger.info(
                    "vacuum.done" if job.vacuum else "analyze.done",
                    extra={
                        "table": job.table,
                        "dead_rows": job.dead_rows,
                        "changed_rows": job.changed_rows,
                        "analyzed": job.analyze,
                        "duration_ms": round((time.monotonic() - started) * 1000, 1),
                    },
                )
    except Exception as exc:
        logger.warning("vacuum.failed", extra={"error": repr(exc)})


class Vacuumer:
    """The watchdog's part: one check every CHECK_SECONDS, one run at a time."""

    def __init__(self) -> None:
        self._next_check = 0.0
        self._thread: threading.Thread | None = None

    def poll(self) -> threading.Thread | None:
        """Start vacuuming or analyzing the tables that need it; the thread, if one started."""
        threshold = conf.VACUUM_DEAD_ROWS
        now = time.monotonic()
        if threshold <= 0 or now < self._next_check or self.running():
            return None
        self._next_check = now + CHECK_SECONDS
        jobs = due(threshold)
        if not jobs:
            return None
        self._thread = threading.Thread(
            target=run, args=(jobs,), name="taskforge-vacuum", daemon=True
        )
        self._thread.start()
        return self._thread

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
