"""A Cloud Tasks Queue, seen from a TaskForge queue and back (API-cloudtasks.md "Queue").

One queue, two views: `shown` builds the Queue message of a native queue;
`settings_from` reads a Queue message (with an update mask, or whole) into
the native fields `queues.services` sets.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from cloudtasks import protojson as pj
from cloudtasks.errors import invalid
from queues import retrypolicy
from queues.models import Queue
from queues.retrypolicy import RetryPolicy

QUEUE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,99}$")
STATES = ("STATE_UNSPECIFIED", "RUNNING", "PAUSED", "DISABLED")

MAX_RATE = 500.0
MAX_CONCURRENT = 5000
DEFAULT_RATE = 500.0
DEFAULT_CONCURRENT = 1000

QUEUE_FIELDS = (
    "name",
    "rateLimits",
    "retryConfig",
    "state",
    "purgeTime",
    "stackdriverLoggingConfig",
    "appEngineRoutingOverride",
    "httpTarget",
)
OUTPUT_ONLY = ("state", "purgeTime")
RATE_FIELDS = ("maxDispatchesPerSecond", "maxBurstSize", "maxConcurrentDispatches")
RETRY_FIELDS = ("maxAttempts", "minBackoff", "maxBackoff", "maxDoublings", "maxRetryDuration")

# Update mask paths that may be named, and the leaf fields each one covers.
MASK_PATHS: dict[str, tuple[str, ...]] = {
    "rateLimits": ("rateLimits.maxDispatchesPerSecond", "rateLimits.maxConcurrentDispatches"),
    "retryConfig": tuple(f"retryConfig.{name}" for name in RETRY_FIELDS),
    "stackdriverLoggingConfig": ("stackdriverLoggingConfig.samplingRatio",),
    **{f"rateLimits.{n}": (f"rateLimits.{n}",) for n in RATE_FIELDS if n != "maxBurstSize"},
    **{f"retryConfig.{n}": (f"retryConfig.{n}",) for n in RETRY_FIELDS},
    "stackdriverLoggingConfig.samplingRatio": ("stackdriverLoggingConfig.samplingRatio",),
}
ALL_LEAVES: tuple[str, ...] = (
    *MASK_PATHS["rateLimits"],
    *MASK_PATHS["retryConfig"],
    *MASK_PATHS["stackdriverLoggingConfig"],
)


@dataclass(frozen=True, slots=True)
class Settings:
    """A queue's settings as Cloud Tasks says them."""

    rate: float
    concurrent: int
    max_attempts: int
    policy: RetryPolicy
    sampling: float | None


def defaults() -> Settings:
    return Settings(
        DEFAULT_RATE, DEFAULT_CONCURRENT, retrypolicy.DEFAULT_MAX_ATTEMPTS, RetryPolicy(), None
    )


def current(queue: Queue) -> Settings:
    """A native queue's settings read the Cloud Tasks way (null limits show as 0)."""
    return Settings(
        rate=queue.rate_limit or 0.0,
        concurrent=queue.max_concurrency or 0,
        max_attempts=queue.attempts_allowed,
        policy=retrypolicy.of(queue.retry_policy) or retrypolicy.deployment(),
        sampling=queue.logging_sampling_ratio,
    )


def shown(queue: Queue, name: str, out: pj.Output) -> dict[str, Any]:
    """The Queue message of `queue`, named `name` (the request's project and location)."""
    s = current(queue)
    policy = s.policy
    body: dict[str, Any] = {
        "name": name,
        "rateLimits": {
            "maxDispatchesPerSecond": int(s.rate) if s.rate.is_integer() else s.rate,
            "maxBurstSize": max(1, math.ceil(s.rate)),
            "maxConcurrentDispatches": s.concurrent,
        },
        "retryConfig": {
            "maxAttempts": s.max_attempts,
            "minBackoff": pj.show_duration(policy.min_backoff_seconds),
            "maxBackoff": pj.show_duration(policy.max_backoff_seconds),
            "maxDoublings": policy.max_doublings,
            "maxRetryDuration": pj.show_duration(policy.max_retry_duration_seconds),
        },
        "state": out.enum("PAUSED" if queue.paused else "RUNNING", STATES),
        "stackdriverLoggingConfig": {"samplingRatio": s.sampling or 0},
    }
    if queue.purged_at is not None:
        body["purgeTime"] = pj.show_time(queue.purged_at)
    return body


def mask_leaves(mask: str | None) -> tuple[str, ...]:
    """The leaf fields an `updateMask` names (None: every field).

    Raises:
        RpcError: an unknown, output-only or unsupported path.
    """
    if mask is None or mask == "":
        return ALL_LEAVES
    leaves: list[str] = []
    for raw in mask.split(","):
        path = ".".join(pj.camel(part) for part in raw.strip().split("."))
        if path not in MASK_PATHS:
            raise invalid("updateMask", f"updateMask path {raw.strip()!r} cannot be updated.")
        leaves.extend(MASK_PATHS[path])
    return tuple(dict.fromkeys(leaves))


def read(body: Any, leaves: tuple[str, ...], base: Settings) -> tuple[str | None, Settings]:
    """The body's name and the settings it makes of `base`: each leaf in `leaves`
    set from the body, its default when the body leaves it out or gives 0.

    Raises:
        RpcError: an unknown field, a value of the wrong type or out of range, an
            unsupported feature.
    """
    top = pj.fields(body, "queue.", QUEUE_FIELDS, ignored=OUTPUT_ONLY)
    for unsupported in ("appEngineRoutingOverride", "httpTarget"):
        if unsupported in top:
            raise invalid(f"queue.{unsupported}", f"{unsupported} is not supported by TaskForge.")
    name = pj.string(top["name"], "queue.name") if "name" in top else None
    rates = pj.fields(top.get("rateLimits", {}), "queue.rateLimits.", RATE_FIELDS, ignored=())
    rates.pop("maxBurstSize", None)  # output only
    retry = pj.fields(top.get("retryConfig", {}), "queue.retryConfig.", RETRY_FIELDS)
    logging = pj.fields(
        top.get("stackdriverLoggingConfig", {}),
        "queue.stackdriverLoggingConfig.",
        ("samplingRatio",),
    )
    new = _values(rates, retry, logging)
    default = defaults()
    s = base
    policy = s.policy
    for leaf in leaves:
        field = leaf.split(".")[1]
        value = new.get(leaf)
        if field == "maxDispatchesPerSecond":
            s = replace(s, rate=value or default.rate)
        elif field == "maxConcurrentDispatches":
            s = replace(s, concurrent=value or default.concurrent)
        elif field == "maxAttempts":
            s = replace(s, max_attempts=value or default.max_attempts)
        elif field == "minBackoff":
            policy = replace(
                policy, min_backoff_seconds=value or default.policy.min_backoff_seconds
            )
        elif field == "maxBackoff":
            policy = replace(
                policy, max_backoff_seconds=value or default.policy.max_backoff_seconds
            )
        elif field == "maxDoublings":
            policy = replace(
                policy,
                max_doublings=default.policy.max_doublings if value is None else int(value),
            )
        elif field == "maxRetryDuration":
            policy = replace(policy, max_retry_duration_seconds=value or 0.0)
        elif field == "samplingRatio":
            s = replace(s, sampling=value)
    try:
        policy = retrypolicy.checked(policy)
    except retrypolicy.InvalidPolicy as exc:
        raise invalid("queue.retryConfig.minBackoff", str(exc)) from exc
    return name, replace(s, policy=policy)


def _values(
    rates: dict[str, Any], retry: dict[str, Any], logging: dict[str, Any]
) -> dict[str, Any]:
    values: dict[str, Any] = {}
    if "maxDispatchesPerSecond" in rates:
        field = "queue.rateLimits.maxDispatchesPerSecond"
        rate = pj.number(rates["maxDispatchesPerSecond"], field, 0, MAX_RATE)
        values["rateLimits.maxDispatchesPerSecond"] = rate
    if "maxConcurrentDispatches" in rates:
        field = "queue.rateLimits.maxConcurrentDispatches"
        values["rateLimits.maxConcurrentDispatches"] = pj.integer(
            rates["maxConcurrentDispatches"], field, 0, MAX_CONCURRENT
        )
    if "maxAttempts" in retry:
        field = "queue.retryConfig.maxAttempts"
        attempts = pj.integer(retry["maxAttempts"], field, -1, retrypolicy.MAX_ATTEMPTS)
        values["retryConfig.maxAttempts"] = attempts
    for name in ("minBackoff", "maxBackoff"):
        if name in retry:
            values[f"retryConfig.{name}"] = pj.duration(
                retry[name], f"queue.retryConfig.{name}", 0, retrypolicy.MAX_BACKOFF_SECONDS
            )
    if "maxDoublings" in retry:
        values["retryConfig.maxDoublings"] = pj.integer(
            retry["maxDoublings"], "queue.retryConfig.maxDoublings", 0, retrypolicy.MAX_DOUBLINGS
        )
    if "maxRetryDuration" in retry:
        values["retryConfig.maxRetryDuration"] = pj.duration(
            retry["maxRetryDuration"],
            "queue.retryConfig.maxRetryDuration",
            0,
            retrypolicy.MAX_RETRY_DURATION_SECONDS,
        )
    if "samplingRatio" in logging:
        values["stackdriverLoggingConfig.samplingRatio"] = pj.number(
            logging["samplingRatio"], "queue.stackdriverLoggingConfig.samplingRatio", 0, 1
        )
    return values


def native_fields(s: Settings, leaves: tuple[str, ...]) -> dict[str, Any]:
    """The native fields (queues.services) that the named leaves change."""
    named = set(leaves)
    fields: dict[str, Any] = {}
    if "rateLimits.maxDispatchesPerSecond" in named:
        fields["rate_limit"] = s.rate
    if "rateLimits.maxConcurrentDispatches" in named:
        fields["max_concurrency"] = s.concurrent
    if "retryConfig.maxAttempts" in named:
        attempts = s.max_attempts
        unlimited = attempts == retrypolicy.UNLIMITED_ATTEMPTS
        fields["max_retries"] = 100 if unlimited else min(attempts - 1, 100)
        fields["max_attempts"] = attempts if unlimited or attempts > 101 else None
    if named & set(MASK_PATHS["retryConfig"]) - {"retryConfig.maxAttempts"}:
        fields["retry_policy"] = s.policy.as_json()
    if "stackdriverLoggingConfig.samplingRatio" in named:
        fields["logging_sampling_ratio"] = s.sampling
    return fields
