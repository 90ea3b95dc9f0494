"""Tasks built from rows: what `tasks.sql`'s statements return, and what CREATE writes.

The transitions' hot statements return their rows; these become `Task`
instances without the ORM's query machinery (`taskforge.lib.internals`'s row
builder), each with its queue cached, so a claim or an ack of 100 tasks reads
no queue again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from django.db import DEFAULT_DB_ALIAS

from queues import lookup
from queues.models import Queue
from taskforge.lib import internals, jsonutil, pg
from taskforge.lib.ids import uuid7
from tasks.models import Task, TaskStatus


@dataclass(frozen=True, slots=True)
class NewTask:
    """What a new task is made of; `create` gives it its id and its first status."""

    queue: Queue
    payload: Any
    priority: int
    scheduled_at: datetime
    max_retries: int
    idempotency_key: str | None = None
    # A task of the Cloud Tasks API (tasks.models.Task): its name, HTTP target
    # and own retry policy, as stored.
    name: str | None = None
    http_request: dict[str, Any] | None = None
    retry_config: dict[str, Any] | None = None
    # The enqueue's W3C Trace Context (taskforge.tracing.context_of).
    traceparent: str | None = None
    tracestate: str | None = None
    fairness_key: str | None = None


class Buffered(NamedTuple):
    """A task `transitions.buffer_due` moved into the buffer (`http`: to the push lane;
    `key`: its fairness key's ready set)."""

    task_id: str
    priority: int
    scheduled_at: datetime
    http: bool = False
    key: str | None = None


def create_params(
    queue_id: Any, group: Sequence[Task], now: datetime, *, wake: bool
) -> dict[str, Any]:
    """The CREATE statement's parameters for one queue's new tasks (tasks.sql.CREATE).

    Due tasks left `pending` wake the dispatchers: those without a fairness key only
    when `wake`, keyed ones always (their backlog is moved key by key); the earliest
    task due later wakes the schedulers.
    """
    traced = any(task.traceparent is not None for task in group)
    later = [task.scheduled_at for task in group if task.scheduled_at > now]
    return {
        "queue_id": queue_id,
        "now": now,
        "ids": pg.array(task.pk for task in group),
        "payloads": pg.array(jsonutil.dumps(task.payload).decode() for task in group),
        "priorities": pg.array(task.priority for task in group),
        "scheduled": pg.array(task.scheduled_at for task in group),
        "max_retries": pg.array(task.max_retries for task in group),
        "keys": pg.array(task.idempotency_key for task in group),
        "buffer": pg.array(task.status == TaskStatus.CLAIMED for task in group),
        "names": pg.array(task.name for task in group),
        "http": pg.array(json_or_none(task.http_request) for task in group),
        "retry": pg.array(json_or_none(task.retry_config) for task in group),
        # NULL arrays when no task has a trace context (unnest pads them with NULLs).
        "traceparents": pg.array(task.traceparent for task in group) if traced else None,
        "tracestates": pg.array(task.tracestate for task in group) if traced else None,
        "fairness_keys": pg.array(task.fairness_key for task in group),
        "notify": any(
            t.status == TaskStatus.PENDING
            and t.scheduled_at <= now
            and (wake or t.fairness_key is not None)
            for t in group
        ),
        "wake_at": f"{min(later).timestamp():.6f}" if later else None,
    }


def json_or_none(value: Any) -> str | None:
    """A JSON column's value as the statements take it (text), or NULL."""
    return None if value is None else jsonutil.dumps(value).decode()


# Task.queue, which the tasks built here get through internals.cache_related.
_QUEUE = Task._meta.get_field("queue")

# Task's fields in from_db order, and where create() puts each value.
ATTNAMES = [field.attname for field in Task._meta.concrete_fields]
_AT = {name: index for index, name in enumerate(ATTNAMES)}


def stored_task(
    build: Callable[[list[Any]], Task], item: NewTask, status: str, now: datetime
) -> Task:
    """The row the CREATE statement writes for `item`, as a query would load it
    (`build`: internals.builder of ATTNAMES)."""
    values: list[Any] = [None] * len(ATTNAMES)
    values[_AT["id"]] = uuid7()
    values[_AT["queue_id"]] = item.queue.pk
    values[_AT["payload"]] = item.payload
    values[_AT["status"]] = status
    values[_AT["priority"]] = item.priority
    values[_AT["scheduled_at"]] = item.scheduled_at
    values[_AT["attempts"]] = 0
    values[_AT["max_retries"]] = item.max_retries
    values[_AT["idempotency_key"]] = item.idempotency_key
    values[_AT["name"]] = item.name
    values[_AT["http_request"]] = item.http_request
    values[_AT["retry_config"]] = item.retry_config
    values[_AT["traceparent"]] = item.traceparent
    values[_AT["tracestate"]] = item.tracestate
    values[_AT["fairness_key"]] = item.fairness_key
    values[_AT["created_at"]] = values[_AT["updated_at"]] = now
    values[_AT["status_changed_at"]] = now
    task = build(values)
    internals.cache_related(_QUEUE, task, item.queue)
    return task


# Statement text -> the names of its result's columns.  psycopg's `description`
# builds a Column object per column on every call (~20 per statement here: a
# twentieth of a single-task claim's CPU); a statement's columns do not change.
_column_names: dict[str, list[str]] = {}


def run_statement(
    query: str, params: dict[str, Any], queues: dict[Any, Queue] | None
) -> list[Task]:
    """Run one of tasks.sql's statements and build Tasks from the rows it returns."""
    with pg.cursor() as cursor:
        cursor.execute(query, params)
        names = _column_names.get(query)
        if names is None or len(names) != cursor.cursor.pgresult.nfields:
            names = _column_names[query] = [column.name for column in cursor.description]
        rows = cursor.fetchall()
    tasks = internals.instances_from_rows(Task, names, rows, using=DEFAULT_DB_ALIAS)
    known: dict[Any, Queue] = dict(queues or {})
    missing = {task.queue_id for task in tasks} - set(known)
    if missing:
        known.update(lookup.by_ids(missing))
    for task in tasks:
        internals.cache_related(_QUEUE, task, known[task.queue_id])
    return tasks
