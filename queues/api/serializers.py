from __future__ import annotations

from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from queues import push, retrypolicy
from queues.models import (
    KEY_WEIGHT_MAX,
    KEY_WEIGHTS_MAX_ENTRIES,
    MAX_CONCURRENCY_LIMIT,
    MAX_RETRIES_LIMIT,
    Queue,
    fairness_key_problem,
    is_queue_name,
)
from taskforge.api.fields import (
    StrictBooleanField,
    StrictCharField,
    StrictIntegerField,
    StrictNumberField,
    StrictSerializer,
    TimeField,
)

# The OpenAPI form of a queue's `push` (PushField validates it).
PUSH_SCHEMA: dict[str, Any] = {
    "type": "object",
    "nullable": True,
    "additionalProperties": False,
    "required": ["url"],
    "properties": {
        "url": {"type": "string", "format": "uri", "maxLength": push.MAX_URL_LENGTH},
        "timeout_seconds": {
            "type": "integer",
            "minimum": 1,
            "maximum": push.MAX_TIMEOUT_SECONDS,
            "default": push.DEFAULT_TIMEOUT_SECONDS,
        },
        "headers": {
            "type": "object",
            "maxProperties": push.MAX_HEADERS,
            "additionalProperties": {"type": "string"},
        },
    },
}

# The OpenAPI form of a queue's `push` in answers: what a key that is not an admin key sees.
PUSH_ANSWER_SCHEMA: dict[str, Any] = {
    **PUSH_SCHEMA,
    "description": "Header values and the URL's user info and query are shown to admin keys "
    f'only; other keys see "{push.REDACTED}" for each header value and the URL as '
    "scheme://host[:port]/path",
}


@extend_schema_field(PUSH_SCHEMA)
class PushField(serializers.Field):  # type: ignore[type-arg]
    """A queue's `push`: null, or a target as `queues.push` accepts it (stored with defaults)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault(
            "help_text",
            "null: workers pull the tasks; else TaskForge POSTs each task to `url` "
            '(API.md "Push delivery"). A PATCH replaces it as a whole.',
        )
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any]:
        try:
            return push.parse(data).as_json()
        except push.InvalidPush as exc:
            raise serializers.ValidationError(str(exc)) from exc

    def to_representation(self, value: Any) -> Any:
        return value


# The OpenAPI form of a queue's `retry_policy` (RetryPolicyField validates it).
RETRY_POLICY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "nullable": True,
    "additionalProperties": False,
    "properties": {
        "min_backoff_seconds": {"type": "number", "minimum": 0, "maximum": 86400},
        "max_backoff_seconds": {"type": "number", "minimum": 0, "maximum": 86400},
        "max_doublings": {"type": "integer", "minimum": 0, "maximum": 32},
        "max_retry_duration_seconds": {"type": "number", "minimum": 0, "maximum": 2592000},
    },
}


@extend_schema_field(RETRY_POLICY_SCHEMA)
class RetryPolicyField(serializers.Field):  # type: ignore[type-arg]
    """A queue's `retry_policy`: null (the deployment's rule) or queues.retrypolicy's form."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_null", True)
        kwargs.setdefault(
            "help_text",
            "null: the deployment's retry rule; else the backoff between min and max, doubling "
            "max_doublings times, and attempts stop once max_retry_duration_seconds passed "
            "(0: never).",
        )
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> dict[str, Any] | None:
        try:
            policy = retrypolicy.parse(data)
        except retrypolicy.InvalidPolicy as exc:
            raise serializers.ValidationError(str(exc)) from exc
        return None if policy is None else policy.as_json()

    def to_representation(self, value: Any) -> Any:
        return value


KEY_WEIGHTS_SCHEMA: dict[str, Any] = {
    "type": "object",
    "maxProperties": KEY_WEIGHTS_MAX_ENTRIES,
    "additionalProperties": {"type": "integer", "minimum": 1, "maximum": KEY_WEIGHT_MAX},
    "description": f"Weights by fairness key (1..{KEY_WEIGHT_MAX}); a key not listed weighs 1. "
    "A PATCH replaces the map as a whole.",
}


@extend_schema_field(KEY_WEIGHTS_SCHEMA)
class KeyWeightsField(serializers.Field):  # type: ignore[type-arg]
    """A queue's `key_weights`: {key: 1..100}, at most 1000 entries, never null."""

    def to_internal_value(self, data: Any) -> dict[str, int]:
        if not isinstance(data, dict):
            raise serializers.ValidationError("Expected an object of fairness keys to weights.")
        if len(data) > KEY_WEIGHTS_MAX_ENTRIES:
            raise serializers.ValidationError(
                f"At most {KEY_WEIGHTS_MAX_ENTRIES} keys may have a weight."
            )
        for key, weight in data.items():
            problem = fairness_key_problem(key)
            if problem is not None:
                raise serializers.ValidationError(f"{key!r}: {problem}")
            if isinstance(weight, bool) or not isinstance(weight, int):
                raise serializers.ValidationError(f"{key!r}: a weight is an integer.")
            if not 1 <= weight <= KEY_WEIGHT_MAX:
                raise serializers.ValidationError(f"{key!r}: a weight is 1 to {KEY_WEIGHT_MAX}.")
        return dict(data)

    def to_representation(self, value: Any) -> Any:
        return value


# A rate far beyond any real downstream; keeps the token bucket's math small.
MAX_RATE_LIMIT = 1_000_000


def rate_shown(rate: float | None) -> float | int | None:
    """A stored rate as answers show it: 5, or a fraction (0.5) set over /v2."""
    if rate is None:
        return None
    return int(rate) if float(rate).is_integer() else rate


class QueueSerializer(serializers.ModelSerializer[Queue]):
    created_at = TimeField(read_only=True)
    push = serializers.SerializerMethodField()
    rate_limit = serializers.SerializerMethodField()
    max_retries = serializers.SerializerMethodField()
    retry_policy = RetryPolicyField(read_only=True)
    key_weights = KeyWeightsField(read_only=True)
    key_rate_limit = serializers.SerializerMethodField()

    class Meta:
        model = Queue
        fields = [
            "id",
            "name",
            "max_retries",
            "rate_limit",
            "max_concurrency",
            "push",
            "paused",
            "retry_policy",
            "key_weights",
            "key_max_concurrency",
            "key_rate_limit",
            "created_at",
        ]
        read_only_fields = fields

    @extend_schema_field(
        {"type": "number", "nullable": True, "minimum": 0, "exclusiveMinimum": True}
    )
    def get_rate_limit(self, queue: Queue) -> float | int | None:
        """Tasks per second; a fraction when set over the Cloud Tasks API."""
        return rate_shown(queue.rate_limit)

    @extend_schema_field(
        {"type": "number", "nullable": True, "minimum": 0, "exclusiveMinimum": True}
    )
    def get_key_rate_limit(self, queue: Queue) -> float | int | None:
        """Hand-outs per second per fairness key; null: none."""
        return rate_shown(queue.key_rate_limit)

    @extend_schema_field({"type": "integer", "nullable": True, "minimum": 0, "maximum": 100})
    def get_max_retries(self, queue: Queue) -> int | None:
        """null when the Cloud Tasks API set maxAttempts unlimited or above 101."""
        return queue.shown_max_retries

    @extend_schema_field(PUSH_ANSWER_SCHEMA)
    def get_push(self, queue: Queue) -> dict[str, Any] | None:
        """The push target; whole for admin keys only (`reveal_push`), else `push.redacted`."""
        if self.context.get("reveal_push"):
            return queue.push
        shown: dict[str, Any] | None = push.redacted(queue.push)
        return shown


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
    push = PushField(required=False)
    paused = StrictBooleanField(required=False)
    retry_policy = RetryPolicyField(required=False)
    key_weights = KeyWeightsField(required=False)
    key_max_concurrency = StrictIntegerField(
        min_value=1,
        max_value=MAX_CONCURRENCY_LIMIT,
        allow_null=True,
        required=False,
        help_text="Tasks of one fairness key executing at once; null: no cap per key.",
    )
    key_rate_limit = StrictNumberField(
        min_value=0,
        max_value=MAX_RATE_LIMIT,
        allow_null=True,
        required=False,
        help_text="Hand-outs per second per fairness key (> 0); null: no rate per key.",
    )

    def validate_key_rate_limit(self, value: float | None) -> float | None:
        if value is not None and value <= 0:
            raise serializers.ValidationError("Ensure this value is greater than 0.")
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        if "max_retries" in attrs:
            attrs["max_attempts"] = None  # max_retries N now says maxAttempts N + 1
        return attrs


class QueueCreateSerializer(QueuePatchSerializer):
    # As sent: " a" or "abc\n" is not a queue name (API.md), so nothing is trimmed.
    name = StrictCharField(max_length=100, trim_whitespace=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        attrs.pop("max_attempts", None)  # a new queue has none: max_retries + 1
        return attrs

    def validate_name(self, value: str) -> str:
        if not is_queue_name(value):
            raise serializers.ValidationError(
                "Use 1 to 100 of A-Z a-z 0-9 _ . - , starting with a letter or digit."
            )
        return value
