"""Retention (API.md v1.1): finished tasks are deleted, with their events, when old.

A `done` or `cancelled` task whose `finished_at` is older than
TASKFORGE_RETENTION_SECONDS, and a `dead` one older than
TASKFORGE_DLQ_RETENTION_SECONDS, is deleted with its events (and a dead
one's DLQ entry); 0 keeps them forever.  The watchdog runs it.

Each batch is its own short transaction: it locks up to BATCH finished rows
with SKIP LOCKED (task_finished_idx, oldest first) and deletes them.  Claims,
heartbeats, acks and nacks lock only live rows, so they never wait on it;
the one reader of finished rows that locks, a discard of a dead task, is
skipped rather than waited for.  Prometheus counters count transitions as
they happen and are not lowered.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from taskforge.conf import conf
from tasks import transitions
from tasks.models import Task, TaskStatus

logger = logging.getLogger(__name__)

S = TaskStatus
BATCH = 500


def delete_expired(*, now: datetime | None = None, max_batches: int = 20) -> int:
    """Delete up to `max_batches` batches of expired finished tasks; return how many."""
    now = now or timezone.now()
    deleted = 0
    for statuses, seconds in (
        ((S.DONE, S.CANCELLED), conf.RETENTION_SECONDS),
        ((S.DEAD,), conf.DLQ_RETENTION_SECONDS),
    ):
        if seconds <= 0:
            continue
        cutoff = now - timedelta(seconds=seconds)
        for _ in range(max_batches):
            count = _delete_batch(statuses, cutoff)
            deleted += count
            if count < BATCH:
                break
    if deleted:
        logger.info("retention.deleted", extra={"deleted": deleted})
    return deleted


def _delete_batch(statuses: tuple[str, ...], cutoff: datetime) -> int:
    with transaction.atomic():
        rows = list(
            Task.objects.filter(status__in=statuses, finished_at__lt=cutoff)
            .order_by("finished_at")
            .select_for_update(skip_locked=True)
            .values_list("id", "queue_id", "status")[:BATCH]
        )
        # The events and a dead task's DLQ entry go with it, and it leaves the DLQ depth.
        return transitions.delete(rows)
