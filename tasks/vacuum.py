"""Vacuuming the task tables when Postgres has not: autovacuum off, or lagging.

Every move of a task writes a new version of its row (a status is in the
partial indexes' predicates, so no update is HOT), and retention deletes rows
in bulk.  Until a vacuum removes the dead versions, every statement that
meets them pays: the primary key's lookups visit each version, and the
partial indexes of the live statuses keep an entry per task that ever passed
through.  Measured with autovacuum off (`make bench`, e2e, four runs in one
service): Postgres CPU per task on the batched path grew 0.23 -> 0.36 ->
0.44 -> 0.54 -> 0.67 ms, run after run.

So the watchdog (`Vacuumer.poll`, every tick) looks at Postgres's count of
each table's dead rows every CHECK_SECONDS, and vacuums a table holding more
than TASKFORGE_VACUUM_DEAD_ROWS of them and more than a twentieth of its live
rows (0: never; leave it to autovacuum).  The vacuum runs on a thread of its
own, on a connection of its own, so the watchdog's ticks go on meanwhile.
`VACUUM (SKIP_LOCKED)` skips a table that is being vacuumed already (by
autovacuum, or by another watchdog), and takes no lock that a claim, an ack
or an enqueue waits on.
"""

from __future__ import annotations

import logging
import threading
import time

from django.db import connection

from taskforge.conf import conf
from taskforge.lib import pg

logger = logging.getLogger(__name__)

TABLES = ("tasks_task", "tasks_taskevent")
CHECK_SECONDS = 10.0
# Besides TASKFORGE_VACUUM_DEAD_ROWS: dead rows past this share of the live ones.
DEAD_SHARE = 0.05

_DEAD_ROWS = """
SELECT relname, n_live_tup, n_dead_tup FROM pg_stat_user_tables
WHERE relname = ANY(%(tables)s) ORDER BY relname
"""


def due(threshold: int) -> list[tuple[str, int]]:
    """The tables to vacuum now, with their dead rows (Postgres's statistics)."""
    with connection.cursor() as cursor:
        cursor.execute(_DEAD_ROWS, {"tables": list(TABLES)})
        rows = cursor.fetchall()
    return [(name, dead) for name, live, dead in rows if dead > max(threshold, live * DEAD_SHARE)]


def vacuum(tables: list[tuple[str, int]]) -> None:
    """VACUUM (SKIP_LOCKED) each table, on a connection of its own; failures are logged."""
    try:
        with pg.connect_own(autocommit=True) as own:
            for table, dead in tables:
                started = time.monotonic()
                own.execute(f"VACUUM (SKIP_LOCKED) {table}")
                logger.info(
                    "vacuum.done",
                    extra={
                        "table": table,
                        "dead_rows": dead,
                        "duration_ms": round((time.monotonic() - started) * 1000, 1),
                    },
                )
    except Exception as exc:
        logger.warning("vacuum.failed", extra={"error": repr(exc)})


class Vacuumer:
    """The watchdog's part: one check every CHECK_SECONDS, one vacuum at a time."""

    def __init__(self) -> None:
        self._next_check = 0.0
        self._thread: threading.Thread | None = None

    def poll(self) -> threading.Thread | None:
        """Start a vacuum of the tables that need one; the thread, if one started."""
        threshold = conf.VACUUM_DEAD_ROWS
        now = time.monotonic()
        if threshold <= 0 or now < self._next_check or self.running():
            return None
        self._next_check = now + CHECK_SECONDS
        tables = due(threshold)
        if not tables:
            return None
        self._thread = threading.Thread(
            target=vacuum, args=(tables,), name="taskforge-vacuum", daemon=True
        )
        self._thread.start()
        return self._thread

    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
