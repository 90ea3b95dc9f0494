"""Push delivery (API.md v1.1): `manage.py run_pusher` POSTs push queues' tasks to their targets.

A push process is a worker that TaskForge runs itself.  Three threads:

- **The feeder** (the command's loop, `PushLoop`): while fewer than
  TASKFORGE_PUSH_MAX_IN_FLIGHT requests are in flight, it takes due tasks of
  the push queues exactly as a claim does (`workers.protocol.take`: order,
  `rate_limit`, `max_concurrency`, pause; the same Lua step), as worker
  `push:<process name>`.  The lease runs the target's `timeout_seconds`
  longer than a worker's, since a push process does not heartbeat.  It
  waits on the same Redis wake-ups as a long poll, so a due task is sent
  within milliseconds.
- **The sender**: one asyncio event loop with one aiohttp session sends every
  request (hundreds at once cost one thread), each through
  `workers.delivery.deliver` (the request, and what its answer means), on a
  connector that reaches only allowed addresses (`workers.destinations`).
- **The finisher**: records outcomes in Postgres.  2xx answers are acked in
  batches (one statement for all that ended meanwhile); failures go through
  the nack rule, one by one: `Retry-After` of a 429 or 503 instead of the
  backoff.  The lease fences both: an outcome for a task whose lease was
  reclaimed changes nothing.

A push process killed mid-request leaves its tasks `executing`; the watchdog
reclaims them when the lease ends, and the target may see a task twice
(at-least-once).  On SIGTERM it stops taking tasks, lets requests in flight
finish for a moment, records what ended, and leaves the rest to the lease.
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue as queue_module
import re
import socket
import threading
import time
from collections.abc import Sequence

import aiohttp
from django.db import close_old_connections, connection

from queues import push
from queues.models import Queue
from taskforge import metrics, tracing
from taskforge.conf import conf
from taskforge.lib import jsonutil
from taskforge.lib.loop import Loop, backoff
from tasks import transitions
from tasks.models import Task
from tasks.wakeup import waiters
from workers import destinations, httptasks, protocol
from workers.delivery import Job, Outcome, deliver
from workers.exceptions import LeaseLost

logger = logging.getLogger("taskforge.pusher")

# Tasks taken per queue per pass, at most (the in-flight room bounds it too).
TAKE_BATCH = 100
# The feeder looks again at least this often without a wake-up, and re-reads
# the push queues (a new one, a pause, a new rate limit) as often; the target a
# task is sent to is read when it is handed out.
LOOK_SECONDS = 1.0
# When full, the feeder waits at most this long after a request ended to take
# the room of several at once (or a tenth of the capacity, whichever comes first).
ROOM_GATHER_SECONDS = 0.005
# Waits are cut into slices this long, so a SIGTERM is noticed.
SLICE_SECONDS = 0.25
# Outcomes recorded per statement, at most.
FINISH_BATCH = 500
# On SIGTERM: how long requests in flight may still finish, and how long the
# finisher may take to record them (API.md: a loop exits within 3 s).
STOP_GRACE_SECONDS = 1.5
FINISH_GRACE_SECONDS = 1.0


def process_name() -> str:
    """This process's name in `push:<name>` (host and pid, as a worker_id allows)."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname())[:150] or "host"
    return f"{host}-{os.getpid()}"


class Sender:
    """The asyncio thread: one session, requests in flight counted against `capacity`."""

    def __init__(self, capacity: int, done: queue_module.SimpleQueue[Outcome]) -> None:
        self.capacity = capacity
        self._done = done
        self._lock = threading.Lock()
        self._in_flight = 0
        self.room = threading.Event()  # set when a request ends
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="taskforge-push-sender", daemon=True
        )
        self._thread.start()
        self._session: aiohttp.ClientSession = asyncio.run_coroutine_threadsafe(
            self._open(), self._loop
        ).result()

    async def _open(self) -> aiohttp.ClientSession:
        # Only to addresses push requests may reach (workers.destinations).
        connector, self._resolver = destinations.connector(self.capacity)
        return aiohttp.ClientSession(
            connector=connector,
            # Bodies and headers are ours; no cookies kept between tasks.
            cookie_jar=aiohttp.DummyCookieJar(),
            auto_decompress=True,
        )

    @property
    def in_flight(self) -> int:
        with self._lock:
            return self._in_flight

    def free(self) -> int:
        with self._lock:
            return self.capacity - self._in_flight

    def send(self, jobs: Sequence[Job]) -> None:
        with self._lock:
            self._in_flight += len(jobs)
        for job in jobs:
            asyncio.run_coroutine_threadsafe(self._send(job), self._loop)

    async def _send(self, job: Job) -> None:
        outcome = await deliver(self._session, job, secret=conf.PUSH_SIGNING_SECRET)
        metrics.on_push(job.queue, outcome.kind, outcome.seconds)
        self._done.put(outcome)
        with self._lock:
            self._in_flight -= 1
        self.room.set()

    def wait_idle(self, seconds: float) -> int:
        """Wait up to `seconds` for requests in flight to end; return how many still are."""
        deadline = time.monotonic() + seconds
        while self.in_flight and time.monotonic() < deadline:
            self.room.wait(0.05)
            self.room.clear()
        return self.in_flight

    def close(self) -> None:
        async def shut() -> None:
            await self._session.close()
            await self._resolver.close()

        try:
            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(timeout=1.0)
        except Exception:
            logger.debug("push.close_failed", exc_info=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=1.0)
        if not self._thread.is_alive():
            self._loop.close()


class Finisher:
    """The thread that records outcomes: acks in batches, failures by the nack rule."""

    def __init__(self, worker_id: str, outcomes: queue_module.SimpleQueue[Outcome]) -> None:
        self.worker_id = worker_id
        self._outcomes = outcomes
        self._stop = threading.Event()
        self._pending: list[Outcome] = []
        self._thread = threading.Thread(
            target=self._run, name="taskforge-push-finisher", daemon=True
        )
        self._thread.start()

    def _run(self) -> None:
        failures = 0
        while True:
            if not self._pending:
                try:
                    self._pending.append(self._outcomes.get(timeout=0.2))
                except queue_module.Empty:
                    if self._stop.is_set():
                        break
                    continue
            while len(self._pending) < FINISH_BATCH:
                try:
                    self._pending.append(self._outcomes.get_nowait())
                except queue_module.Empty:
                    break
            try:
                self.record(self._pending)
            except Exception as exc:
                failures += 1
                logger.warning(
                    "push.record_failed",
                    extra={"count": len(self._pending), "error": repr(exc), "failures": failures},
                )
                if not connection.in_atomic_block:
                    connection.close()
                if self._stop.wait(backoff(failures)):
                    break
                continue
            failures = 0
            self._pending = []
        connection.close()

    def record(self, outcomes: Sequence[Outcome]) -> None:
        """Write outcomes to Postgres: one ack statement, then each failure."""
        close_old_connections()
        if tracing.ENABLED:
            tracing.pushed(
                tracing.Push(
                    o.job.task_id,
                    o.job.queue,
                    o.job.traceparent,
                    o.job.attempt,
                    o.job.handed_ns,
                    o.ended_ns,
                    o.error,
                )
                for o in outcomes
            )
        delivered = [o for o in outcomes if o.error is None]
        unacked: list[Outcome] = []
        if delivered:
            acked = transitions.ack(
                [(o.job.task_id, o.job.attempt, o.result) for o in delivered],
                worker_id=self.worker_id,
                brief=True,
            )
            ids = {str(task.pk) for task in acked}
            unacked = [o for o in delivered if o.job.task_id not in ids]
        # What each attempt of a task with an HTTP target got, before its outcome
        # frees the task for its next attempt (whose headers read it): a failed
        # one's, and a delivered one's whose lease was lost (the task is retried).
        # An acked task is done: nothing reads it again.
        httptasks.record_outcomes([o for o in outcomes if o.error is not None] + unacked)
        for o in unacked:
            _dropped(o)
        for o in outcomes:
            if o.error is None:
                continue
            try:
                protocol.nack(
                    self.worker_id,
                    protocol.Item(o.job.task_id, o.job.attempt),
                    error=o.error,
                    retry_after_seconds=o.retry_after,
                )
            except LeaseLost:
                _dropped(o)
        for o in outcomes:
            logger.info(
                "push.delivered" if o.error is None else "push.failed",
                extra={
                    "task_id": o.job.task_id,
                    "queue": o.job.queue,
                    "worker_id": self.worker_id,
                    "attempt": o.job.attempt,
                    "status_code": o.status,
                    "duration_ms": round(o.seconds * 1000, 3),
                    "error": o.error,
                },
            )

    def stop(self, seconds: float) -> int:
        """Record what has ended, for up to `seconds`; return how many outcomes were left."""
        self._stop.set()
        self._thread.join(timeout=seconds)
        return len(self._pending) + self._outcomes.qsize()


def _dropped(outcome: Outcome) -> None:
    # The lease ended first (the watchdog reclaimed the task): the attempt is
    # already counted as failed and the task retried; this answer changes nothing.
    logger.warning(
        "push.outcome_dropped",
        extra={"task_id": outcome.job.task_id, "queue": outcome.job.queue, "reason": "lease_lost"},
    )


class PushLoop(Loop):
    name = "pusher"

    def __init__(self, *, capacity: int | None = None, name: str | None = None) -> None:
        super().__init__()
        self.worker_id = f"push:{name or process_name()}"
        self._outcomes: queue_module.SimpleQueue[Outcome] = queue_module.SimpleQueue()
        self.sender = Sender(capacity or conf.PUSH_MAX_IN_FLIGHT, self._outcomes)
        self.finisher = Finisher(self.worker_id, self._outcomes)
        self._queues: list[Queue] = []
        self._read_at = 0.0
        self._turn = 0

    @property
    def interval(self) -> float:
        return LOOK_SECONDS

    def tick(self) -> bool:
        """Take and send what is due, then wait: for room when full, else for a wake-up."""
        queues = self._push_queues()
        protocol.record_seen(self.worker_id)
        if not queues:
            self.wait(LOOK_SECONDS)
            return True
        with waiters.interest(str(queue.id) for queue in queues) as wake:
            wake.clear()
            sent, retry_in = self._take_and_send(queues)
            if self.sender.free() <= 0:
                self._wait_for_room()
                return True  # tasks left in the buffer while full are due now
            if sent:
                return True  # more may be due: look again at once
            deadline = time.monotonic() + (
                min(LOOK_SECONDS, retry_in) if retry_in else LOOK_SECONDS
            )
            while not self.stopping and not wake.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                wake.wait(min(SLICE_SECONDS, left))
        return True

    def _wait_for_room(self) -> None:
        """Until some requests ended: a batch of them, or any after ROOM_GATHER_SECONDS.

        Taking one task per ended request would cost a Redis and a Postgres round
        trip each; gathering the room of a few ends takes them in one.
        """
        deadline = time.monotonic() + LOOK_SECONDS
        enough = max(1, self.sender.capacity // 10)
        first_room = 0.0
        while not self.stopping and time.monotonic() < deadline:
            self.sender.room.clear()
            free = self.sender.free()
            if free >= enough:
                return
            if free > 0:
                now = time.monotonic()
                first_room = first_room or now
                if now - first_room >= ROOM_GATHER_SECONDS:
                    return
                self.sender.room.wait(ROOM_GATHER_SECONDS - (now - first_room))
                continue
            self.sender.room.wait(SLICE_SECONDS)

    def _push_queues(self) -> list[Queue]:
        if time.monotonic() - self._read_at >= LOOK_SECONDS or not self._read_at:
            # Every queue: any may hold tasks with an HTTP target (its push lane).
            self._queues = list(Queue.objects.order_by("name"))
            self._read_at = time.monotonic()
        return self._queues

    def _take_and_send(self, queues: list[Queue]) -> tuple[int, float]:
        """One pass over the push queues, the first one turning each pass (fairness)."""
        free = self.sender.free()
        if free <= 0:
            return 0, 0.0
        self._turn = (self._turn + 1) % len(queues)
        ordered = queues[self._turn :] + queues[: self._turn]
        tasks, retry_in = protocol.take(
            ordered,
            max_tasks=min(free, TAKE_BATCH * len(ordered)),
            worker_id=self.worker_id,
            paused=set(),
            push=True,
        )
        if tasks:
            # Each task goes where its queue's target was when it was handed
            # out (a column the hand-out returns), not where this process's
            # copy of the queue, read up to LOOK_SECONDS ago, says.  Each
            # target is parsed once per pass.
            texts = [getattr(task, "push_target") for task in tasks]  # noqa: B009
            targets = {
                text: push.target_of(jsonutil.loads(text.encode()))
                for text in set(texts)
                if text is not None  # a task with an HTTP target in a pulled queue
            }
            self.sender.send(
                [
                    _job(task, targets.get(text) if text is not None else None)
                    for task, text in zip(tasks, texts, strict=True)
                ]
            )
        return len(tasks), retry_in

    def on_shutdown(self) -> None:
        left = self.sender.wait_idle(STOP_GRACE_SECONDS)
        unrecorded = self.finisher.stop(FINISH_GRACE_SECONDS)
        self.sender.close()
        if left or unrecorded:
            # Still `executing`: their leases end and the watchdog retries them.
            logger.warning(
                "push.stopped_in_flight",
                extra={"in_flight": left, "unrecorded": unrecorded, "worker_id": self.worker_id},
            )


def _job(task: Task, target: push.PushTarget | None) -> Job:
    traceparent, tracestate = tracing.push_context(task, task.tracestate)
    handed_ns = tracing.now_ns()
    if task.http_request is not None:
        http = httptasks.request_of(task)
        return Job(
            task_id=str(task.pk),
            queue=task.queue.name,
            attempt=task.attempts,
            body=http.body,
            target=httptasks.target_of(http),
            http=http,
            dispatched_at=task.claimed_at,
            traceparent=traceparent,
            tracestate=tracestate,
            handed_ns=handed_ns,
        )
    # Any other task take(push=True) hands out is a push queue's.
    assert target is not None
    return Job(
        task_id=str(task.pk),
        queue=task.queue.name,
        attempt=task.attempts,
        body=jsonutil.dumps(task.payload),
        target=target,
        traceparent=traceparent,
        tracestate=tracestate,
        handed_ns=handed_ns,
    )
