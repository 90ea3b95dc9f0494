from __future__ import annotations

from typing import Any

from rest_framework import serializers

from taskforge.api import bodies
from taskforge.api.fields import TimeField
from tasks.api.serializers import TASK_ID, TaskSerializer, check_payload_size

WORKER_ID = r"^[A-Za-z0-9._:@-]{1,200}$"
MAX_BATCH = 100

# The bodies of the worker protocol (API.md), in one place: the views validate with
# these rules, and the OpenAPI document reads the serializers built from them.
# As sent (API.md): " w1\n" is refused, not read as "w1".
WORKER = bodies.Str(
    max_length=200,
    as_sent=True,
    pattern=WORKER_ID,
    pattern_message="1 to 200 of A-Z a-z 0-9 . _ : @ -",
)
ATTEMPT = bodies.Int(min_value=1, max_value=2**31 - 1, required=False)
RESULT = bodies.AnyJSON(
    required=False, allow_null=True, check=lambda value: check_payload_size(value, "result")
)

CLAIM = bodies.Obj(
    "ClaimSerializer",
    {
        "worker_id": WORKER,
        "queues": bodies.ListOf(
            bodies.Str(max_length=100, as_sent=True), min_length=1, max_length=20
        ),
        "max_tasks": bodies.Int(min_value=1, max_value=100, default=1),
        "wait_seconds": bodies.Number(min_value=0, max_value=30, default=0),
    },
)
LEASE_ITEM = bodies.Obj("LeaseItemSerializer", {"task_id": TASK_ID, "attempt": ATTEMPT})
HEARTBEAT = bodies.Obj(
    "HeartbeatSerializer", {"task_id": TASK_ID, "attempt": ATTEMPT, "worker_id": WORKER}
)
ACK_ITEM = bodies.Obj(
    "AckItemSerializer", {"task_id": TASK_ID, "attempt": ATTEMPT, "result": RESULT}
)
ACK = bodies.Obj(
    "AckSerializer",
    {"task_id": TASK_ID, "attempt": ATTEMPT, "result": RESULT, "worker_id": WORKER},
)
NACK = bodies.Obj(
    "NackSerializer",
    {
        "task_id": TASK_ID,
        "attempt": ATTEMPT,
        "worker_id": WORKER,
        "error": bodies.Str(min_length=1, max_length=10_000, trim=False),
        "retry": bodies.Bool(default=True),
        "retry_after_seconds": bodies.Number(min_value=0, max_value=86_400, required=False),
    },
)
HEARTBEAT_BATCH = bodies.Obj(
    "HeartbeatBatchSerializer",
    {
        "worker_id": WORKER,
        "items": bodies.ListOf(LEASE_ITEM, min_length=1, max_length=MAX_BATCH, length_first=True),
    },
)
ACK_BATCH = bodies.Obj(
    "AckBatchSerializer",
    {
        "worker_id": WORKER,
        "items": bodies.ListOf(ACK_ITEM, min_length=1, max_length=MAX_BATCH, length_first=True),
    },
)

# For the OpenAPI document only.
ClaimSerializer = CLAIM.serializer()
HeartbeatSerializer = HEARTBEAT.serializer()
AckSerializer = ACK.serializer()
NackSerializer = NACK.serializer()
HeartbeatBatchSerializer = HEARTBEAT_BATCH.serializer()
AckBatchSerializer = ACK_BATCH.serializer()


class ClaimedTaskSerializer(TaskSerializer):
    lease_expires_at = TimeField()
    # In a claim's answer always (null without a valid traceparent at enqueue).
    traceparent = serializers.CharField(
        allow_null=True,
        required=False,
        help_text="The enqueue's W3C traceparent (a claim's answer); null without a valid one.",
    )
    tracestate = serializers.CharField(
        allow_null=True,
        required=False,
        help_text="The enqueue's W3C tracestate, kept with its traceparent.",
    )


class ClaimResultSerializer(serializers.Serializer[Any]):
    tasks = ClaimedTaskSerializer(many=True)


class HeartbeatResultSerializer(serializers.Serializer[Any]):
    task_id = serializers.UUIDField()
    status = serializers.CharField()
    heartbeat_at = TimeField()
    lease_expires_at = TimeField()


class ItemErrorSerializer(serializers.Serializer[Any]):
    code = serializers.CharField()
    message = serializers.CharField()


class BatchItemResultSerializer(serializers.Serializer[Any]):
    task_id = serializers.UUIDField()
    ok = serializers.BooleanField()
    status = serializers.CharField(required=False)
    lease_expires_at = TimeField(required=False)
    error = ItemErrorSerializer(required=False)


class BatchResultSerializer(serializers.Serializer[Any]):
    results = BatchItemResultSerializer(many=True)


class WorkerSerializer(serializers.Serializer[Any]):
    worker_id = serializers.CharField()
    last_seen_at = TimeField()
    current_tasks = serializers.ListField(child=serializers.UUIDField())
    stale = serializers.BooleanField()
