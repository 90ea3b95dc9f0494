"""Putting `claimed` tasks that Redis lost back into their buffers.

Postgres says a task is `claimed` (buffered, no worker yet); Redis may have
lost it (a restart without persistence, a FLUSHALL, a claim whose process
died between its pop and its UPDATE).  `rebuffer_missing` finds such tasks
and pushes them again.  Pushing is idempotent (ZADD NX) and a duplicate is
harmless: the hand-out's status guard drops an id that is no longer claimed.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime

from django.db.models import BooleanField, ExpressionWrapper, Q

from tasks.buffer import HTTP_LANE, RUN_LANE, get_buffer, score
from tasks.models import Task, TaskStatus

logger = logging.getLogger(__name__)

BATCH = 2000


def rebuffer_missing(
    *,
    claimed_before: datetime | None,
    queue_ids: Collection[str] | None = None,
    limit: int = 50_000,
) -> int:
    """Re-push claimed tasks missing from Redis; return how many were missing.

    `claimed_before=None` checks every claimed task (after Redis lost its
    data); otherwise only those buffered before that time, which the
    dispatcher has certainly pushed already.  `queue_ids` limits the check to
    those queues (the ones a cluster node lost).  Reads in keyset batches over
    task_claimed_since_idx; holds no lock and no transaction.
    """
    buffer = get_buffer()
    restored = 0
    woken: set[str] = set()
    after: tuple[datetime, str] | None = None
    seen = 0
    while seen < limit:
        rows = Task.objects.filter(status=TaskStatus.CLAIMED)
        if claimed_before is not None:
            rows = rows.filter(status_changed_at__lt=claimed_before)
        if queue_ids is not None:
            rows = rows.filter(queue_id__in=list(queue_ids))
        if after is not None:
            rows = rows.filter(status_changed_at__gte=after[0]).exclude(
                status_changed_at=after[0], id__lte=after[1]
            )
        batch = list(
            rows.order_by("status_changed_at", "id")
            .annotate(http=ExpressionWrapper(Q(http_request__isnull=False), BooleanField()))
            .values_list("id", "queue_id", "priority", "scheduled_at", "status_changed_at", "http")[
                :BATCH
            ]
        )
        if not batch:
            break
        seen += len(batch)
        after = (batch[-1][4], str(batch[-1][0]))
        # Per queue and lane: a task with an HTTP target goes back to the push lane.
        by_queue: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        for task_id, queue_id, priority, scheduled_at, _, http in batch:
            lane = HTTP_LANE if http else ""
            by_queue[(str(queue_id), lane)].append((str(task_id), score(priority, scheduled_at)))
        for (queue_key, lane), items in by_queue.items():
            ids = [task_id for task_id, _ in items]
            present = buffer.present(queue_key, ids, lane=lane)
            if lane == HTTP_LANE:
                # A RunTask's task waits in the run lane instead.
                ran = buffer.present(queue_key, ids, lane=RUN_LANE)
                present = [a or b for a, b in zip(present, ran, strict=True)]
            missing = [item for item, here in zip(items, present, strict=True) if not here]
            if missing:
                # A claim may have popped some of them and be committing its
                # hand-out right now: ask Postgres again, just before the push.
                still = {
                    str(task_id)
                    for task_id in Task.objects.filter(
                        pk__in=[task_id for task_id, _ in missing], status=TaskStatus.CLAIMED
                    ).values_list("id", flat=True)
                }
                missing = [item for item in missing if item[0] in still]
            if missing:
                restored += buffer.push(queue_key, missing, lane=lane)
                woken.add(queue_key)
        if len(batch) < BATCH:
            break
    if restored:
        logger.warning("buffer.reconciled", extra={"restored": restored})
        buffer.wake(woken)
    return restored
