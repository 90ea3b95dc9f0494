from __future__ import annotations

from rest_framework import serializers

from queues.models import MAX_CONCURRENCY_LIMIT, MAX_RETRIES_LIMIT, Queue, is_queue_name
from taskforge.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictSerializer,
    TimeField,
)

# A rate far beyond any real downstream; keeps the token bucket's math small.
MAX_RATE_LIMIT = 1_000_000


class QueueSerializer(serializers.ModelSerializer[Queue]):
    created_at = TimeField(read_only=True)

    class Meta:
        model = Queue
        fields = [
            "id",
            "name",
            "max_retries",
            "rate_limit",
            "max_concurrency",
            "paused",
            "created_at",
        ]
        read_only_fields = fields


class QueuePatchSerializer(StrictSerializer):
    max_retries = StrictIntegerField(min_value=0, max_value=MAX_RETRIES_LIMIT, required=False)
    rate_limit = StrictIntegerField(
        min_value=1, max_value=MAX_RATE_LIMIT, allow_null=True, required=False
    )
    max_concurrency = StrictIntegerField(
        min_value=1,
        max_value=MAX_CONCURRENCY_LIMIT,
        allow_null=True,
        required=False,
        help_text="Tasks of this queue executing at once, across all workers; null: unlimited.",
    )
    paused = StrictBooleanField(required=False)


class QueueCreateSerializer(QueuePatchSerializer):
    # As sent: " a" or "abc\n" is not a queue name (API.md), so nothing is trimmed.
    name = StrictCharField(max_length=100, trim_whitespace=False)

    def validate_name(self, value: str) -> str:
        if not is_queue_name(value):
            raise serializers.ValidationError(
                "Use 1 to 100 of A-Z a-z 0-9 _ . - , starting with a letter or digit."
            )
        return value
