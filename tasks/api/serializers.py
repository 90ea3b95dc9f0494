from __future__ import annotations

from typing import Any

from rest_framework import serializers

from queues.models import FAIRNESS_KEY_MAX_LENGTH, MAX_RETRIES_LIMIT
from taskforge.api import bodies
from taskforge.api.exceptions import PayloadTooLarge
from taskforge.api.fields import AnyJSONField, QuerySerializer, TimeField
from taskforge.conf import conf
from taskforge.lib import jsonutil
from taskforge.lib.timeutil import isoformat
from taskforge.tracing import context_of
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.services import Enqueued, TaskSpec

MAX_BATCH = 1000
# A delay that keeps scheduled_at far inside the year 9999.
MAX_DELAY_SECONDS = 100 * 365 * 86400


def json_size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON: what the payload limit counts."""
    return len(jsonutil.dumps(value))


def check_payload_size(value: Any, what: str = "payload") -> None:
    """Raises: PayloadTooLarge (413) past TASKFORGE_MAX_PAYLOAD_BYTES."""
    limit = conf.MAX_PAYLOAD_BYTES
    if json_size(value) > limit:
        raise PayloadTooLarge(f"The {what} is larger than {limit} bytes as JSON.")


# A task id in a body: a UUID string (a number or a list is refused), as text.
TASK_ID = bodies.Uuid()
TaskIdField = bodies.UuidTextField


def task_to_dict(task: Task) -> dict[str, Any]:
    """The Task object of API.md (the hot path: no serializer machinery)."""
    return {
        "id": str(task.id),
        "queue": task.queue.name,
        "payload": task.payload,
        "status": task.status,
        "priority": task.priority,
        "scheduled_at": isoformat(task.scheduled_at),
        "claimed_at": isoformat(task.claimed_at),
        "claimed_by": task.claimed_by,
        "heartbeat_at": isoformat(task.heartbeat_at),
        "attempts": task.attempts,
        "max_retries": task.max_retries,
        "last_error": task.last_error,
        "result": task.result,
        "idempotency_key": task.idempotency_key,
        "created_at": isoformat(task.created_at),
        "updated_at": isoformat(task.updated_at),
        "finished_at": isoformat(task.finished_at),
        # A task of the Cloud Tasks API (API-cloudtasks.md "Native view"); null otherwise.
        "name": task.name,
        "http_request": task.http_request,
        "fairness_key": task.fairness_key,
    }


def enqueued_to_dict(result: Enqueued) -> dict[str, Any]:
    """An enqueue's answer for one task.

    API.md: "An enqueue or a replay answers `pending`; a due task may read
    `claimed` at any later moment."  A new due task may have gone on to
    `claimed` in the enqueue's own statement (the fast path); the answer is
    still the status it was enqueued with.  A task found by its idempotency
    key answers as it is now.
    """
    body = task_to_dict(result.task)
    if result.created:
        body["status"] = TaskStatus.PENDING
    return body


class TaskSerializer(serializers.Serializer[Any]):
    """The Task object; `to_representation` is `task_to_dict`."""

    id = serializers.UUIDField()
    queue = serializers.CharField()
    payload = AnyJSONField()
    status = serializers.ChoiceField(choices=TaskStatus.choices)
    priority = serializers.IntegerField(min_value=1, max_value=10)
    scheduled_at = TimeField()
    claimed_at = TimeField(allow_null=True)
    claimed_by = serializers.CharField(allow_null=True)
    heartbeat_at = TimeField(allow_null=True)
    attempts = serializers.IntegerField()
    max_retries = serializers.IntegerField()
    last_error = serializers.CharField(allow_null=True)
    result = AnyJSONField(allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    created_at = TimeField()
    updated_at = TimeField()
    finished_at = TimeField(allow_null=True)
    name = serializers.CharField(
        allow_null=True, help_text="The task ID given over the Cloud Tasks API, else null."
    )
    http_request = AnyJSONField(
        allow_null=True,
        help_text='A Cloud Tasks task\'s HTTP target: {"url", "http_method", "headers", "body" '
        '(base64 or null), "oidc_token", "dispatch_deadline_seconds"}; null for a native task.',
    )

    fairness_key = serializers.CharField(
        allow_null=True, help_text="The task's fairness key; null for the anonymous key."
    )

    def to_representation(self, instance: Task) -> dict[str, Any]:
        return task_to_dict(instance)


class TaskEventSerializer(serializers.Serializer[Any]):
    at = TimeField()
    from_status = serializers.ChoiceField(choices=TaskStatus.choices, allow_null=True)
    to_status = serializers.ChoiceField(choices=TaskStatus.choices)
    worker_id = serializers.CharField(allow_null=True)
    attempt = serializers.IntegerField()
    error = serializers.CharField(allow_null=True)

    def to_representation(self, instance: TaskEvent) -> dict[str, Any]:
        return {
            "at": isoformat(instance.at),
            "from_status": instance.from_status,
            "to_status": instance.to_status,
            "worker_id": instance.worker_id,
            "attempt": instance.attempt,
            "error": instance.error,
        }


def _one_schedule(attrs: dict[str, Any]) -> tuple[str, str] | None:
    if "scheduled_at" in attrs and "delay_seconds" in attrs:
        return "delay_seconds", "Give scheduled_at or delay_seconds, not both."
    return None


# The enqueue body of API.md (POST /queues/:name/tasks, and each of a batch's tasks).
ENQUEUE = bodies.Obj(
    "EnqueueSerializer",
    {
        "payload": bodies.AnyJSON(help_text="Any JSON value but null.", check=check_payload_size),
        "priority": bodies.Int(min_value=1, max_value=10, default=5),
        "scheduled_at": bodies.Time(required=False),
        "delay_seconds": bodies.Number(min_value=0, max_value=MAX_DELAY_SECONDS, required=False),
        "idempotency_key": bodies.Str(min_length=1, max_length=200, required=False),
        "max_retries": bodies.Int(min_value=0, max_value=MAX_RETRIES_LIMIT, required=False),
        "fairness_key": bodies.Str(
            min_length=1,
            max_length=FAIRNESS_KEY_MAX_LENGTH,
            as_sent=True,
            required=False,
            help_text="The task's fairness key (a tenant, a customer); none: the anonymous key.",
        ),
    },
    check=_one_schedule,
)
# A batch's item: the enqueue body, and its own trace context (API.md "Tracing
# (v1.2)"; docs/api-notes.md), which wins over the request's headers: one batch
# may carry the tasks of many traces (the SDK's batcher).  Any value is taken and
# one that is not a valid traceparent ignored, as a header's is: never a 400.
ENQUEUE_ITEM = bodies.Obj(
    "EnqueueBatchItemSerializer",
    {
        **ENQUEUE.fields,
        "traceparent": bodies.AnyJSON(
            required=False,
            allow_null=True,
            help_text="W3C traceparent of this task; a malformed one is ignored.",
        ),
        "tracestate": bodies.AnyJSON(
            required=False,
            allow_null=True,
            help_text="W3C tracestate, kept with a valid traceparent.",
        ),
    },
    check=_one_schedule,
)
ENQUEUE_BATCH = bodies.Obj(
    "EnqueueBatchSerializer",
    {"tasks": bodies.ListOf(ENQUEUE_ITEM, min_length=1, max_length=MAX_BATCH, length_first=True)},
)
# For the OpenAPI document only: the rules above validate.
EnqueueSerializer = ENQUEUE.serializer()
EnqueueBatchSerializer = ENQUEUE_BATCH.serializer()


def to_spec(attrs: dict[str, Any], trace: tuple[str | None, str | None] = (None, None)) -> TaskSpec:
    """One validated enqueue body as the service takes it, with the trace context of
    its request's headers (`taskforge.tracing.from_headers`) unless it has its own."""
    if "traceparent" in attrs or "tracestate" in attrs:
        attrs = dict(attrs)
        trace = context_of(attrs.pop("traceparent", None), attrs.pop("tracestate", None))
    return TaskSpec(**attrs, traceparent=trace[0], tracestate=trace[1])


class TaskListQuerySerializer(QuerySerializer):
    """Query parameters of GET /queues/:name/tasks (all optional)."""

    empty_allowed = ("fairness_key",)

    status = serializers.ChoiceField(choices=TaskStatus.choices, required=False)
    # A worker id as sent: `claimed_by=%20w1` finds no task of "w1".
    claimed_by = serializers.CharField(max_length=200, trim_whitespace=False, required=False)
    created_after = TimeField(required=False)
    created_before = TimeField(required=False)
    # A fairness key as sent; empty: the tasks without one.
    fairness_key = serializers.CharField(
        max_length=200, trim_whitespace=False, allow_blank=True, required=False
    )


class KeysQuerySerializer(QuerySerializer):
    """Query parameters of GET /queues/:name/keys (all optional)."""

    min_pending = serializers.IntegerField(min_value=0, required=False)
