"""Queue concurrency caps (`Queue.max_concurrency`): the running count in Redis.

A capped queue's slots in use are a Redis set of task ids (tasks.buffer,
`running`); with `key_max_concurrency`, also each fairness key's count
(`krun`, `ktask`), kept by the same take, release and rebuild.  The claim's
take checks the cap and adds the ids it pops in the
same script as the rate limit, so no number of claims racing in any number
of processes hands out past the cap.  A slot is freed (`release`, which wakes
waiting claims when the queue was full):

- when the attempt ends: ack, nack, lease expiry (`tasks.transitions`, once
  the move has committed, so Postgres never shows more executing tasks than
  the set holds);
- for ids a claim popped but did not hand out: cancelled meanwhile, put back
  for a paused queue, or Postgres failed (`workers.protocol`).

Postgres stays the truth.  When the set's `counted` mark is missing (Redis
lost its data, or the queue just got its cap) a take hands out nothing and
the claim rebuilds the count (`recount_for_claim`, one claim at a time)
before taking again.  The
watchdog's reconcile (`reconcile_running`) adds executing tasks the set
misses and frees slots whose task is not executing, so a count gone wrong
(a process died between its pop and its hand-out, a release lost with
Redis) is right again within TASKFORGE_BUFFER_RECONCILE_SECONDS.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Sequence
from datetime import timedelta
from functools import partial
from typing import Any

from django.db import transaction
from redis.exceptions import RedisError

from queues.models import Queue
from taskforge.conf import conf
from tasks.buffer import get_buffer
from tasks.models import Task, TaskStatus

logger = logging.getLogger(__name__)

# Ids per Redis call when writing a count.
CHUNK = 5000
# A count rebuilt by a claim lapses after this long, so it is rebuilt once
# more: API processes that had not yet read a new cap (queue rows are
# remembered for a second, queues.lookup) may have handed out without it.
CLAIM_COUNT_TTL_MS = 2000


def counts_slots(queue: Queue) -> bool:
    """Does the queue count its executing tasks (its own cap, or its keys')?"""
    return queue.max_concurrency is not None or queue.key_max_concurrency is not None


def release(queue: Queue, task_ids: Sequence[str]) -> None:
    """Free the slots of `task_ids` in a capped queue now; never raises.

    A release that fails (Redis down) leaves the slots taken until the
    reconcile frees them.
    """
    if not counts_slots(queue) or not task_ids:
        return
    try:
        get_buffer().release(queue.id, task_ids, queue.max_concurrency, queue.key_max_concurrency)
    except RedisError:
        logger.warning(
            "concurrency.release_failed", extra={"queue": queue.name, "count": len(task_ids)}
        )


def release_on_commit(tasks: Iterable[Task]) -> None:
    """Free the slots of tasks that leave `executing`, once the move commits.

    Caller contract: inside the transaction that moves them (or autocommit,
    after the statement: then at once).
    """
    by_queue: dict[Any, list[str]] = defaultdict(list)
    queues: dict[Any, Queue] = {}
    for task in tasks:
        if counts_slots(task.queue):
            by_queue[task.queue_id].append(str(task.pk))
            queues[task.queue_id] = task.queue
    for queue_id, ids in by_queue.items():
        queue = queues[queue_id]
        transaction.on_commit(partial(release, queue, ids))


def _executing(queue: Queue, among: Sequence[str] | None = None) -> set[str]:
    """Ids of the queue's executing tasks (only those of `among` when given)."""
    return set(_executing_keys(queue, among))


def _executing_keys(queue: Queue, among: Sequence[str] | None = None) -> dict[str, str | None]:
    """The queue's executing tasks' ids and fairness keys (only those of `among` when given)."""
    rows = Task.objects.filter(queue_id=queue.id, status=TaskStatus.EXECUTING)
    if among is not None:
        rows = rows.filter(pk__in=list(among))
    # Uses task_queue_status_idx.
    return {str(task_id): key for task_id, key in rows.values_list("id", "fairness_key")}


def count_running(queue: Queue, *, ttl_ms: int = 0) -> None:
    """Rebuild a capped queue's running count from Postgres and mark it known.

    Adds every executing task, then asks Postgres again about those it added
    and frees the ones that finished meanwhile: an ack that committed after
    the first read released its slot before it was added, and would
    otherwise hold it.  Concurrent rebuilds add the same ids (a set).
    """
    buffer = get_buffer()
    keys = _executing_keys(queue)
    ids = sorted(keys)
    chunks = [ids[i : i + CHUNK] for i in range(0, len(ids), CHUNK)] or [[]]
    for index, chunk in enumerate(chunks):
        last = index == len(chunks) - 1
        buffer.count(queue.id, chunk, mark_ttl_ms=ttl_ms if last else None, keys=keys)
    if ids:
        finished = set(ids) - _executing(queue, ids)
        if finished:
            buffer.release(
                queue.id, sorted(finished), queue.max_concurrency, queue.key_max_concurrency
            )


def recount_for_claim(queue: Queue) -> bool:
    """Rebuild a capped queue's lost count for a claim; False when another claim is at it.

    One claim at a time rebuilds (a lock of 1 s at most in Redis); the
    others take nothing from the queue meanwhile and are woken when the
    count is back, as by a new task.
    """
    buffer = get_buffer()
    if not buffer.start_counting(queue.id):
        return False
    try:
        count_running(queue, ttl_ms=CLAIM_COUNT_TTL_MS)
    finally:
        buffer.done_counting(queue.id)
    buffer.wake([queue.id])
    return True


def reconcile_running(*, grace: timedelta | None = None) -> int:
    """Set every capped queue's running count right; return how many slots were freed.

    Adds executing tasks missing from the count and frees the slots, taken
    more than `grace` ago (default: half the reconcile interval), of
    tasks that are not executing: a claim still between its take and its
    hand-out is younger than that.  Queues without a cap lose their set, so
    a cap set later counts afresh.  Holds no lock and no transaction.
    """
    if grace is None:
        grace = timedelta(seconds=conf.BUFFER_RECONCILE_SECONDS / 2)
    buffer = get_buffer()
    uncapped: list[str] = []
    freed = 0
    for queue in Queue.objects.only("id", "name", "max_concurrency", "key_max_concurrency"):
        if not counts_slots(queue):
            uncapped.append(str(queue.id))
            continue
        cutoff = buffer.now_ms() - int(grace.total_seconds() * 1000)
        count_running(queue)
        old = buffer.running(queue.id, before_ms=cutoff)
        pruned = 0
        for i in range(0, len(old), CHUNK):
            chunk = old[i : i + CHUNK]
            stale = sorted(set(chunk) - _executing(queue, chunk))
            pruned += buffer.prune(queue.id, stale, before_ms=cutoff)
        if pruned:
            buffer.wake([queue.id])
            freed += pruned
    if uncapped:
        buffer.forget_running(uncapped)
    if freed:
        logger.warning("concurrency.reconciled", extra={"freed": freed})
    return freed
