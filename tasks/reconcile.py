"""Putting `claimed` tasks that Redis lost back into their buffers.

Postgres says a task is `claimed` (buffered, no worker yet); Redis may have
lost it (a restart without persistence, a FLUSHALL, a claim whose process
died between its pop and its UPDATE).  `rebuffer_missing` finds such tasks
and pushes them again.  Pushing is idempotent (ZADD NX) and a duplicate is
harmless: the hand-out's status guard drops an id that is no longer claimed.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Collection
from datetime import datetime, timedelta

from django.db.models import BooleanField, ExpressionWrapper, Q
from django.utils import timezone

from queues.models import Queue
from taskforge.lib import pg
from tasks import sql
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
            .values_list(
                "id",
                "queue_id",
                "priority",
                "scheduled_at",
                "status_changed_at",
                "http",
                "fairness_key",
            )[:BATCH]
        )
        if not batch:
            break
        seen += len(batch)
        after = (batch[-1][4], str(batch[-1][0]))
        # Per queue and lane: a task with an HTTP target goes back to the push
        # lane, one with a fairness key to its key's ready set.
        by_queue: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        keyed: dict[str, list[tuple[str, int, str]]] = defaultdict(list)
        for task_id, queue_id, priority, scheduled_at, _, http, key in batch:
            lane = HTTP_LANE if http else ""
            item = (str(task_id), score(priority, scheduled_at))
            if key is not None and not http:
                keyed[str(queue_id)].append((*item, key))
            else:
                by_queue[(str(queue_id), lane)].append(item)
        for queue_key, triples in keyed.items():
            present = buffer.present_keyed(queue_key, [(t[0], t[2]) for t in triples])
            lost = [t for t, here in zip(triples, present, strict=True) if not here]
            still = _still_claimed([t[0] for t in lost])
            lost = [t for t in lost if t[0] in still]
            if lost:
                restored += buffer.push_keyed(queue_key, lost)
                woken.add(queue_key)
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
                still = _still_claimed([task_id for task_id, _ in missing])
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


def _still_claimed(ids: Collection[str]) -> set[str]:
    """Those of `ids` still `claimed` now."""
    if not ids:
        return set()
    return {
        str(task_id)
        for task_id in Task.objects.filter(pk__in=list(ids), status=TaskStatus.CLAIMED).values_list(
            "id", flat=True
        )
    }


def restore_key_rates(queues: Collection[Queue]) -> int:
    """Give back each fairness key of these queues (whose Redis keys were lost) the
    bucket its recent hand-outs left, from Postgres; return how many keys.

    A key with key_rate_limit R refills its burst of max(1, ceil(R)) tokens in
    burst/R seconds: the hand-outs within that time are what its bucket lacks.
    Without this, each key's bucket would start full again: one burst more.
    """
    restored = 0
    now = timezone.now()
    for queue in queues:
        rate = queue.key_rate_limit
        if not rate:
            continue
        burst = max(1, math.ceil(rate))
        since = now - timedelta(seconds=burst / rate)
        with pg.cursor() as cursor:
            cursor.execute(sql.RECENT_KEY_HANDOUTS, {"queue_id": queue.id, "since": since})
            counts = dict(cursor.fetchall())
        tokens = {key: max(0.0, burst - count) for key, count in counts.items()}
        get_buffer().restore_key_tokens(queue.id, tokens, rate)
        restored += len(tokens)
    return restored
