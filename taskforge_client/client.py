"""`TaskForge`: a thread-safe client of the TaskForge HTTP API (API.md).

Connections are pooled by one `urllib3.PoolManager` per client. Idempotent calls (GET,
DELETE, PATCH, pause/resume, heartbeat, ack, and enqueue with an `idempotency_key`) are
retried on network errors and 503 with exponential backoff and full jitter; the others
(enqueue without a key, create queue, claim, nack, replay) are sent exactly once, since
repeating them after a lost answer could act twice.
"""

from __future__ import annotations

import json
import logging
import random
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import urllib3

from taskforge_client.batching import EnqueueBatcher
from taskforge_client.errors import ConnectionFailed, TaskForgeError, error_from_response
from taskforge_client.models import (
    BatchResult,
    DeadLetter,
    Heartbeat,
    Queue,
    Schedule,
    Stats,
    Task,
    TaskEvent,
)

log = logging.getLogger("taskforge_client")

T = TypeVar("T")

_UNSET: Any = object()


def format_time(value: datetime) -> str:
    """An aware datetime as the API wants it: ISO 8601 in UTC with `Z`."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("times must be timezone-aware (e.g. datetime.now(UTC))")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _seconds(value: float | timedelta) -> float:
    return value.total_seconds() if isinstance(value, timedelta) else float(value)


@dataclass(frozen=True)
class TaskSpec:
    """One task of a batch enqueue; the fields are those of `TaskForge.enqueue`."""

    payload: Any
    priority: int | None = None
    delay: float | timedelta | None = None
    at: datetime | None = None
    idempotency_key: str | None = None
    max_retries: int | None = None

    def body(self) -> dict[str, Any]:
        """The enqueue body of API.md."""
        if self.payload is None:
            raise ValueError("payload must not be None (the API refuses null)")
        if self.delay is not None and self.at is not None:
            raise ValueError("give at most one of delay and at")
        body: dict[str, Any] = {"payload": self.payload}
        if self.priority is not None:
            body["priority"] = self.priority
        if self.delay is not None:
            body["delay_seconds"] = _seconds(self.delay)
        if self.at is not None:
            body["scheduled_at"] = format_time(self.at)
        if self.idempotency_key is not None:
            body["idempotency_key"] = self.idempotency_key
        if self.max_retries is not None:
            body["max_retries"] = self.max_retries
        return body


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter: attempt n waits rand(0, min(cap, base * 2**n))."""

    retries: int = 3
    backoff_base: float = 0.2
    backoff_max: float = 5.0

    def delay(self, attempt: int) -> float:
        """Seconds to sleep before retry number `attempt` (0-based)."""
        return random.uniform(  # nosec B311
            0, min(self.backoff_max, self.backoff_base * (2**attempt))
        )


class TaskForge:
    """A client of one TaskForge server.

    Args:
        url: the server's base URL, e.g. `http://localhost:8080`.
        api_key: a key from `manage.py createapikey` (its role limits what calls succeed).
        timeout: seconds to connect and to wait for each answer (a claim's long poll is added).
        retries: how many times an idempotent call is repeated after a network error or 503.
        backoff_base, backoff_max: the retry backoff (seconds), see `RetryPolicy`.
        maxsize: connections kept open to the server (size of the pool).

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
    ) -> None:
        if not url:
            raise ValueError("url is required")
        _warn_if_plain_http(url)
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retry_policy = RetryPolicy(retries, backoff_base, backoff_max)
        self._pool = urllib3.PoolManager(
            num_pools=4,
            maxsize=maxsize,
            block=False,
            retries=False,  # our own policy, per call, below
        )
        self._headers = {
            "Authorization": f"Bearer {api_key}",
            "Accept": "application/json",
            "User-Agent": "taskforge-client/0.1",
        }
        self.requests_sent = 0  # attempts on the wire, retries included (for tests, metrics)

    # -- plumbing --

    def close(self) -> None:
        """Close pooled connections."""
        self._pool.clear()

    def __enter__(self) -> TaskForge:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: Mapping[str, Any] | None = None,
        idempotent: bool | None = None,
        timeout: float | None = None,
    ) -> Any:
        """One API call; returns the decoded JSON answer (None for 204).

        `idempotent` defaults to True for GET, PUT, PATCH and DELETE; only idempotent calls
        are retried (network errors and 503).
        """
        if idempotent is None:
            idempotent = method in ("GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")
        url = self.url + path
        if params:
            query = {k: _param(v) for k, v in params.items() if v is not None}
            if query:
                url += "?" + urllib.parse.urlencode(query)
        data = None
        headers = dict(self._headers)  # per-request headers replace the pool's, so all here
        if body is not None:
            data = json.dumps(body, separators=(",", ":")).encode()
            headers["Content-Type"] = "application/json"
        read_timeout = self.timeout if timeout is None else timeout
        attempts = self.retry_policy.retries + 1 if idempotent else 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                self.requests_sent += 1
                response = self._pool.request(
                    method,
                    url,
                    body=data,
                    headers=headers,
                    timeout=urllib3.Timeout(connect=self.timeout, read=read_timeout),
                    redirect=False,
                )
            except urllib3.exceptions.HTTPError as exc:
                if last:
                    raise ConnectionFailed(
                        f"{method} {path}: {exc}", code="connection_error"
                    ) from exc
                self._sleep_before_retry(attempt, method, path, str(exc))
                continue
            status = response.status
            parsed = _decode(response.data)
            if 200 <= status < 300:
                return parsed
            error = error_from_response(status, parsed)
            if status == 503 and not last:
                self._sleep_before_retry(attempt, method, path, str(error))
                continue
            raise error
        raise AssertionError("unreachable")  # pragma: no cover

    def _sleep_before_retry(self, attempt: int, method: str, path: str, why: str) -> None:
        delay = self.retry_policy.delay(attempt)
        log.warning(
            "taskforge %s %s failed (%s); retry %d in %.2fs", method, path, why, attempt + 1, delay
        )
        time.sleep(delay)

    def _paginate(
        self,
        path: str,
        params: Mapping[str, Any],
        parse: Callable[[dict[str, Any]], T],
        limit: int | None,
    ) -> Iterator[T]:
        count = 0
        page_size = min(limit, 500) if limit else 100
        answer = self.request("GET", path, params={**params, "limit": page_size})
        while True:
            for item in answer.get("results", []):
                yield parse(item)
                count += 1
                if limit is not None and count >= limit:
                    return
            following = answer.get("next")
            if not following:
                return
            parts = urllib.parse.urlsplit(following)
            query = dict(urllib.parse.parse_qsl(parts.query))
            answer = self.request("GET", parts.path, params=query)

    # -- queues --

    def create_queue(
        self,
        name: str,
        *,
        max_retries: int | None = None,
        rate_limit: int | None = None,
        max_concurrency: int | None = None,
        push: dict[str, Any] | None = None,
        paused: bool | None = None,
    ) -> Queue:
        """Create a queue (admin). Raises `Conflict` (`queue_exists`) when it exists.

        `max_concurrency`: at most this many of its tasks executing at once,
        across all workers (None: unlimited).
        `push`: `{"url": ..., "timeout_seconds"?: 30, "headers"?: {...}}` to have
        TaskForge POST each task to that URL instead of workers claiming it.
        """
        body: dict[str, Any] = {"name": name}
        if max_retries is not None:
            body["max_retries"] = max_retries
        if rate_limit is not None:
            body["rate_limit"] = rate_limit
        if max_concurrency is not None:
            body["max_concurrency"] = max_concurrency
        if push is not None:
            body["push"] = push
        if paused is not None:
            body["paused"] = paused
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
    ) -> Queue:
        """Change a queue's settings (admin). `rate_limit=None` removes the limit,
        `max_concurrency=None` the cap (tasks running past a lowered cap go on),
        `push=None` push delivery (a new `push` replaces the old one whole)."""
        body: dict[str, Any] = {}
        if max_retries is not None:
            body["max_retries"] = max_retries
        if rate_limit is not _UNSET:
            body["rate_limit"] = rate_limit
        if max_concurrency is not _UNSET:
            body["max_concurrency"] = max_concurrency
        if push is not _UNSET:
            body["push"] = push
        if paused is not None:
            body["paused"] = paused
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
        """
        spec = TaskSpec(payload, priority, delay, at, idempotency_key, max_retries)
        answer = self.request(
            "POST",
            f"/queues/{_q(queue)}/tasks",
            spec.body(),
            idempotent=idempotency_key is not None,
        )
        return Task.from_dict(answer)

    def enqueue_many(self, queue: str, tasks: Iterable[TaskSpec | Mapping[str, Any]]) -> list[Task]:
        """Add 1..1000 tasks in one call (all or nothing); results keep the order.

        Items are `TaskSpec`s or mappings with `TaskSpec`'s fields. The call is retried
        only when every item has an idempotency key.
        """
        specs = [t if isinstance(t, TaskSpec) else TaskSpec(**t) for t in tasks]
        if not specs:
            return []
        answer = self.request(
            "POST",
            f"/queues/{_q(queue)}/tasks/batch",
            {"tasks": [s.body() for s in specs]},
            idempotent=all(s.idempotency_key is not None for s in specs),
        )
        return [Task.from_dict(t) for t in answer["results"]]

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
    ) -> list[Task]:
        """Tasks of a queue, newest first: at most `limit` (None: all, following pages)."""
        params = {
            "status": status,
            "claimed_by": claimed_by,
            "created_after": created_after,
            "created_before": created_before,
        }
        return list(self._paginate(f"/queues/{_q(queue)}/tasks", params, Task.from_dict, limit))

    def task_events(self, queue: str, task_id: str) -> list[TaskEvent]:
        """A task's state transitions, oldest first."""
        path = f"/queues/{_q(queue)}/tasks/{_q(task_id)}/events"
        return list(self._paginate(path, {}, TaskEvent.from_dict, None))

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

    # -- schedules (admin) --

    def create_schedule(
        self,
        queue: str,
        name: str,
        cron: str,
        payload: Any,
        *,
        timezone: str | None = None,
        priority: int | None = None,
        max_retries: int | None = None,
        paused: bool | None = None,
    ) -> Schedule:
        """Enqueue `payload` into `queue` at each time `cron` names (in `timezone`, default UTC).

        `cron` is a 5-field expression or `@hourly`, `@daily`, ...; `Invalid` when it or
        the time zone does not parse, `Conflict` (`schedule_exists`) when the queue has a
        schedule of that name.
        """
        body: dict[str, Any] = {"name": name, "cron": cron, "payload": payload}
        optional = {
            "timezone": timezone,
            "priority": priority,
            "max_retries": max_retries,
            "paused": paused,
        }
        body.update({key: value for key, value in optional.items() if value is not None})
        return Schedule.from_dict(self.request("POST", f"/queues/{_q(queue)}/schedules", body))

    def list_schedules(self, queue: str, *, limit: int | None = None) -> list[Schedule]:
        """The queue's schedules by name (all, following pages, or the first `limit`)."""
        path = f"/queues/{_q(queue)}/schedules"
        return list(self._paginate(path, {}, Schedule.from_dict, limit))

    def get_schedule(self, queue: str, name: str) -> Schedule:
        """One schedule; `NotFound` when the queue has none of that name."""
        return Schedule.from_dict(self.request("GET", _schedule_path(queue, name)))

    def update_schedule(
        self,
        queue: str,
        name: str,
        *,
        cron: str | None = None,
        timezone: str | None = None,
        payload: Any = _UNSET,
        priority: int | None = None,
        max_retries: int | None = _UNSET,
        paused: bool | None = None,
    ) -> Schedule:
        """Change a schedule (not its name). `max_retries=None` falls back to the queue's."""
        body: dict[str, Any] = {}
        for key, value in {"cron": cron, "timezone": timezone, "priority": priority}.items():
            if value is not None:
                body[key] = value
        if payload is not _UNSET:
            body["payload"] = payload
        if max_retries is not _UNSET:
            body["max_retries"] = max_retries
        if paused is not None:
            body["paused"] = paused
        return Schedule.from_dict(self.request("PATCH", _schedule_path(queue, name), body))

    def pause_schedule(self, queue: str, name: str) -> Schedule:
        """Stop a schedule enqueueing; resumed, it enqueues the latest missed time once."""
        return self.update_schedule(queue, name, paused=True)

    def resume_schedule(self, queue: str, name: str) -> Schedule:
        """Resume a paused schedule."""
        return self.update_schedule(queue, name, paused=False)

    def delete_schedule(self, queue: str, name: str) -> None:
        """Delete a schedule; the tasks it enqueued stay."""
        self.request("DELETE", _schedule_path(queue, name))

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


_LOCAL_HOSTS = {"localhost", "127.0.0.1", "::1"}


def _warn_if_plain_http(url: str) -> None:
    """The API key travels in every request: say so when it would cross a network in clear."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "http" and (parts.hostname or "") not in _LOCAL_HOSTS:
        log.warning(
            "TaskForge at %s over plain http: the API key is sent unencrypted; use https", url
        )


def key_in_argv_warning(argv: list[str] | None) -> str | None:
    """A warning when the API key was given as `--api-key` on a command line."""
    args = sys.argv[1:] if argv is None else argv
    if any(arg == "--api-key" or arg.startswith("--api-key=") for arg in args):
        return (
            "--api-key on the command line is visible to every user of this machine (ps); "
            "set TASKFORGE_API_KEY instead"
        )
    return None


def _schedule_path(queue: str, name: str) -> str:
    return f"/queues/{_q(queue)}/schedules/{_q(name)}"


def _q(segment: str) -> str:
    return urllib.parse.quote(str(segment), safe="")


def _param(value: Any) -> str:
    if isinstance(value, datetime):
        return format_time(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _decode(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


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
