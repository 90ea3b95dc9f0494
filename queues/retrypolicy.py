"""A retry policy (API-cloudtasks.md "Queue", "Retries"): a queue's native
`retry_policy`, and the backoff and limits of a Cloud Tasks `retryConfig`.

One form for both: the native API stores and shows it as
`{"min_backoff_seconds", "max_backoff_seconds", "max_doublings",
"max_retry_duration_seconds"}`; a task's own policy adds `max_attempts`
(-1 unlimited, or 1..10000).  The formula that reads it is
`tasks.retry.policy_delay_seconds`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from taskforge.conf import conf

MAX_BACKOFF_SECONDS = 86_400.0
MAX_DOUBLINGS = 32
MAX_RETRY_DURATION_SECONDS = 2_592_000.0
MAX_ATTEMPTS = 10_000
UNLIMITED_ATTEMPTS = -1

# Cloud Tasks' defaults for a queue created over /v2.
DEFAULT_MIN_BACKOFF = 0.1
DEFAULT_MAX_BACKOFF = 3600.0
DEFAULT_DOUBLINGS = 16
DEFAULT_MAX_ATTEMPTS = 100

FIELDS = (
    "min_backoff_seconds",
    "max_backoff_seconds",
    "max_doublings",
    "max_retry_duration_seconds",
)


class InvalidPolicy(ValueError):
    """A retry policy out of its ranges; `field` names the sub-field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    min_backoff_seconds: float = DEFAULT_MIN_BACKOFF
    max_backoff_seconds: float = DEFAULT_MAX_BACKOFF
    max_doublings: int = DEFAULT_DOUBLINGS
    max_retry_duration_seconds: float = 0.0

    def as_json(self) -> dict[str, Any]:
        return {name: _number(value) for name, value in asdict(self).items()}


def _number(value: float) -> float | int:
    """3600.0 shows as 3600, 0.1 as 0.1."""
    return int(value) if float(value).is_integer() else value


def seconds(value: Any, field: str, *, limit: float) -> float:
    """A duration in seconds within 0..limit, kept to the millisecond.

    Raises:
        InvalidPolicy: not a number in range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidPolicy(field, f"'{field}' must be a number of seconds.")
    if not 0 <= value <= limit:
        raise InvalidPolicy(field, f"'{field}' must be between 0 and {_number(limit)} seconds.")
    return round(float(value), 3)


def doublings(value: Any, field: str = "max_doublings") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DOUBLINGS:
        raise InvalidPolicy(field, f"'{field}' must be an integer from 0 to {MAX_DOUBLINGS}.")
    return value


def checked(policy: RetryPolicy, *, min_field: str = "min_backoff_seconds") -> RetryPolicy:
    """The policy, if its minimum backoff is not above its maximum.

    Raises:
        InvalidPolicy: min > max (named `min_field`).
    """
    if policy.min_backoff_seconds > policy.max_backoff_seconds:
        raise InvalidPolicy(min_field, "The minimum backoff may not exceed the maximum backoff.")
    return policy


def parse(value: Any) -> RetryPolicy | None:
    """A native `retry_policy` body value: null, or an object of FIELDS (missing ones default).

    Raises:
        InvalidPolicy: not an object, an unknown sub-field, or a value out of range.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidPolicy("retry_policy", "'retry_policy' must be an object or null.")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise InvalidPolicy(unknown[0], f"Unknown field {unknown[0]!r}.")
    fields: dict[str, Any] = {}
    for name in ("min_backoff_seconds", "max_backoff_seconds"):
        if name in value:
            fields[name] = seconds(value[name], name, limit=MAX_BACKOFF_SECONDS)
    if "max_doublings" in value:
        fields["max_doublings"] = doublings(value["max_doublings"])
    if "max_retry_duration_seconds" in value:
        fields["max_retry_duration_seconds"] = seconds(
            value["max_retry_duration_seconds"],
            "max_retry_duration_seconds",
            limit=MAX_RETRY_DURATION_SECONDS,
        )
    return checked(RetryPolicy(**fields))


def of(stored: Any) -> RetryPolicy | None:
    """The policy a stored `retry_policy` (JSON) holds; None for none."""
    if not stored:
        return None
    return RetryPolicy(**{name: stored[name] for name in FIELDS if name in stored})


def deployment() -> RetryPolicy:
    """What a queue without a policy shows over /v2: the deployment's base and cap."""
    return RetryPolicy(
        min_backoff_seconds=conf.RETRY_BASE_MS / 1000,
        max_backoff_seconds=conf.RETRY_MAX_DELAY_MS / 1000,
        max_doublings=DEFAULT_DOUBLINGS,
        max_retry_duration_seconds=0.0,
    )


def max_retries_of(max_attempts: int) -> int | None:
    """The native `max_retries` a Cloud Tasks maxAttempts reads as: None when
    unlimited or over 101 (API-cloudtasks.md)."""
    if max_attempts == UNLIMITED_ATTEMPTS or max_attempts > 101:
        return None
    return max_attempts - 1
