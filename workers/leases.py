"""What a worker does with a task it holds: heartbeat, ack, nack.

Every call is fenced by the lease: the task must be `executing`, held by the
calling `worker_id` and, when the caller names it, at the same `attempt`.
Anything else is `LeaseLost` and changes nothing.  Acks repeat safely: the
same worker acking the same attempt again is answered as a success.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from taskforge.conf import conf
from taskforge.lib import jsonutil
from tasks import sql, transitions
from tasks.exceptions import LeaseLost
from tasks.models import Task, TaskStatus
from workers import heartbeats

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


def lease_expires_at(heartbeat_at: datetime) -> datetime:
    return heartbeat_at + timedelta(seconds=conf.HEARTBEAT_TIMEOUT_SECONDS)


def heartbeat(worker_id: str, items: Sequence[Item]) -> list[Outcome]:
    """Extend the leases of the items the worker holds, in one statement."""
    record_seen(worker_id)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute(
            sql.HEARTBEAT,
            {
                "worker_id": worker_id,
                "now": now,
                "ids": [item.task_id for item in items],
                "attempts": [item.attempt for item in items],
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


def ack(worker_id: str, items: Sequence[Item]) -> list[Outcome]:
    """Mark the items done, in one statement; repeated acks answer as successes."""
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
    acked = {str(task.pk): task for task in transitions.ack_many(rows, worker_id=worker_id)}
    missing = [item for item in items if item.task_id not in acked]
    if missing:
        done = {
            str(task.pk): task
            for task in Task.objects.select_related("queue").filter(
                pk__in=[item.task_id for item in missing], status=S.DONE, claimed_by=worker_id
            )
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
            .first()
        )
        if task is None or item.attempt not in (None, task.attempts):
            raise LeaseLost()
        transitions.fail(task, error=error, retry=retry, retry_after_seconds=retry_after_seconds)
    return task


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
