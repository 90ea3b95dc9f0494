"""The dispatcher: moves due `pending` tasks into their queue's Redis buffer.

Per queue and batch: one short transaction selects due pending tasks with
`SELECT ... FOR UPDATE SKIP LOCKED` in hand-out order and marks them
`claimed` (through `transitions.buffer_due`); after commit they are pushed to
Redis and waiting claims are woken.  A push that fails puts the tasks back
to `pending` at once; one that never happens (the process died) is repaired
by the reconcile.

It wakes on `NOTIFY taskforge_dispatch` (sent by every transaction that makes
a task due and pending), so enqueue-to-claimable does not wait for a tick;
the tick (TASKFORGE_DISPATCHER_TICK_SECONDS) is only the fallback.

Each queue's buffer holds at most TASKFORGE_BUFFER_SIZE tasks so Redis holds
the head of each backlog, not all of it.  When the buffer is full and a
more urgent task arrives, it goes in and the least urgent buffered task goes
back to `pending`, so hand-out order stays exact.  A queue found with a full
buffer is watched: polled every FULL_BUFFER_POLL for room while it stays full,
and marked so in Redis (`Buffer.watch`), so that enqueues into its backlog that
are no more urgent than the buffer send no NOTIFY (`Buffer.admit`).  The mark
goes when the buffer is found with room and the backlog moved in; an enqueue
that read it just before commits a task the next pass finds, or, if that pass
found the backlog empty, the fallback tick (TASKFORGE_DISPATCHER_TICK_SECONDS).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import psycopg
from django.db import transaction

from queues.models import Queue
from queues.notify import DISPATCH_CHANNEL
from taskforge.conf import conf
from taskforge.lib import pg
from taskforge.lib.listen import Listener
from taskforge.lib.loop import SLEEP_SLICE, Loop
from taskforge.lib.redisconn import REDIS_FAILURES
from tasks import sql, transitions
from tasks.buffer import HTTP_LANE, get_buffer, score
from tasks.models import Task, TaskStatus
from tasks.reconcile import rebuffer_missing, restore_key_rates

logger = logging.getLogger(__name__)

S = TaskStatus
BATCH = 500
# A queue whose buffer is full has a backlog in Postgres: look at its buffer
# this often, so claims that drain it find it refilled within API.md's 100 ms.
FULL_BUFFER_POLL = 0.05
# Under a burst of NOTIFYs (the last wake-up less than BURST_SECONDS ago: every
# enqueue into a queue with a backlog sends one), a wake-up gathers those of the
# next GATHER_SECONDS too, so one pass serves many instead of one pass (two
# queries) per enqueue.  A lone NOTIFY is served at once.
BURST_SECONDS = 0.05
GATHER_SECONDS = 0.01
IDLE, MORE, FULL = object(), object(), object()
# Fairness keys looked at per pass of a queue, and tasks of keys buffered per pass.
KEYS_PER_PASS = 1000
KEYED_BATCH = 5000
# A watched queue's mark in Redis is set again after this long (Buffer.watch).
REMARK_SECONDS = 1.0


def pending_keys(queue: Queue, *, after: str = "", limit: int = 1000) -> list[str]:
    """The fairness keys with pending tasks in the queue, after `after` in key order."""
    with pg.cursor() as cursor:
        cursor.execute(sql.PENDING_KEYS, {"queue_id": queue.id, "after": after, "limit": limit})
        return [key for (key,) in cursor.fetchall()]


class DispatcherLoop(Loop):
    name = "dispatcher"

    def __init__(self) -> None:
        super().__init__()
        self._listener = Listener(DISPATCH_CHANNEL, f"taskforge-{self.name}")
        self._woken: set[str] = set()  # queue ids named by NOTIFY since the last tick
        self._last_wake = 0.0
        self._more: set[str] = set()  # queue ids whose last batch was full
        self._full: set[str] = set()  # queue ids whose buffer is full (a backlog waits)
        self._marked: dict[str, float] = {}  # queue id -> when last marked watched
        self._next_full_pass = 0.0
        self._key_after: dict[str, str] = {}  # queue id -> the last fairness key looked at

    @property
    def interval(self) -> float:
        return conf.DISPATCHER_TICK_SECONDS

    def tick(self) -> bool:
        """Dispatch the queues named by notifications, or all of them when due."""
        # After a failed tick, a full pass: what NOTIFY named meanwhile may be lost,
        # and a pass with nothing named would touch no store and pass for a recovery
        # (the backoff would start over at every other tick of an outage).
        full_pass = self.failures > 0 or time.monotonic() >= self._next_full_pass
        queues: list[Queue]
        if full_pass:
            self._next_full_pass = time.monotonic() + self.interval
            queues = list(Queue.objects.all())
            lost = get_buffer().lost_queues(q.id for q in queues)
            if lost:
                # Redis (or the cluster node holding these queues) lost its
                # data, or the queues are new: restore every claimed task's
                # entry now rather than after the reconcile delay.
                rebuffer_missing(claimed_before=None, queue_ids=lost)
                restore_key_rates([q for q in queues if str(q.id) in set(lost)])
        else:
            queues = list(Queue.objects.filter(id__in=self._woken | self._more | self._full))
        woken = self._woken
        self._woken, self._more, self._full = set(), set(), set()
        for queue in queues:
            key = str(queue.id)
            if queue.paused:
                self.drain(queue)
                continue
            outcome = self.dispatch(queue, preempt=full_pass or key in woken)
            keyed = self.dispatch_keys(queue)
            if MORE in (outcome, keyed):
                self._more.add(key)
            elif FULL in (outcome, keyed):
                self._full.add(key)
            self._mark(queue, watched=outcome is FULL)
        return bool(self._more)

    def _mark(self, queue: Queue, *, watched: bool) -> None:
        """Say to enqueues whether this loop polls the queue's full buffer (Buffer.admit).

        Set again once a second at most while the buffer stays full (it then
        always has more than WATCH_MARGIN_MS to live), removed once it is not.
        """
        key, now = str(queue.id), time.monotonic()
        try:
            if watched and now - self._marked.get(key, -REMARK_SECONDS) >= REMARK_SECONDS:
                get_buffer().watch(queue.id)
                self._marked[key] = now
            elif not watched and self._marked.pop(key, None) is not None:
                get_buffer().unwatch(queue.id)
        except REDIS_FAILURES:
            pass  # the mark lapses by itself: enqueues then NOTIFY as usual

    def dispatch(self, queue: Queue, *, preempt: bool = True) -> object:
        """Buffer one batch of the queue's due pending tasks.

        Returns MORE (a full batch moved: go again now), FULL (the buffer is
        full: watch it drain and refill it) or IDLE.
        """
        buffer = get_buffer()
        room = conf.BUFFER_SIZE - buffer.size(queue.id)
        if room < 0:
            # Enqueues push fresh tasks straight in; keep the buffer at its size.
            self._unbuffer(queue, buffer.pop_worst(queue.id, -room))
        if room <= 0:
            if preempt and self._preempt(queue):
                return MORE
            return FULL
        limit = min(BATCH, room)
        tasks = self._select_and_buffer(queue, limit)
        if tasks:
            self._push(queue, tasks)
        if len(tasks) < limit:
            return IDLE
        return FULL if limit == room else MORE

    def dispatch_keys(self, queue: Queue) -> object:
        """Buffer due tasks of the queue's fairness keys, each key up to its own bound.

        Looks at up to KEYS_PER_PASS keys with pending tasks (in key order,
        from where the last pass stopped: a skip scan, one probe per key) and
        moves into each key's ready set what fits (TASKFORGE_BUFFER_SIZE per
        key).  Returns MORE (keys left to look at, or a key filled to its
        bound), FULL (a key's backlog waits for room) or IDLE.
        """
        after = self._key_after.get(str(queue.id), "")
        keys = pending_keys(queue, after=after, limit=KEYS_PER_PASS)
        if not keys:
            self._key_after.pop(str(queue.id), None)
            return MORE if after else IDLE
        buffer = get_buffer()
        sizes = buffer.key_sizes(queue.id, keys)
        rooms: dict[str, int] = {}
        budget = KEYED_BATCH
        backlog = False
        last = keys[-1]  # the last key looked at: the next pass goes on after it
        for key, size in zip(keys, sizes, strict=True):
            room = min(conf.BUFFER_SIZE - size, budget)
            if room <= 0:
                backlog = True
                continue
            rooms[key] = room
            budget -= room
            if budget <= 0:
                last = key
                break
        tasks = transitions.buffer_due(queue, rooms=rooms) if rooms else []
        if tasks:
            try:
                buffer.push_keyed(
                    queue.id,
                    [
                        (t.task_id, score(t.priority, t.scheduled_at), cast(str, t.key))
                        for t in tasks
                    ],
                    wake=True,
                )
            except REDIS_FAILURES:
                self._unbuffer(queue, [t.task_id for t in tasks])
                raise
        got: dict[str, int] = {}
        for task in tasks:
            got[cast(str, task.key)] = got.get(cast(str, task.key), 0) + 1
        # A key given all the room it had may have more waiting, as may one with none.
        backlog = backlog or any(got.get(key, 0) >= room for key, room in rooms.items())
        if budget <= 0 or len(keys) == KEYS_PER_PASS:
            self._key_after[str(queue.id)] = last
            if tasks:
                return MORE
        else:
            self._key_after.pop(str(queue.id), None)
        # Keys whose pending tasks are not due yet are looked at again at the next
        # pass (the tick, a NOTIFY), not in a loop.
        return FULL if backlog else IDLE

    def drain(self, queue: Queue) -> None:
        """Take a paused queue's buffered tasks back to `pending`, its push lane's too
        (push processes would otherwise pop them on every pass, only to put them back)."""
        buffer = get_buffer()
        ids = buffer.pop_all(queue.id) + buffer.pop_all(queue.id, lane=HTTP_LANE)
        if ids:
            self._unbuffer(queue, ids)

    def _select_and_buffer(
        self, queue: Queue, limit: int, *, better_than: int | None = None
    ) -> list[transitions.Buffered]:
        # One statement (its own transaction): SKIP LOCKED select in hand-out
        # order over task_pending_due_idx, the move to claimed, the events.
        return transitions.buffer_due(queue, limit=limit, better_than=better_than)

    def _push(self, queue: Queue, tasks: Sequence[transitions.Buffered]) -> None:
        buffer = get_buffer()
        try:
            buffer.push(
                queue.id,
                [(t.task_id, score(t.priority, t.scheduled_at)) for t in tasks if not t.http],
                wake=True,
            )
            # Tasks with an HTTP target: the push lane, which claims never read.
            buffer.push(
                queue.id,
                [(t.task_id, score(t.priority, t.scheduled_at)) for t in tasks if t.http],
                wake=True,
                lane=HTTP_LANE,
            )
        except REDIS_FAILURES:
            # Back to pending now rather than after the reconcile delay.
            self._unbuffer(queue, [t.task_id for t in tasks])
            raise

    def _preempt(self, queue: Queue) -> bool:
        """Swap the buffer's least urgent tasks for more urgent pending ones."""
        buffer = get_buffer()
        worst = buffer.worst_score(queue.id)
        if worst is None:
            return False
        better = self._select_and_buffer(queue, BATCH, better_than=worst)
        if not better:
            return False
        self._push(queue, better)
        evicted = buffer.pop_worst(queue.id, len([t for t in better if not t.http]))
        self._unbuffer(queue, evicted)
        return True

    def _unbuffer(self, queue: Queue, ids: Sequence[str]) -> None:
        with transaction.atomic():
            tasks = list(
                Task.objects.select_for_update(no_key=True)
                .filter(pk__in=ids, status=S.CLAIMED)
                .order_by("id")
            )
            for task in tasks:
                task.queue = queue
            transitions.unbuffer(tasks)

    def wait(self, seconds: float) -> None:
        """Sleep until a NOTIFY names a queue, the tick is due, or we stop."""
        deadline = time.monotonic() + min(seconds, self._next_full_pass - time.monotonic())
        if self._full:
            deadline = min(deadline, time.monotonic() + FULL_BUFFER_POLL)
        try:
            pg = self._listen()
            while not self.stopping:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                for notice in pg.notifies(timeout=min(SLEEP_SLICE, left), stop_after=1):
                    self._woken.add(notice.payload)
                if self._woken:
                    # Take whatever else already arrived; in a burst, for a moment more.
                    now = time.monotonic()
                    gather = GATHER_SECONDS if now - self._last_wake < BURST_SECONDS else 0.0
                    for notice in pg.notifies(timeout=max(0.0, min(gather, deadline - now))):
                        self._woken.add(notice.payload)
                    self._last_wake = time.monotonic()
                    return
        except Exception:
            # The connection broke; the next tick reconnects. Sleep the rest.
            self._listener.reset()
            super().wait(max(0.0, deadline - time.monotonic()))

    def _listen(self) -> psycopg.Connection[Any]:
        return self._listener.connection()
