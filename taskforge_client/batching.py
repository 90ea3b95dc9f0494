"""Coalescing single calls into batch calls: enqueues for producers, acks for workers.

`EnqueueLanes` is `TaskForge.enqueue`'s and `enqueue_many`'s own coalescing (the
natural path): per queue, one request of the client is in flight at a time; a call
made meanwhile waits, and the calls that waited go together as the next request
(`POST /queues/:name/tasks/batch`), sent by the first of them from its own thread.
A call made while nothing is in flight goes out at once, as it would without
coalescing (a lone `enqueue` through `POST /queues/:name/tasks`), so there is no
linger: a request's duration is the only wait, and only for calls that would
otherwise have made a request of their own meanwhile.

`EnqueueBatcher` takes single enqueues from any number of threads and sends
them as batch calls, one per queue, every `linger` seconds (1 ms by default)
or `max_batch` tasks, whichever comes first, from a thread of its own; each
caller blocks until its own task (or its own error) is back, so the linger is
part of every call's latency.  Calls arriving while a batch is on the wire
wait for it and go together in the next one.

Both send what they gathered through `send_joined`, and both keep each call
its own: a batch is all or nothing on the server, so when it is refused for
some items (400, with `fields` such as `tasks[3].priority`), those callers get
the error with their own fields and the others are sent again; a refusal that
names no item (a 413 for one oversized payload, say) sends each call again on
its own, as it would have gone, so that it gets the answer it would have had.

`AckBatcher` does the same for a worker's acks (`POST /workers/ack/batch`),
whose answer is per item already.
"""

from __future__ import annotations

import bisect
import logging
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

from taskforge_client.calls import Enqueues
from taskforge_client.errors import (
    ConnectionFailed,
    Invalid,
    PayloadTooLarge,
    ServerError,
    TaskForgeError,
    Unavailable,
)
from taskforge_client.models import BatchResult, Task, TaskSpec

log = logging.getLogger("taskforge_client.batching")

T = TypeVar("T")

# How long an outcome (an ack, a nack) is retried through network trouble or 5xx answers.
OUTAGE_SECONDS = 60.0


class GaveUp(Exception):
    """The caller stopped the retries (its `give_up` said so)."""


def through_outages(
    call: Callable[[], T],
    *,
    what: str,
    give_up: Callable[[], bool] = lambda: False,
    seconds: float = OUTAGE_SECONDS,
) -> T:
    """`call()`, repeated through network errors and 5xx answers for up to `seconds`.

    Backoff 0.2 s doubling to 5 s, jittered.  Only for calls that repeat
    safely.  Raises: the last ConnectionFailed/ServerError past the deadline;
    any other TaskForgeError at once; GaveUp when `give_up()` turns true.
    """
    deadline = time.monotonic() + seconds
    delay = 0.2
    while True:
        if give_up():
            raise GaveUp()
        try:
            return call()
        except (ConnectionFailed, ServerError) as exc:
            if time.monotonic() > deadline:
                raise
            log.warning("%s failed (%s); retrying", what, exc)
            time.sleep(delay * random.uniform(0.5, 1.0))  # nosec B311
            delay = min(5.0, delay * 2)


_ITEM_FIELD = re.compile(r"^tasks\[(\d+)\]\.?(.*)$")

# Limits of one coalesced request: the API's 1000 tasks, and a body well under the
# server's TASKFORGE_MAX_REQUEST_BYTES (10 MiB by default).  A call past either goes alone.
MAX_BATCH = 1000
MAX_BATCH_BYTES = 1 << 20

# A waiting call's outcome that is not its own answer: it is its turn to send its
# queue's next request (LEAD), or it must make its own call after all (ALONE).
LEAD: Any = object()
ALONE: Any = object()


@dataclass(eq=False)
class _Pending:
    key: str
    item: Any
    future: Future[Any] = field(default_factory=Future)


class _Coalescer:
    """A thread that sends what callers put in, grouped by key, in batches."""

    def __init__(self, name: str, linger: float, max_batch: int) -> None:
        if linger < 0 or max_batch < 1:
            raise ValueError("linger must be >= 0 and max_batch >= 1")
        self.linger = linger
        self.max_batch = max_batch
        self._lock = threading.Condition()
        self._pending: list[_Pending] = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, key: str, item: Any) -> Any:
        """Queue one item and wait for its own result; raises its own error."""
        return self.submit_nowait(key, item).result()

    def submit_nowait(self, key: str, item: Any) -> Future[Any]:
        """Queue one item; its future gets its own result or error once its batch is sent.

        Raises:
            RuntimeError: the batcher is closed.
        """
        pending = _Pending(key, item)
        with self._lock:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._pending.append(pending)
            # The sender waits for a first item, then lingers until its deadline or
            # a full batch: it needs waking for those only, not for every item.
            if len(self._pending) == 1 or len(self._pending) >= self.max_batch:
                self._lock.notify_all()
        return pending.future

    def close(self) -> None:
        """Send what is queued, then stop the thread."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closed:
                    self._lock.wait()
                if not self._pending and self._closed:
                    return
                # Linger from the first item for more to join, unless a batch is full.
                deadline = time.monotonic() + self.linger
                while len(self._pending) < self.max_batch and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._lock.wait(left)
                taken, self._pending = self._pending, []
            groups: dict[str, list[_Pending]] = {}
            for pending in taken:
                groups.setdefault(pending.key, []).append(pending)
            for key, group in groups.items():
                for start in range(0, len(group), self.max_batch):
                    chunk = group[start : start + self.max_batch]
                    try:
                        self.send(key, chunk)
                    except BaseException as exc:
                        for pending in chunk:
                            if not pending.future.done():
                                pending.future.set_exception(exc)

    def send(self, key: str, chunk: list[_Pending]) -> None:
        raise NotImplementedError


class EnqueueBatcher(_Coalescer):
    """Single enqueues from many threads, sent as batch enqueues.

    Use from `TaskForge.batcher()`; `enqueue(queue, payload, ...)` takes the
    arguments of `TaskForge.enqueue` and returns the same `Task` (its status
    as an enqueue answers it).
    """

    def __init__(self, client: Any, *, linger: float = 0.001, max_batch: int = 1000) -> None:
        self.client = client
        super().__init__("taskforge-enqueue-batcher", linger, min(max_batch, MAX_BATCH))

    def enqueue(self, queue: str, payload: Any, **options: Any) -> Task:
        # A spec the API would refuse fails here, in the caller's thread.
        call = Enqueues.one(TaskSpec(payload, **options))
        task: Task = self.submit(queue, call)
        if task is ALONE:
            task = self.client._enqueue_call(queue, call)
        return task

    def __enter__(self) -> EnqueueBatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, key: str, chunk: list[_Pending]) -> None:
        send_joined(self.client, key, chunk)


class _Lane:
    """A queue's lane: it exists from a request's start until every call of that request
    has its answer in hand (`delivering` counts those that do not yet)."""

    __slots__ = ("delivering", "waiting")

    def __init__(self) -> None:
        self.waiting: deque[_Pending] = deque()
        self.delivering = 1


class EnqueueLanes:
    """A client's enqueue calls, coalesced per queue while one of its requests is in flight.

    Used by `TaskForge.enqueue` and `enqueue_many` (unless the client was made with
    `coalesce=False`).  A queue's lane exists while a request of it is in flight,
    until each call in it has taken its answer; it holds the calls waiting for the
    next request.  Counting the answers' hand-over as part of the request matters
    under load: the callers of a batch, woken one by one, call again while the
    others still wake, and so wait for the next request together, rather than the
    first one going alone and the rest after it (every other request a lone call).
    No thread of its own: each request is sent by the caller whose turn it is.
    """

    def __init__(
        self, client: Any, *, max_batch: int = MAX_BATCH, max_bytes: int = MAX_BATCH_BYTES
    ) -> None:
        self.client = client
        self.max_batch = max_batch
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._lanes: dict[str, _Lane] = {}

    def call(self, queue: str, call: Enqueues) -> Any:
        """Make the call: at once when nothing of `queue` is in flight, else in the next
        request.  Returns its own answer (a Task, or a list for an enqueue_many).

        Raises: its own TaskForgeError, or the error of the request it went in.
        """
        with self._lock:
            lane = self._lanes.get(queue)
            if lane is None:
                self._lanes[queue] = _Lane()  # in flight: later calls wait in it
                pending = None
            else:
                pending = _Pending(queue, call)
                lane.waiting.append(pending)
        if pending is None:
            try:
                return self.client._enqueue_call(queue, call)
            finally:
                self._delivered(queue)
        try:
            outcome = pending.future.result()
        except BaseException:
            self._withdraw(queue, pending)
            raise
        if outcome is LEAD:
            outcome = self._lead(queue, pending)
        else:
            self._delivered(queue)
        if outcome is ALONE:
            return self.client._enqueue_call(queue, call)
        return outcome

    def _lead(self, queue: str, me: _Pending) -> Any:
        """Send the next request of `queue`: the calls waiting in its lane, `me` first."""
        with self._lock:
            lane = self._lanes[queue]
            batch = self._take(lane.waiting)
            lane.delivering = len(batch)
        try:
            if len(batch) == 1:
                return self.client._enqueue_call(queue, me.item)  # as it would have gone
            me.future = Future()  # LEAD was the old one's; this one gets the answer
            send_joined(self.client, queue, batch)
        finally:
            self._delivered(queue)
        return me.future.result()

    def _take(self, waiting: deque[_Pending]) -> list[_Pending]:
        """The waiting calls that go together, in the order they came (caller holds the lock)."""
        first = waiting.popleft()
        batch, count, size = [first], first.item.count, len(first.item.encoded)
        while waiting:
            call = waiting[0].item
            if count + call.count > self.max_batch or size + len(call.encoded) > self.max_bytes:
                break
            batch.append(waiting.popleft())
            count += call.count
            size += len(call.encoded) + 1
        return batch

    def _delivered(self, queue: str) -> None:
        """A call of the request in flight has its answer (or went its own way); after
        the last one, the first waiting call sends the next request."""
        with self._lock:
            lane = self._lanes[queue]
            lane.delivering -= 1
            if not lane.delivering:
                self._next(queue, lane)

    def _next(self, queue: str, lane: _Lane) -> None:
        if lane.waiting:
            lane.waiting[0].future.set_result(LEAD)
        else:
            del self._lanes[queue]

    def _withdraw(self, queue: str, pending: _Pending) -> None:
        """A call's thread was interrupted: the call leaves, passing its turn on if it
        had been given one, or counts as answered if its request is on its way."""
        with self._lock:
            lane = self._lanes.get(queue)
            if lane is None:
                return
            if pending in lane.waiting:
                lane.waiting.remove(pending)
                if pending.future.done():  # it was its turn (LEAD)
                    self._next(queue, lane)
                return
        self._delivered(queue)


def send_joined(client: Any, queue: str, calls: list[_Pending]) -> None:
    """Send the tasks of these calls (each an `Enqueues`) as one batch enqueue, and
    settle each call's future: its own answer, its own error, or ALONE (the caller
    must make its own call after all, to get the answer it would have had).

    - a 400 naming items (`tasks[3].priority`): the calls those items belong to fail
      with their own fields (an enqueue's `priority`, an enqueue_many's `tasks[1].priority`),
      and the others are sent again (nothing was stored: a batch is all or nothing);
    - a refusal that names no item (a 413 for an oversized payload, a 400 without
      item fields): ALONE for each call;
    - no answer or a 503 for a batch that was not repeated (not every task keyed):
      the calls with keys go ALONE (alone they would have been repeated), the others
      fail with that error, as they would have alone;
    - any other error (401, 403, 404, 500, ...): every call fails with it.

    A single enqueue_many sent on its own is its own call: it gets every error as is.
    Raises: nothing but what interrupts the thread (each call then fails with it).
    """
    while calls:
        joined = Enqueues.joined(pending.item for pending in calls)
        try:
            tasks: list[Task] = client._enqueue_call(queue, joined)
        except Invalid as exc:
            blamed = _blamed(exc, calls)
            if not blamed:
                _on_their_own(calls, exc)
                return
            for index, fields in blamed.items():
                error = Invalid(exc.message, code=exc.code, status=exc.status, fields=fields)
                calls[index].future.set_exception(error)
            calls = [pending for i, pending in enumerate(calls) if i not in blamed]
            continue
        except PayloadTooLarge as exc:
            _on_their_own(calls, exc)
            return
        except (ConnectionFailed, Unavailable) as exc:
            for pending in calls:
                if pending.item.keyed and not joined.keyed:
                    pending.future.set_result(ALONE)
                else:
                    pending.future.set_exception(exc)
            return
        except TaskForgeError as exc:
            for pending in calls:
                pending.future.set_exception(exc)
            return
        except BaseException as exc:
            for pending in calls:
                if not pending.future.done():
                    pending.future.set_exception(exc)
            raise
        start = 0
        for pending in calls:
            call = pending.item
            pending.future.set_result(
                tasks[start : start + call.count] if call.many else tasks[start]
            )
            start += call.count
        return


def _on_their_own(calls: list[_Pending], exc: TaskForgeError) -> None:
    if len(calls) == 1 and calls[0].item.many:
        calls[0].future.set_exception(exc)  # it went as its own call would have
        return
    for pending in calls:
        pending.future.set_result(ALONE)


def _blamed(exc: Invalid, calls: list[_Pending]) -> dict[int, dict[str, list[str]]]:
    """The calls a batch refusal names, each with its fields in its own terms; empty
    when a field names no item of the batch."""
    starts = []
    start = 0
    for pending in calls:
        starts.append(start)
        start += pending.item.count
    blamed: dict[int, dict[str, list[str]]] = {}
    for name, messages in exc.fields.items():
        match = _ITEM_FIELD.match(name)
        if match is None:
            return {}
        item, rest = int(match.group(1)), match.group(2)
        index = bisect.bisect_right(starts, item) - 1
        if item >= start or index < 0:
            return {}
        call = calls[index].item
        if call.many:
            own = f"tasks[{item - starts[index]}]" + (f".{rest}" if rest else "")
        else:
            own = rest or "non_field_errors"
        blamed.setdefault(index, {})[own] = messages
    return blamed


class AckBatcher(_Coalescer):
    """A worker's acks, coalesced into `ack/batch` calls (one worker id, so one key)."""

    def __init__(
        self,
        client: Any,
        worker_id: str,
        *,
        linger: float = 0.005,
        max_batch: int = 100,
    ) -> None:
        self.client = client
        self.worker_id = worker_id
        super().__init__("taskforge-ack-batcher", linger, min(max_batch, 100))

    def ack(self, task_id: str, attempt: int | None, result: Any) -> BatchResult:
        """Ack one task; its own item's answer (`ok`, or the item's error code)."""
        answer: BatchResult = self.submit(self.worker_id, (task_id, attempt, result))
        return answer

    def ack_nowait(self, task_id: str, attempt: int | None, result: Any) -> Future[BatchResult]:
        """Ack one task without waiting: the future gets its item's answer."""
        return self.submit_nowait(self.worker_id, (task_id, attempt, result))

    def send(self, key: str, chunk: list[_Pending]) -> None:
        # Acks repeat safely (the same attempt acked again is a success).
        results: list[BatchResult] = through_outages(
            lambda: self.client.ack_batch(self.worker_id, [p.item for p in chunk]),
            what=f"ack of {len(chunk)} tasks",
        )
        for pending, result in zip(chunk, results, strict=True):
            pending.future.set_result(result)
