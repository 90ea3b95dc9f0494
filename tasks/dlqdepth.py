"""The DLQ depth of each queue, kept as it changes, so a read costs a few rows.

Counting the dead tasks (task_dead_idx) costs a pass over the dead-letter
queue on every read: tens of milliseconds at half a million dead tasks, for
every dashboard page, stats call and /metrics scrape.  Instead each move into
`dead` (+1), out of it (a replay, -n) and each delete of dead tasks (a
discard, retention, -n) inserts one `DeadCount` row in its own transaction:
`tasks.transitions` does (`record`), nothing else.  A depth is the sum of the
queue's rows, exact as of the reader's snapshot.

Rows are only inserted: nacks of one queue dying at once never wait on a
counter row or deadlock on two.  The watchdog folds each queue's rows into one
(`compact`), so a queue has a handful between rounds.  `reconcile` sets the
sums right from the tasks themselves, in one statement (one snapshot: exact
while tasks move); the watchdog runs it every RECONCILE_SECONDS, for what
processes of a version without the counter moved during a rolling upgrade,
and logs any correction.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection
from django.db.models import Sum

from tasks.models import DeadCount

logger = logging.getLogger(__name__)

RECONCILE_SECONDS = 600.0
# Rows folded per compact() statement.
COMPACT_BATCH = 10_000

_COMPACT = """
WITH gone AS (
    DELETE FROM tasks_deadcount
    WHERE id IN (
        SELECT id FROM tasks_deadcount
        WHERE queue_id IN (
            SELECT queue_id FROM tasks_deadcount GROUP BY queue_id HAVING count(*) > 1
        )
        ORDER BY id
        LIMIT %(batch)s
        FOR UPDATE SKIP LOCKED
    )
    RETURNING queue_id, dead
), folded AS (
    INSERT INTO tasks_deadcount (queue_id, dead)
    SELECT queue_id, sum(dead) FROM gone GROUP BY queue_id HAVING sum(dead) <> 0
)
SELECT count(*) FROM gone
"""

_RECONCILE = """
INSERT INTO tasks_deadcount (queue_id, dead)
SELECT queue_id, actual - counted FROM (
    SELECT coalesce(t.queue_id, c.queue_id) AS queue_id,
           coalesce(t.n, 0) AS actual, coalesce(c.n, 0) AS counted
    FROM (SELECT queue_id, count(*) AS n FROM tasks_task WHERE status = 'dead'
          GROUP BY queue_id) t
    FULL JOIN (SELECT queue_id, sum(dead) AS n FROM tasks_deadcount GROUP BY queue_id) c
        ON c.queue_id = t.queue_id
) d
WHERE actual <> counted
RETURNING queue_id, dead
"""


def record(changes: Mapping[Any, int]) -> None:
    """Add `queue_id: delta` to the depths, in the caller's transaction (tasks.transitions)."""
    rows = [DeadCount(queue_id=queue_id, dead=n) for queue_id, n in changes.items() if n]
    if rows:
        DeadCount.objects.bulk_create(rows)


def depths(queue_ids: Iterable[uuid.UUID]) -> dict[uuid.UUID, int]:
    """The DLQ depth of each queue (0 for one without dead tasks), over deadcount_queue_idx."""
    ids = list(queue_ids)
    found = dict(
        DeadCount.objects.filter(queue_id__in=ids)
        .values("queue_id")
        .annotate(dead=Sum("dead"))
        .order_by()
        .values_list("queue_id", "dead")
    )
    return {queue_id: int(found.get(queue_id) or 0) for queue_id in ids}


def compact() -> int:
    """Fold each queue's rows into one (a queue at 0 keeps none); returns the rows folded.

    SKIP LOCKED: watchdogs running at once fold different rows, never wait.
    """
    with connection.cursor() as cursor:
        cursor.execute(_COMPACT, {"batch": COMPACT_BATCH})
        (folded,) = cursor.fetchone()
    return int(folded)


def reconcile() -> dict[Any, int]:
    """Set every depth to the count of the queue's dead tasks; returns the corrections."""
    with connection.cursor() as cursor:
        cursor.execute(_RECONCILE)
        corrections = {queue_id: int(delta) for queue_id, delta in cursor.fetchall()}
    if corrections:
        logger.warning(
            "dlq_depth.corrected",
            extra={"corrections": {str(queue_id): d for queue_id, d in corrections.items()}},
        )
    return corrections
