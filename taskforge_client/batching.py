"""Coalescing single calls into batch calls: enqueues for producers, acks for workers.

`EnqueueBatcher` takes single enqueues from any number of threads and sends
them as `POST /queues/:name/tasks/batch` calls, one per queue, every
`linger` seconds (1 ms by default) or `max_batch` tasks, whichever comes
first; each caller blocks until its own task (or its own error) is back, so
the linger is part of every call's latency.  Calls arriving while a batch is
on the wire wait for it and go together in the next one.  A batch is all or
nothing on the server: when it is refused for some items (400, with
`fields` such as `tasks[3].priority`), those callers get the error with
their own fields and the others are sent again, so one bad item fails only
its own call.

`AckBatcher` does the same for a worker's acks (`POST /workers/ack/batch`),
whose answer is per item already.
"""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from taskforge_client.errors import ConnectionFailed, Invalid, ServerError
from taskforge_client.models import BatchResult, Task, TaskSpec
from taskforge_client.tracing import current_context

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


@dataclass
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
        super().__init__("taskforge-enqueue-batcher", linger, min(max_batch, 1000))

    def enqueue(self, queue: str, payload: Any, **options: Any) -> Task:
        spec = TaskSpec(payload, **options)
        spec.body()  # a spec the API would refuse fails here, in the caller's thread
        if spec.traceparent is None:
            # The caller's span, taken in its own thread: each item of a batch keeps its own.
            context = current_context()
            if "traceparent" in context:
                spec = replace(
                    spec,
                    traceparent=context["traceparent"],
                    tracestate=context.get("tracestate"),
                )
        task: Task = self.submit(queue, spec)
        return task

    def __enter__(self) -> EnqueueBatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, key: str, chunk: list[_Pending]) -> None:
        while chunk:
            try:
                tasks = self.client.enqueue_many(key, [pending.item for pending in chunk])
            except Invalid as exc:
                failed = _failed_items(exc, len(chunk))
                if not failed:
                    raise  # not about one item (a body the server refused as a whole)
                for index, fields in failed.items():
                    chunk[index].future.set_exception(
                        Invalid(exc.message, code=exc.code, status=exc.status, fields=fields)
                    )
                chunk = [p for i, p in enumerate(chunk) if i not in failed]
                continue
            for pending, task in zip(chunk, tasks, strict=True):
                pending.future.set_result(task)
            return


def _failed_items(exc: Invalid, size: int) -> dict[int, dict[str, list[str]]]:
    """The items a batch refusal names (`tasks[3].priority`), each with its own fields."""
    failed: dict[int, dict[str, list[str]]] = {}
    for name, messages in exc.fields.items():
        match = _ITEM_FIELD.match(name)
        if match is None:
            return {}
        index = int(match.group(1))
        if index >= size:
            return {}
        failed.setdefault(index, {})[match.group(2) or "non_field_errors"] = messages
    return failed


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
