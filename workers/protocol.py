"""The worker protocol: claim, heartbeat, ack and nack (API.md, "Workers").

A claim (and a push process, `workers.pusher`, through `take`) pops ids from
each queue's Redis buffer with one Lua script per queue
(concurrency cap, token bucket and pop, atomically), then turns them
`executing` with one conditional UPDATE (`transitions.hand_out`).  Ids popped
but not handed out give their concurrency slots back (`tasks.concurrency`);
a queue at its cap wakes a waiting claim when a slot frees.  Postgres stays the truth: an id
popped for a task that is no longer `claimed` is dropped, and an id popped by
a process that dies before the UPDATE is put back by the watchdog's
reconcile.

Every later call is fenced by the lease: the task must be `executing`, held
by the calling `worker_id` with the API key that claimed it (`key_id`;
None, for callers inside TaskForge, skips that part) and, when the caller
names it, at the same `attempt`.  Anything else is `LeaseLost` and changes nothing.  Acks repeat
safely: the same worker acking the same attempt again is answered as a
success.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from queues import lookup
from queues.exceptions import UnknownQueue
from queues.models import Queue
from taskforge.api import revocation
from taskforge.lib import jsonutil, pg, stopping
from tasks import concurrency, transitions
from tasks.buffer import HTTP_LANE, RUN_LANE, KeyLimits, get_buffer, score
from tasks.models import Task, TaskStatus, lease_ends_at
from tasks.wakeup import waiters
from workers import heartbeats, sql
from workers.exceptions import LeaseLost

logger = logging.getLogger(__name__)

# A waiting claim checks at least this often whether to stop waiting (its client
# hung up, the server is stopping, its key was revoked)...
MAX_WAIT_SLICE = 1.0
# ...and looks for tasks again when woken, or at least this often without a
# wake-up while this process's wake-up listener is subscribed (a wake-up lost
# in a reconnect costs at most this), every slice while it is not.  Looking
# costs a Redis round trip per queue: 1,000 idle pollers looking every second
# kept ~0.2 of a core busy.
QUIET_LOOK_SECONDS = 5.0


def stop_waiting() -> None:
    """End every waiting claim of this process within MAX_WAIT_SLICE.

    Safe to call from a signal handler: it only sets a flag
    (taskforge.lib.stopping).
    """
    stopping.stop()


# Pops per queue per attempt that hand something out: ids no longer `claimed`
# (cancelled tasks, duplicates a reconcile restored while their hand-out was
# committing) make a pop come up short.  A pop that hands out nothing removed
# only such ids, and does not count: the buffer is popped on through them.
_POP_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    worker_id: str
    queues: Sequence[str]
    max_tasks: int = 1
    wait_seconds: float = 0.0
    key_id: int | None = None  # the claiming API key: with worker_id, the lease holder


def resolve_queues(names: Sequence[str]) -> list[Queue]:
    """The named queues in the order given.

    Raises:
        UnknownQueue: a name is not a queue.
    """
    found = lookup.by_names(set(names))
    missing = [name for name in names if name not in found]
    if missing:
        raise UnknownQueue(f"No queue named {missing[0]!r}.")
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
    A wait also ends, within a second, when the claiming key is revoked.

    Raises:
        UnknownQueue: a queue name is unknown.
        KeyRevoked: the key was revoked while the claim waited.
    """
    queues = resolve_queues(request.queues)
    record_seen(request.worker_id)
    deadline = time.monotonic() + request.wait_seconds
    # Queues this claim found paused (the rows are shared: never set .paused).
    paused = {queue.id for queue in queues if queue.paused}

    def look() -> tuple[list[Task], float]:
        return take(
            queues,
            max_tasks=request.max_tasks,
            worker_id=request.worker_id,
            key_id=request.key_id,
            paused=paused,
        )

    # A first look before registering for wake-ups: under load most claims find
    # work at once and never wait, and registering (Events in the wake-up and
    # revocation listeners' tables, the key's check) cost ~6 % of the
    # instructions of the single path's three requests (callgrind).  One that
    # will wait looks again once registered (below), so a wake-up between that
    # look and the wait is not missed.
    tasks, _ = look()
    if tasks or request.wait_seconds <= 0:
        return tasks
    with (
        waiters.interest(str(queue.id) for queue in queues) as wake,
        revocation.watch_key(request.key_id, wake) as revoked,
    ):
        while True:
            wake.clear()
            tasks, retry_in = look()
            looked = time.monotonic()
            if tasks or deadline - looked <= 0:
                return tasks
            _release_connection()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return []
                woken = wake.wait(min(left, MAX_WAIT_SLICE, retry_in or MAX_WAIT_SLICE))
                if (gone is not None and gone()) or stopping.stopping():
                    return []
                if revoked():
                    raise revocation.KeyRevoked()
                if (
                    woken
                    or retry_in
                    or paused
                    or not waiters.listening()
                    or time.monotonic() - looked >= QUIET_LOOK_SECONDS
                ):
                    break
            # A pause is enforced by the hand-out itself; re-read at once only to
            # see a paused queue resume.  Otherwise the rows remembered for a
            # second (queues.lookup) do: a queue given a push target meanwhile is
            # skipped from then on.
            queues = _refresh(queues, fresh=bool(paused))
            paused = {queue.id for queue in queues if queue.paused}


def take(
    queues: Sequence[Queue],
    *,
    max_tasks: int,
    worker_id: str,
    key_id: int | None = None,
    paused: set[Any] | None = None,
    push: bool = False,
) -> tuple[list[Task], float]:
    """One pass over the queues in order; returns the tasks and a rate-limit hint (s).

    Hands out up to `max_tasks` to `worker_id` (with the key `key_id`).  A
    claim (`push` False) skips push queues as if they were empty; a push
    process (`push` True) takes from push queues only, and its lease runs
    the target's timeout longer (it does not heartbeat); each task it gets
    carries the target to send it to (`push_target`, read by the hand-out).
    Adds to `paused` the queues it finds paused meanwhile (or no longer of
    the caller's kind: pushed for a claim, pulled for a push process).
    Tasks with an HTTP target (the Cloud Tasks API's) wait in their queue's
    push lane, which a push process reads in every queue and a claim never
    does (`_lanes`); they are leased for their own dispatch deadline.
    """
    buffer = get_buffer()
    by_id = {queue.id: queue for queue in queues}
    handed: list[Task] = []
    retry_in = 0.0
    paused = set() if paused is None else paused
    for queue, lane in _lanes(queues, push=push):
        run = lane == RUN_LANE  # a RunTask's: no pause, rate limit or cap holds it back
        if queue.id in paused and not run:
            continue
        rate, cap = (None, None) if run else (queue.rate_limit, queue.max_concurrency)
        limits = None if lane else key_limits(queue)
        rounds = 0
        while rounds < _POP_ROUNDS:
            want = max_tasks - len(handed)
            if want <= 0:
                return handed, 0.0
            taken = buffer.take(queue.id, want, rate, cap, lane=lane, keys=limits)
            if taken.uncounted and concurrency.recount_for_claim(queue):
                # Redis lost the queue's running count (or the cap is new):
                # rebuilt from Postgres, take under it.  Another claim
                # rebuilding it wakes this one when done.
                taken = buffer.take(queue.id, want, rate, cap, lane=lane, keys=limits)
            if taken.wait_ms:
                hint = taken.wait_ms / 1000
                retry_in = hint if not retry_in else min(retry_in, hint)
            if not taken.ids:
                break
            try:
                moved = transitions.hand_out(
                    taken.ids,
                    worker_id=worker_id,
                    key_id=key_id,
                    queues=by_id,
                    now=timezone.now(),
                    push=push,
                    run=run,
                )
            except Exception:
                # Postgres failed after the pop: put the ids back (they are
                # still `claimed`) and free their slots; if that fails too,
                # the reconcile will.
                _put_back(queue, taken.ids, lane)
                concurrency.release(queue, taken.ids)
                raise
            handed += moved
            if len(moved) == len(taken.ids):
                break
            # Cancelled ids are gone for good; ids of a queue paused (or turned
            # to the other kind of delivery) meanwhile are still claimed and go
            # back, for the dispatcher to drain or the right taker to take.
            moved_ids = {str(task.pk) for task in moved}
            unmoved = [i for i in taken.ids if i not in moved_ids]
            put_back = _put_back(queue, unmoved, lane)
            # Their slots were taken with them: free them, after the put-back
            # so that a claim the release wakes finds those still claimed.
            concurrency.release(queue, unmoved)
            if put_back:
                paused.add(queue.id)  # as far as this claim knows; re-read after a wait
                break
            # A pop of only dropped ids (each now gone from the buffer) costs no
            # round: a task queued behind stale ids is found now, not at the next
            # look, up to QUIET_LOOK_SECONDS later for a waiting claim.
            rounds += bool(moved)
    return handed, retry_in


def key_limits(queue: Queue) -> KeyLimits | None:
    """The queue's fairness settings as the take applies them (None: none set)."""
    if queue.key_max_concurrency is None and queue.key_rate_limit is None and not queue.key_weights:
        return None
    return KeyLimits(queue.key_max_concurrency, queue.key_rate_limit, queue.key_weights or None)


def _lanes(queues: Sequence[Queue], *, push: bool) -> list[tuple[Queue, str]]:
    """The buffer lanes a pass reads: a claim, the pull queues' own; a push process,
    every queue's run lane first (RunTask's), the push queues' own and every queue's
    push lane (tasks with an HTTP target)."""
    if not push:
        return [(queue, "") for queue in queues if not queue.is_push]
    lanes: list[tuple[Queue, str]] = [(queue, RUN_LANE) for queue in queues]
    for queue in queues:
        if queue.is_push:
            lanes.append((queue, ""))
        lanes.append((queue, HTTP_LANE))
    return lanes


def _release_connection() -> None:
    """Give the DB connection back to the pool while waiting (threads share few)."""
    # `pool` is the Postgres backend's (psycopg's pool), which the stubs do not list.
    if getattr(connection, "pool", None) is not None and not connection.in_atomic_block:
        connection.close()


def _put_back(queue: Queue, ids: Sequence[str], lane: str = "") -> int:
    """Re-push popped ids that are still `claimed`; return how many."""
    try:
        tasks = list(
            Task.objects.filter(pk__in=ids, status=Task.Status.CLAIMED).only(
                "id", "priority", "scheduled_at", "fairness_key"
            )
        )
        items = [(str(t.pk), score(t.priority, t.scheduled_at)) for t in tasks]
        keyed = [
            (str(t.pk), score(t.priority, t.scheduled_at), t.fairness_key)
            for t in tasks
            if t.fairness_key is not None and not lane
        ]
        if keyed:
            get_buffer().push_keyed(queue.id, keyed)
            items = [item for item, t in zip(items, tasks, strict=True) if t.fairness_key is None]
        get_buffer().push(queue.id, items, lane=lane)
    except Exception:
        logger.warning("claim.put_back_failed", extra={"queue": queue.name, "count": len(ids)})
        return 0
    return len(items)


def _refresh(queues: list[Queue], *, fresh: bool) -> list[Queue]:
    found = lookup.by_ids([queue.id for queue in queues], fresh=fresh)
    return [found[queue.id] for queue in queues if queue.id in found]


S = TaskStatus

_NOT_GIVEN = object()


@dataclass(frozen=True, slots=True)
class Item:
    """One task of a worker call: its id, the attempt if given, the ack result."""

    task_id: str
    attempt: int | None = None
    result: Any = _NOT_GIVEN


@dataclass(frozen=True, slots=True)
class Outcome:
    """What happened to one item: a task (ok) or an error."""

    task_id: str
    task: Task | None = None
    heartbeat_at: datetime | None = None
    error: LeaseLost | None = None


lease_expires_at = lease_ends_at  # the answer's `lease_expires_at` (API.md)


def heartbeat(worker_id: str, items: Sequence[Item], *, key_id: int | None = None) -> list[Outcome]:
    """Extend the leases of the items the worker holds, in one statement."""
    record_seen(worker_id)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            sql.HEARTBEAT,
            {
                "worker_id": worker_id,
                "key_id": key_id,
                "now": now,
                "ids": pg.array(item.task_id for item in items),
                "attempts": pg.array(item.attempt for item in items),
            },
        )
        beaten = {str(task_id): at for task_id, at in cursor.fetchall()}
    heartbeats.record(beaten, now)  # the dashboard's heartbeat history
    return [
        Outcome(item.task_id, heartbeat_at=beaten[item.task_id])
        if item.task_id in beaten
        else Outcome(item.task_id, error=LeaseLost())
        for item in items
    ]


def ack(
    worker_id: str, items: Sequence[Item], *, key_id: int | None = None, brief: bool = False
) -> list[Outcome]:
    """Mark the items done, in one statement; repeated acks answer as successes.

    With `brief`, an outcome's task holds only its id, queue, status and attempts
    (transitions.ack), enough for a batch's answer.
    """
    record_seen(worker_id)
    rows = [
        (
            item.task_id,
            item.attempt,
            None if item.result is _NOT_GIVEN else jsonutil.dumps(item.result).decode(),
        )
        for item in items
    ]
    # One statement: atomic on its own, no transaction to open.
    acked = {
        str(task.pk): task
        for task in transitions.ack(rows, worker_id=worker_id, key_id=key_id, brief=brief)
    }
    missing = [item for item in items if item.task_id not in acked]
    if missing:
        done = {
            str(task.pk): task
            for task in Task.objects.select_related("queue")
            .filter(pk__in=[item.task_id for item in missing], status=S.DONE, claimed_by=worker_id)
            .filter(_held_with(key_id))
        }
        for item in missing:
            task = done.get(item.task_id)
            if task is not None and item.attempt in (None, task.attempts):
                acked[item.task_id] = task
    return [
        Outcome(item.task_id, task=acked[item.task_id])
        if item.task_id in acked
        else Outcome(item.task_id, error=LeaseLost())
        for item in items
    ]


def nack(
    worker_id: str,
    item: Item,
    *,
    error: str,
    retry: bool = True,
    retry_after_seconds: float | None = None,
    key_id: int | None = None,
) -> Task:
    """Fail the attempt: retry with backoff (or the given delay), or dead.

    Raises:
        LeaseLost: the worker does not hold this attempt's lease.
    """
    record_seen(worker_id)
    with transaction.atomic():
        task = (
            Task.objects.select_for_update(no_key=True, of=("self",))
            .select_related("queue")
            .filter(pk=item.task_id, status=S.EXECUTING, claimed_by=worker_id)
            .filter(_held_with(key_id))
            .first()
        )
        if task is None or item.attempt not in (None, task.attempts):
            raise LeaseLost()
        transitions.fail(task, error=error, retry=retry, retry_after_seconds=retry_after_seconds)
    return task


def _held_with(key_id: int | None) -> Q:
    """Tasks whose lease the key `key_id` may act on (None: any; no key recorded: any).

    The ORM form of `tasks.sql.HELD_BY_KEY`, for the calls that lock the row in Python.
    """
    if key_id is None:
        return Q()
    return Q(claimed_key_id__isnull=True) | Q(claimed_key_id=key_id)


# Process-local memory of when each worker was last recorded, so a busy
# worker costs one upsert a second, not one per call.
_seen_lock = threading.Lock()
_seen: dict[str, float] = {}
_SEEN_EVERY = 1.0


def record_seen(worker_id: str) -> None:
    """Note that a worker called (GET /workers shows it)."""
    now = time.monotonic()
    with _seen_lock:
        last = _seen.get(worker_id)
        if last is not None and now - last < _SEEN_EVERY:
            return
        if len(_seen) > 100_000:
            _seen.clear()
        _seen[worker_id] = now
    with connection.cursor() as cursor:
        cursor.execute(sql.WORKER_SEEN, {"worker_id": worker_id, "now": timezone.now()})
