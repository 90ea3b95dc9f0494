"""`TaskForge`: a thread-safe client of the TaskForge HTTP API (API.md).

One method per endpoint; the HTTP plumbing (the connection pool, retries, pages) is
`taskforge_client.http`'s.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from taskforge_client.batching import EnqueueBatcher, EnqueueLanes
from taskforge_client.calls import Enqueues
from taskforge_client.errors import TaskForgeError
from taskforge_client.http import RetryPolicy
from taskforge_client.http import segment as _q
from taskforge_client.models import (
    BatchResult,
    DeadLetter,
    Heartbeat,
    Queue,
    QueueKey,
    Stats,
    Task,
    TaskEvent,
    TaskSpec,
    format_time,
)
from taskforge_client.schedules import UNSET as _UNSET
from taskforge_client.schedules import Schedules


class TaskForge(Schedules):
    """A client of one TaskForge server.

    Args:
        url: the server's base URL, e.g. `http://localhost:8080`.
        api_key: a key from `manage.py createapikey` (its role limits what calls succeed).
        timeout: seconds to connect and to wait for each answer (a claim's long poll is added).
        retries: how many times an idempotent call is repeated after a network error or 503.
        backoff_base, backoff_max: the retry backoff (seconds), see `RetryPolicy`.
        maxsize: connections kept open to the server (size of the pool).
        coalesce: `enqueue` and `enqueue_many` calls made from several threads while a
            request of this client to the same queue is in flight wait for it and go
            together as the next request (one batch enqueue), each call still answered
            on its own; a call made while none is in flight goes out at once. False:
            every call is a request of its own.

    Every method raises a `TaskForgeError` subclass on failure. The client is safe to share
    between threads; `close()` (or a `with` block) releases its connections.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        retries: int = 3,
        backoff_base: float = 0.2,
        backoff_max: float = 5.0,
        maxsize: int = 10,
        coalesce: bool = True,
    ) -> None:
        super().__init__(
            url,
            api_key,
            timeout=timeout,
            retries=retries,
            backoff_base=backoff_base,
            backoff_max=backoff_max,
            maxsize=maxsize,
        )
        self._lanes = EnqueueLanes(self) if coalesce else None

    def create_queue(
        self,
        name: str,
        *,
        max_retries: int | None = None,
        rate_limit: int | None = None,
        max_concurrency: int | None = None,
        push: dict[str, Any] | None = None,
        paused: bool | None = None,
        retry_policy: dict[str, Any] | None = None,
        key_weights: Mapping[str, int] | None = None,
        key_max_concurrency: int | None = None,
        key_rate_limit: float | None = None,
    ) -> Queue:
        """Create a queue (admin). Raises `Conflict` (`queue_exists`) when it exists.

        `rate_limit`: tasks handed out per second (an integer here; a queue made over
        the Cloud Tasks API may show a fraction, e.g. 0.5).
        `max_concurrency`: at most this many of its tasks executing at once,
        across all workers (None: unlimited).
        `push`: `{"url": ..., "timeout_seconds"?: 30, "headers"?: {...}}` to have
        TaskForge POST each task to that URL instead of workers claiming it.
        `retry_policy`: the backoff between attempts, `{"min_backoff_seconds"?,
        "max_backoff_seconds"?, "max_doublings"?, "max_retry_duration_seconds"?}`.
        `key_weights`, `key_max_concurrency`, `key_rate_limit`: how the queue shares
        its hand-outs between fairness keys (weights 1..100, a cap and a rate per key).
        """
        settings = {
            "max_retries": max_retries,
            "rate_limit": rate_limit,
            "max_concurrency": max_concurrency,
            "push": push,
            "paused": paused,
            "retry_policy": retry_policy,
            "key_weights": None if key_weights is None else dict(key_weights),
            "key_max_concurrency": key_max_concurrency,
            "key_rate_limit": key_rate_limit,
        }
        body = {"name": name, **{k: v for k, v in settings.items() if v is not None}}
        return Queue.from_dict(self.request("POST", "/queues", body))

    def list_queues(self, *, limit: int | None = None) -> list[Queue]:
        """Every queue (following pagination), or the first `limit`."""
        return list(self._paginate("/queues", {}, Queue.from_dict, limit))

    def get_queue(self, name: str) -> Queue:
        """One queue; `NotFound` when it does not exist."""
        return Queue.from_dict(self.request("GET", f"/queues/{_q(name)}"))

    def update_queue(
        self,
        name: str,
        *,
        max_retries: int | None = None,
        rate_limit: int | None = _UNSET,
        max_concurrency: int | None = _UNSET,
        push: dict[str, Any] | None = _UNSET,
        paused: bool | None = None,
        retry_policy: dict[str, Any] | None = _UNSET,
        key_weights: Mapping[str, int] | None = None,
        key_max_concurrency: int | None = _UNSET,
        key_rate_limit: float | None = _UNSET,
    ) -> Queue:
        """Change a queue's settings (admin). `rate_limit=None` removes the limit,
        `max_concurrency=None` the cap (tasks running past a lowered cap go on),
        `push=None` push delivery (a new `push` replaces the old one whole),
        `retry_policy=None` the queue's own backoff (the deployment's applies);
        `key_weights` replaces the map whole (`{}` clears it), `key_max_concurrency=None`
        and `key_rate_limit=None` remove the per-key cap and rate."""
        kept = {  # None: left as it is
            "max_retries": max_retries,
            "paused": paused,
            "key_weights": None if key_weights is None else dict(key_weights),
        }
        nullable = {  # left out: as it is; None: removed
            "rate_limit": rate_limit,
            "max_concurrency": max_concurrency,
            "push": push,
            "retry_policy": retry_policy,
            "key_max_concurrency": key_max_concurrency,
            "key_rate_limit": key_rate_limit,
        }
        body: dict[str, Any] = {k: v for k, v in kept.items() if v is not None}
        body.update({k: v for k, v in nullable.items() if v is not _UNSET})
        return Queue.from_dict(self.request("PATCH", f"/queues/{_q(name)}", body))

    def delete_queue(self, name: str) -> None:
        """Delete a queue (admin); `Conflict` (`queue_not_empty`) while it holds live tasks."""
        self.request("DELETE", f"/queues/{_q(name)}")

    def pause_queue(self, name: str) -> Queue:
        """Stop handing out the queue's tasks (admin); it still accepts tasks."""
        return Queue.from_dict(self.request("POST", f"/queues/{_q(name)}/pause", idempotent=True))

    def resume_queue(self, name: str) -> Queue:
        """Resume a paused queue (admin)."""
        return Queue.from_dict(self.request("POST", f"/queues/{_q(name)}/resume", idempotent=True))

    def purge_queue(self, name: str) -> int:
        """Cancel every pending, claimed and retry task (admin); returns how many."""
        answer = self.request("POST", f"/queues/{_q(name)}/purge", idempotent=True)
        return int(answer["cancelled"])

    # -- tasks --

    def enqueue(
        self,
        queue: str,
        payload: Any,
        *,
        priority: int | None = None,
        delay: float | timedelta | None = None,
        at: datetime | None = None,
        idempotency_key: str | None = None,
        max_retries: int | None = None,
        fairness_key: str | None = None,
    ) -> Task:
        """Add a task to `queue` and return it.

        Args:
            payload: any JSON value but None.
            priority: 1 (most urgent) .. 10; the server's default is 5.
            delay: run no sooner than this many seconds from now.
            at: run no sooner than this aware datetime (give `delay` or `at`, not both).
            idempotency_key: a second enqueue with the same key in this queue returns the
                first task instead of adding one; only keyed enqueues are retried.
            max_retries: overrides the queue's.
            fairness_key: the tenant (customer, account) the task belongs to: the queue
                takes turns between keys, so one key's backlog does not delay another's.

        Called from several threads at once, calls coalesce (see the class's `coalesce`):
        the answer and the errors are this call's own all the same.
        With opentelemetry-api installed, the task carries the current span's context
        (`traceparent`), and the worker's handler span continues that trace.
        """
        spec = TaskSpec(payload, priority, delay, at, idempotency_key, max_retries, fairness_key)
        task: Task = self._enqueue(queue, Enqueues.one(spec))
        return task

    def enqueue_many(self, queue: str, tasks: Iterable[TaskSpec | Mapping[str, Any]]) -> list[Task]:
        """Add 1..1000 tasks in one call (all or nothing); results keep the order.

        Items are `TaskSpec`s or mappings with `TaskSpec`'s fields. The call is retried
        only when every item has an idempotency key. It may go in one request with other
        threads' calls (see the class's `coalesce`), all or nothing still for its own tasks.
        Items without a `traceparent` of their own carry the current span's context
        (opentelemetry-api installed).
        """
        specs = [t if isinstance(t, TaskSpec) else TaskSpec(**t) for t in tasks]
        if not specs:
            return []
        added: list[Task] = self._enqueue(queue, Enqueues.of(specs))
        return added

    def _enqueue(self, queue: str, call: Enqueues) -> Any:
        if self._lanes is None:
            return self._enqueue_call(queue, call)
        return self._lanes.call(queue, call)

    def _enqueue_call(self, queue: str, call: Enqueues) -> Any:
        """One enqueue request as the call would make it on its own: an enqueue's through
        the single endpoint, an enqueue_many's (or joined calls') through the batch one."""
        path, data, headers = call.wire()
        answer = self.request(
            "POST", f"/queues/{_q(queue)}{path}", data=data, idempotent=call.keyed, headers=headers
        )
        if call.many:
            return [Task.from_dict(t) for t in answer["results"]]
        return Task.from_dict(answer)

    def get_task(self, queue: str, task_id: str) -> Task:
        """One task; `NotFound` when it is not a task of `queue`."""
        return Task.from_dict(self.request("GET", f"/queues/{_q(queue)}/tasks/{_q(task_id)}"))

    def cancel_task(self, queue: str, task_id: str) -> Task:
        """Cancel a pending, claimed or retry task; `Conflict` (`invalid_state`) otherwise."""
        return Task.from_dict(self.request("DELETE", f"/queues/{_q(queue)}/tasks/{_q(task_id)}"))

    def list_tasks(
        self,
        queue: str,
        *,
        status: str | None = None,
        claimed_by: str | None = None,
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        limit: int | None = 100,
        fairness_key: str | None = None,
    ) -> list[Task]:
        """Tasks of a queue, newest first: at most `limit` (None: all, following pages).

        `fairness_key`: only that key's tasks (`""`: only tasks without a key)."""
        params = {
            "status": status,
            "claimed_by": claimed_by,
            "created_after": created_after,
            "created_before": created_before,
            "fairness_key": fairness_key,
        }
        return list(self._paginate(f"/queues/{_q(queue)}/tasks", params, Task.from_dict, limit))

    def task_events(self, queue: str, task_id: str) -> list[TaskEvent]:
        """A task's state transitions, oldest first."""
        path = f"/queues/{_q(queue)}/tasks/{_q(task_id)}/events"
        return list(self._paginate(path, {}, TaskEvent.from_dict, None))

    def list_keys(
        self, queue: str, *, min_pending: int | None = None, limit: int | None = None
    ) -> list[QueueKey]:
        """The queue's fairness keys with live tasks (the anonymous key, `key` None, first),
        those with at least `min_pending` due tasks; every one (following pages) or `limit`."""
        params = {"min_pending": min_pending}
        return list(self._paginate(f"/queues/{_q(queue)}/keys", params, QueueKey.from_dict, limit))

    def stats(self, queue: str) -> Stats:
        """Depth, DLQ depth, throughput and error rate of a queue."""
        return Stats.from_dict(self.request("GET", f"/queues/{_q(queue)}/stats"))

    # -- dead-letter queue (admin) --

    def dlq(
        self,
        queue: str,
        *,
        died_after: datetime | None = None,
        died_before: datetime | None = None,
        limit: int | None = 100,
    ) -> list[DeadLetter]:
        """The queue's dead tasks: at most `limit` (None: all)."""
        params = {"died_after": died_after, "died_before": died_before}
        return list(self._paginate(f"/queues/{_q(queue)}/dlq", params, DeadLetter.from_dict, limit))

    def replay(self, queue: str, task_id: str) -> Task:
        """Put one dead task back to `pending` with `attempts` 0; `NotFound` if not dead."""
        return Task.from_dict(self.request("POST", f"/queues/{_q(queue)}/dlq/{_q(task_id)}/replay"))

    def replay_many(self, queue: str, ids: Iterable[str]) -> int:
        """Replay these dead tasks; ids unknown or not dead are skipped. Returns how many."""
        body = {"ids": [str(i) for i in ids]}
        return int(self.request("POST", f"/queues/{_q(queue)}/dlq/replay", body)["replayed"])

    def replay_all(self, queue: str) -> int:
        """Replay every dead task of the queue; returns how many."""
        body = {"all": True}
        return int(self.request("POST", f"/queues/{_q(queue)}/dlq/replay", body)["replayed"])

    def discard(self, queue: str, task_id: str) -> None:
        """Delete a dead task for good."""
        self.request("DELETE", f"/queues/{_q(queue)}/dlq/{_q(task_id)}")

    # -- worker protocol (worker role) --

    def claim(
        self,
        worker_id: str,
        queues: list[str],
        *,
        max_tasks: int = 1,
        wait_seconds: float = 0,
    ) -> list[Task]:
        """Lease up to `max_tasks` (1..100) tasks, long-polling up to `wait_seconds` (0..30).

        Never retried: an answer lost in transit leaves its tasks leased until they expire.
        """
        body = {
            "worker_id": worker_id,
            "queues": list(queues),
            "max_tasks": max_tasks,
            "wait_seconds": wait_seconds,
        }
        answer = self.request(
            "POST", "/workers/claim", body, idempotent=False, timeout=self.timeout + wait_seconds
        )
        return [Task.from_dict(t) for t in answer["tasks"]]

    def heartbeat(self, worker_id: str, task_id: str, attempt: int | None = None) -> Heartbeat:
        """Extend a lease; `LeaseLost` when this worker no longer holds it."""
        body = _worker_body(worker_id, task_id, attempt)
        return Heartbeat.from_dict(
            self.request("POST", "/workers/heartbeat", body, idempotent=True)
        )

    def heartbeat_batch(
        self, worker_id: str, items: Iterable[tuple[str, int | None]]
    ) -> list[BatchResult]:
        """Extend several leases at once: items are (task_id, attempt); 1..100 of them."""
        body = {
            "worker_id": worker_id,
            "items": [_item(task_id, attempt) for task_id, attempt in items],
        }
        answer = self.request("POST", "/workers/heartbeat/batch", body, idempotent=True)
        return [BatchResult.from_dict(r) for r in answer["results"]]

    def ack(
        self, worker_id: str, task_id: str, attempt: int | None = None, result: Any = None
    ) -> Task:
        """Report success (the task becomes `done`). Idempotent, hence retried."""
        body = _worker_body(worker_id, task_id, attempt)
        if result is not None:
            body["result"] = result
        return Task.from_dict(self.request("POST", "/workers/ack", body, idempotent=True))

    def ack_batch(
        self, worker_id: str, items: Iterable[tuple[str, int | None, Any]]
    ) -> list[BatchResult]:
        """Ack several tasks at once: items are (task_id, attempt, result); 1..100 of them.

        Each item is answered on its own (`ok`, or its error such as `lease_lost`).
        Idempotent, hence retried.
        """
        body_items = []
        for task_id, attempt, result in items:
            item = _item(task_id, attempt)
            if result is not None:
                item["result"] = result
            body_items.append(item)
        body = {"worker_id": worker_id, "items": body_items}
        answer = self.request("POST", "/workers/ack/batch", body, idempotent=True)
        return [BatchResult.from_dict(r) for r in answer["results"]]

    def batcher(self, *, linger: float = 0.001, max_batch: int = 1000) -> EnqueueBatcher:
        """A background batcher of single enqueues (see `taskforge_client.batching`).

        `batcher.enqueue(queue, payload, ...)` may be called from many threads; the
        calls that arrive within `linger` seconds go as one batch per queue (at most
        `max_batch` tasks), and each returns its own task or raises its own error.
        Close it (or use a `with` block) to send what is queued and stop its thread.
        """
        return EnqueueBatcher(self, linger=linger, max_batch=max_batch)

    def nack(
        self,
        worker_id: str,
        task_id: str,
        error: str,
        *,
        attempt: int | None = None,
        retry: bool = True,
        retry_after_seconds: float | None = None,
    ) -> Task:
        """Report failure: the task goes to `retry`, or `dead` when exhausted or `retry=False`.

        Not retried by the client (a repeat after a lost answer would fail with
        `LeaseLost` when `attempt` is given, which a caller may treat as done).
        """
        body = _worker_body(worker_id, task_id, attempt)
        body["error"] = (error or "error")[:10000]
        if not retry:
            body["retry"] = False
        if retry_after_seconds is not None:
            body["retry_after_seconds"] = retry_after_seconds
        return Task.from_dict(self.request("POST", "/workers/nack", body, idempotent=False))


def _worker_body(worker_id: str, task_id: str, attempt: int | None) -> dict[str, Any]:
    body: dict[str, Any] = {"worker_id": worker_id, "task_id": str(task_id)}
    if attempt is not None:
        body["attempt"] = attempt
    return body


def _item(task_id: str, attempt: int | None) -> dict[str, Any]:
    item: dict[str, Any] = {"task_id": str(task_id)}
    if attempt is not None:
        item["attempt"] = attempt
    return item


__all__ = ["RetryPolicy", "TaskForge", "TaskForgeError", "TaskSpec", "format_time"]
