"""Handing buffered tasks to workers (POST /workers/claim).

A claim pops ids from each queue's Redis buffer with one Lua script per
queue (token bucket and pop, atomically), then turns them `executing` with
one conditional UPDATE (`tasks.sql.HAND_OUT`).  Postgres stays the truth: an
id popped for a task that is no longer `claimed` is dropped, and an id popped
by a process that dies before the UPDATE is put back by the watchdog's
reconcile.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.http import Http404
from django.utils import timezone

from queues import lookup
from queues.models import Queue
from tasks import transitions
from tasks.buffer import get_buffer, score
from tasks.models import Task
from tasks.wakeup import waiters
from workers.leases import record_seen

logger = logging.getLogger(__name__)

# A waiting claim looks again at least this often, even without a wake-up.
MAX_WAIT_SLICE = 1.0
# Pops per queue per attempt: ids of cancelled tasks make a pop come up short.
_POP_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    worker_id: str
    queues: Sequence[str]
    max_tasks: int = 1
    wait_seconds: float = 0.0


def resolve_queues(names: Sequence[str]) -> list[Queue]:
    """The named queues in the order given.

    Raises:
        Http404: a name is not a queue.
    """
    found = lookup.by_names(set(names))
    missing = [name for name in names if name not in found]
    if missing:
        raise Http404(f"No queue named {missing[0]!r}.")
    seen: set[str] = set()
    ordered = []
    for name in names:
        if name not in seen:
            seen.add(name)
            ordered.append(found[name])
    return ordered


def claim(request: ClaimRequest, *, gone: Callable[[], bool] | None = None) -> list[Task]:
    """Hand out up to `max_tasks` tasks, waiting up to `wait_seconds` for some.

    `gone` says whether the caller has hung up; a wait it ends hands out
    nothing, so no task is leased to a worker that is no longer listening.

    Raises:
        Http404: a queue name is unknown.
    """
    queues = resolve_queues(request.queues)
    record_seen(request.worker_id)
    deadline = time.monotonic() + request.wait_seconds
    # Queues this claim found paused (the rows are shared: never set .paused).
    paused = {queue.id for queue in queues if queue.paused}
    with waiters.interest(str(queue.id) for queue in queues) as wake:
        while True:
            wake.clear()
            tasks, retry_in = _claim_once(request.worker_id, queues, paused, request.max_tasks)
            left = deadline - time.monotonic()
            if tasks or left <= 0:
                return tasks
            pause = min(left, MAX_WAIT_SLICE, retry_in if retry_in else MAX_WAIT_SLICE)
            _release_connection()
            wake.wait(pause)
            if gone is not None and gone():
                return []
            # A pause is enforced by the hand-out itself; re-read only to see
            # a paused queue resume.
            if paused:
                queues = _refresh(queues)
                paused = {queue.id for queue in queues if queue.paused}


def _claim_once(
    worker_id: str, queues: list[Queue], paused: set[Any], limit: int
) -> tuple[list[Task], float]:
    """One pass over the queues in order; returns the tasks and a rate-limit hint (s).

    Adds to `paused` the queues it finds paused meanwhile.
    """
    buffer = get_buffer()
    by_id = {queue.id: queue for queue in queues}
    handed: list[Task] = []
    retry_in = 0.0
    for queue in queues:
        if queue.id in paused:
            continue
        for _ in range(_POP_ROUNDS):
            want = limit - len(handed)
            if want <= 0:
                return handed, 0.0
            taken = buffer.take(queue.id, want, queue.rate_limit)
            if taken.wait_ms:
                hint = taken.wait_ms / 1000
                retry_in = hint if not retry_in else min(retry_in, hint)
            if not taken.ids:
                break
            try:
                moved = transitions.hand_out_ids(
                    taken.ids, worker_id=worker_id, queues=by_id, now=timezone.now()
                )
            except Exception:
                # Postgres failed after the pop: put the ids back (they are
                # still `claimed`); if that fails too, the reconcile will.
                _put_back(queue, taken.ids)
                raise
            handed += moved
            if len(moved) == len(taken.ids):
                break
            # Cancelled ids are gone for good; ids of a queue paused meanwhile
            # are still claimed and go back for the dispatcher to drain.
            moved_ids = {str(task.pk) for task in moved}
            if _put_back(queue, [i for i in taken.ids if i not in moved_ids]):
                paused.add(queue.id)  # as far as this claim knows; re-read after a wait
                break
    return handed, retry_in


def _release_connection() -> None:
    """Give the DB connection back to the pool while waiting (threads share few)."""
    if connection.pool is not None and not connection.in_atomic_block:
        connection.close()


def _put_back(queue: Queue, ids: Sequence[str]) -> int:
    """Re-push popped ids that are still `claimed`; return how many."""
    try:
        tasks = Task.objects.filter(pk__in=ids, status=Task.Status.CLAIMED).only(
            "id", "priority", "scheduled_at"
        )
        items = [(str(t.pk), score(t.priority, t.scheduled_at)) for t in tasks]
        get_buffer().push(queue.id, items)
    except Exception:
        logger.warning("claim.put_back_failed", extra={"queue": queue.name, "count": len(ids)})
        return 0
    return len(items)


def _refresh(queues: list[Queue]) -> list[Queue]:
    fresh = lookup.by_ids([queue.id for queue in queues], fresh=True)
    return [fresh[queue.id] for queue in queues if queue.id in fresh]
