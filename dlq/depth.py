"""The DLQ depth of each queue, kept as it changes, so a read costs a few rows.

Counting the dead tasks (task_dead_idx) costs a pass over the dead-letter
queue on every read: tens of milliseconds at half a million dead tasks, for
every dashboard page, stats call and /metrics scrape.  Instead each move into
`dead` (+1), out of it (a replay, -n) and each delete of dead tasks (a
discard, retention, -n) inserts one `DeadCount` row in its own transaction:
`dlq.receivers` does (`record`), on the signals `tasks.transitions` sends
inside the move's transaction, and nothing else.  A depth is the sum of the
queue's rows, exact as of the reader's snapshot.

Rows are only inserted: nacks of one queue dying at once never wait on a
counter row or deadlock on two.  The watchdog's round (`tasks.signals.upkeep`,
`keep`) folds each queue's rows into one (`compact`), so a queue has a handful
between rounds.  `reconcile` sets the sums right from the tasks themselves, in
one statement (one snapshot: exact while tasks move); `keep` runs it every
RECONCILE_SECONDS, for what processes of a version without the counter moved
during a rolling upgrade, and logs any correction.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connection
from django.db.models import Sum

from dlq import sql
from dlq.models import DeadCount

logger = logging.getLogger(__name__)

RECONCILE_SECONDS = 600.0
# Rows folded per compact() statement.
COMPACT_BATCH = 10_000


def record(changes: Mapping[Any, int]) -> None:
    """Add `queue_id: delta` to the depths, in the caller's transaction (the move's)."""
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
        cursor.execute(sql.COMPACT, {"batch": COMPACT_BATCH})
        (folded,) = cursor.fetchone()
    return int(folded)


def reconcile() -> dict[Any, int]:
    """Set every depth to the count of the queue's dead tasks; returns the corrections."""
    with connection.cursor() as cursor:
        cursor.execute(sql.RECONCILE)
        corrections = {queue_id: int(delta) for queue_id, delta in cursor.fetchall()}
    if corrections:
        logger.warning(
            "dlq_depth.corrected",
            extra={"corrections": {str(queue_id): d for queue_id, d in corrections.items()}},
        )
    return corrections


# When this process last checked the depths against the dead tasks (`keep`).
_checked_at: list[float | None] = [None]


def keep() -> None:
    """The watchdog's round: fold the rows; every RECONCILE_SECONDS (and at the first
    round of a process) check the depths against the dead tasks."""
    compact()
    checked = _checked_at[0]
    if checked is None or time.monotonic() - checked >= RECONCILE_SECONDS:
        reconcile()
        _checked_at[0] = time.monotonic()
