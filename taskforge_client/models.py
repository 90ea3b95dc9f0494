"""Typed results of the TaskForge API (dataclasses; times are aware `datetime`s in UTC),
and `TaskSpec`, one task of an enqueue.

Each object keeps the answer it was built from in `raw` (handy for JSON output); fields
the server adds later are ignored rather than rejected.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any


def format_time(value: datetime) -> str:
    """An aware datetime as the API wants it: ISO 8601 in UTC with `Z`."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("times must be timezone-aware (e.g. datetime.now(UTC))")
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def as_seconds(value: float | timedelta) -> float:
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
    fairness_key: str | None = None
    # W3C Trace Context of this task (a batch item's own; `TaskForge.enqueue` and the
    # batcher fill them from the current span when opentelemetry-api is installed).
    traceparent: str | None = None
    tracestate: str | None = None

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
            body["delay_seconds"] = as_seconds(self.delay)
        if self.at is not None:
            body["scheduled_at"] = format_time(self.at)
        if self.idempotency_key is not None:
            body["idempotency_key"] = self.idempotency_key
        if self.max_retries is not None:
            body["max_retries"] = self.max_retries
        if self.traceparent is not None:
            body["traceparent"] = self.traceparent
            if self.tracestate is not None:
                body["tracestate"] = self.tracestate
        if self.fairness_key is not None:
            body["fairness_key"] = self.fairness_key
        return body


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 time from the API (`...Z`), or None."""
    if value is None or value == "":
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


@dataclass(frozen=True)
class Queue:
    """A queue: `GET /queues/:name`."""

    id: str
    name: str
    max_retries: int
    rate_limit: float | None
    paused: bool
    created_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Last, with a default: a server before API.md v1.1 does not send it.
    max_concurrency: int | None = None
    # None: workers claim the tasks; else {"url", "timeout_seconds", "headers"} (v1.1).
    push: dict[str, Any] | None = None
    # None: the deployment's backoff; else {"min_backoff_seconds", "max_backoff_seconds",
    # "max_doublings", "max_retry_duration_seconds"} (v1.2).
    retry_policy: dict[str, Any] | None = None
    # Fairness keys (v1.2): weights by key, and each key's cap and rate (None: none).
    key_weights: dict[str, int] = field(default_factory=dict)
    key_max_concurrency: int | None = None
    key_rate_limit: float | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Queue:
        return cls(
            id=str(data["id"]),
            name=data["name"],
            max_retries=int(data["max_retries"]),
            rate_limit=data.get("rate_limit"),
            paused=bool(data.get("paused")),
            created_at=parse_time(data.get("created_at")),
            raw=data,
            max_concurrency=data.get("max_concurrency"),
            push=data.get("push"),
            retry_policy=data.get("retry_policy"),
            key_weights=dict(data.get("key_weights") or {}),
            key_max_concurrency=data.get("key_max_concurrency"),
            key_rate_limit=data.get("key_rate_limit"),
        )


@dataclass(frozen=True)
class Task:
    """A task. `lease_expires_at` is set only on tasks handed out by a claim."""

    id: str
    queue: str
    payload: Any
    status: str
    priority: int
    scheduled_at: datetime | None
    claimed_at: datetime | None
    claimed_by: str | None
    heartbeat_at: datetime | None
    attempts: int
    max_retries: int
    last_error: str | None
    result: Any
    idempotency_key: str | None
    created_at: datetime | None
    updated_at: datetime | None
    finished_at: datetime | None
    lease_expires_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # The enqueue's W3C Trace Context, in a claim's answer (API.md v1.2).
    traceparent: str | None = None
    tracestate: str | None = None
    # The task's fairness key (v1.2); None for the anonymous key.
    fairness_key: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Task:
        return cls(
            id=str(data["id"]),
            queue=data["queue"],
            payload=data.get("payload"),
            status=data["status"],
            priority=int(data.get("priority", 5)),
            scheduled_at=parse_time(data.get("scheduled_at")),
            claimed_at=parse_time(data.get("claimed_at")),
            claimed_by=data.get("claimed_by"),
            heartbeat_at=parse_time(data.get("heartbeat_at")),
            attempts=int(data.get("attempts", 0)),
            max_retries=int(data.get("max_retries", 0)),
            last_error=data.get("last_error"),
            result=data.get("result"),
            idempotency_key=data.get("idempotency_key"),
            created_at=parse_time(data.get("created_at")),
            updated_at=parse_time(data.get("updated_at")),
            finished_at=parse_time(data.get("finished_at")),
            lease_expires_at=parse_time(data.get("lease_expires_at")),
            raw=data,
            traceparent=data.get("traceparent"),
            tracestate=data.get("tracestate"),
            fairness_key=data.get("fairness_key"),
        )


@dataclass(frozen=True)
class TaskEvent:
    """One state transition of a task: `GET .../tasks/:id/events`."""

    at: datetime | None
    from_status: str | None
    to_status: str
    worker_id: str | None
    attempt: int | None
    error: str | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskEvent:
        return cls(
            at=parse_time(data.get("at")),
            from_status=data.get("from_status"),
            to_status=data["to_status"],
            worker_id=data.get("worker_id"),
            attempt=data.get("attempt"),
            error=data.get("error"),
            raw=data,
        )


@dataclass(frozen=True)
class DeadLetter:
    """A dead task in a queue's DLQ; `id` is the task's id."""

    id: str
    queue: str
    payload: Any
    last_error: str | None
    attempts: int
    died_at: datetime | None
    replayed_at: datetime | None
    replay_count: int
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DeadLetter:
        return cls(
            id=str(data["id"]),
            queue=data["queue"],
            payload=data.get("payload"),
            last_error=data.get("last_error"),
            attempts=int(data.get("attempts", 0)),
            died_at=parse_time(data.get("died_at")),
            replayed_at=parse_time(data.get("replayed_at")),
            replay_count=int(data.get("replay_count", 0)),
            raw=data,
        )


@dataclass(frozen=True)
class Depth:
    """Task counts of a queue by state (see `Stats`)."""

    pending: int = 0
    scheduled: int = 0
    claimed: int = 0
    executing: int = 0
    retry: int = 0


@dataclass(frozen=True)
class Stats:
    """`GET /queues/:name/stats`."""

    queue: str
    paused: bool
    depth: Depth
    dlq_depth: int
    throughput_per_second: float
    error_rate: float
    oldest_pending_age_seconds: float | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # Fairness keys with live tasks, the anonymous key included (v1.2).
    keys: int = 0

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Stats:
        depth = data.get("depth") or {}
        return cls(
            queue=data["queue"],
            paused=bool(data.get("paused")),
            depth=Depth(**{k: int(depth.get(k, 0)) for k in Depth.__dataclass_fields__}),
            dlq_depth=int(data.get("dlq_depth", 0)),
            throughput_per_second=float(data.get("throughput_per_second") or 0.0),
            error_rate=float(data.get("error_rate") or 0.0),
            oldest_pending_age_seconds=data.get("oldest_pending_age_seconds"),
            raw=data,
            keys=int(data.get("keys", 0)),
        )


@dataclass(frozen=True)
class QueueKey:
    """One fairness key of a queue: `GET /queues/:name/keys` (`key` None: the anonymous key)."""

    key: str | None
    pending: int
    executing: int
    retry: int
    oldest_pending_age_seconds: float | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QueueKey:
        return cls(
            key=data.get("key"),
            pending=int(data.get("pending", 0)),
            executing=int(data.get("executing", 0)),
            retry=int(data.get("retry", 0)),
            oldest_pending_age_seconds=data.get("oldest_pending_age_seconds"),
            raw=data,
        )


@dataclass(frozen=True)
class BatchResult:
    """One item of a `heartbeat/batch` or `ack/batch` answer."""

    task_id: str
    ok: bool
    status: str | None = None
    lease_expires_at: datetime | None = None
    error_code: str | None = None
    error_message: str | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BatchResult:
        error = data.get("error") or {}
        return cls(
            task_id=str(data["task_id"]),
            ok=bool(data.get("ok")),
            status=data.get("status"),
            lease_expires_at=parse_time(data.get("lease_expires_at")),
            error_code=error.get("code"),
            error_message=error.get("message"),
        )


@dataclass(frozen=True)
class Heartbeat:
    """The answer to a single heartbeat."""

    task_id: str
    status: str
    heartbeat_at: datetime | None
    lease_expires_at: datetime | None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Heartbeat:
        return cls(
            task_id=str(data["task_id"]),
            status=data["status"],
            heartbeat_at=parse_time(data.get("heartbeat_at")),
            lease_expires_at=parse_time(data.get("lease_expires_at")),
        )


@dataclass(frozen=True)
class Schedule:
    """A cron schedule: `GET /queues/:name/schedules/:schedule`."""

    id: str
    queue: str
    name: str
    cron: str
    timezone: str
    payload: Any
    priority: int
    max_retries: int | None
    paused: bool
    next_run_at: datetime | None
    last_run_at: datetime | None
    created_at: datetime | None
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Schedule:
        return cls(
            id=str(data["id"]),
            queue=data["queue"],
            name=data["name"],
            cron=data["cron"],
            timezone=data["timezone"],
            payload=data.get("payload"),
            priority=int(data["priority"]),
            max_retries=data.get("max_retries"),
            paused=bool(data.get("paused")),
            next_run_at=parse_time(data.get("next_run_at")),
            last_run_at=parse_time(data.get("last_run_at")),
            created_at=parse_time(data.get("created_at")),
            raw=data,
        )
