from __future__ import annotations

from typing import Any

from django.core.validators import RegexValidator
from rest_framework import serializers

from taskforge.api.fields import (
    AnyJSONField,
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictNumberField,
    StrictSerializer,
    TimeField,
)
from tasks.api.serializers import TaskIdField, TaskSerializer, check_payload_size

WORKER_ID = r"^[A-Za-z0-9._:@-]{1,200}$"
MAX_BATCH = 100


class WorkerIdField(StrictCharField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(max_length=200, **kwargs)
        self.validators.append(RegexValidator(WORKER_ID, "1 to 200 of A-Z a-z 0-9 . _ : @ -"))


class AttemptField(StrictIntegerField):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(min_value=1, max_value=2**31 - 1, required=False, **kwargs)


class ClaimSerializer(StrictSerializer):
    worker_id = WorkerIdField()
    queues = serializers.ListField(
        child=StrictCharField(max_length=100), min_length=1, max_length=20, allow_empty=False
    )
    max_tasks = StrictIntegerField(min_value=1, max_value=100, default=1)
    wait_seconds = StrictNumberField(min_value=0, max_value=30, default=0)


class LeaseItemSerializer(StrictSerializer):
    task_id = TaskIdField()
    attempt = AttemptField()


class HeartbeatSerializer(LeaseItemSerializer):
    worker_id = WorkerIdField()


class AckItemSerializer(LeaseItemSerializer):
    result = AnyJSONField(required=False, allow_null=True)

    def validate_result(self, value: Any) -> Any:
        check_payload_size(value, "result")
        return value


class AckSerializer(AckItemSerializer):
    worker_id = WorkerIdField()


class NackSerializer(LeaseItemSerializer):
    worker_id = WorkerIdField()
    error = StrictCharField(min_length=1, max_length=10_000, trim_whitespace=False)
    retry = StrictBooleanField(default=True)
    retry_after_seconds = StrictNumberField(min_value=0, max_value=86_400, required=False)


class HeartbeatBatchSerializer(StrictSerializer):
    worker_id = WorkerIdField()
    # DRF's ListSerializer takes min_length/max_length; its stub does not list them.
    items = LeaseItemSerializer(  # type: ignore[call-arg]
        many=True, min_length=1, max_length=MAX_BATCH, allow_empty=False
    )


class AckBatchSerializer(StrictSerializer):
    worker_id = WorkerIdField()
    items = AckItemSerializer(  # type: ignore[call-arg]
        many=True, min_length=1, max_length=MAX_BATCH, allow_empty=False
    )


class ClaimedTaskSerializer(TaskSerializer):
    lease_expires_at = TimeField()


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
