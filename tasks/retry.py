"""The retry rule of API.md, in one place."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from queues import retrypolicy
from queues.retrypolicy import UNLIMITED_ATTEMPTS, RetryPolicy
from taskforge.conf import conf

if TYPE_CHECKING:
    from tasks.models import Task

_rng = random.SystemRandom()


def backoff_ms(failed_attempt: int) -> int:
    """Delay before the next attempt after failed attempt k (k = 1, 2, ...).

    `min(base * 2^(k-1) + rand(0, base), max_delay)`: exponential growth with
    up to one base of jitter, so tasks that failed together do not all come
    back at the same instant.
    """
    base = conf.RETRY_BASE_MS
    cap = conf.RETRY_MAX_DELAY_MS
    k = max(failed_attempt, 1)
    # 2^(k-1) grows past any cap quickly; stop computing it once it does.
    exponential = cap if k > 64 else base * 2 ** (k - 1)
    return int(min(exponential + _rng.randint(0, base), cap))


def next_attempt_at(now: datetime, failed_attempt: int) -> datetime:
    return now + timedelta(milliseconds=backoff_ms(failed_attempt))


def policy_delay_seconds(policy: RetryPolicy, failed_attempt: int) -> float:
    """Cloud Tasks' delay after failed attempt k under a retry policy (API-cloudtasks.md).

    `min(max_backoff, min_backoff * 2^min(k-1, max_doublings) * max(1, k - max_doublings))`:
    doubling `max_doublings` times, then growing linearly (10s, 20s, 40s, 80s,
    160s, 240s, 300s for 10s / 300s / 3 doublings).  No jitter.
    """
    k = max(failed_attempt, 1)
    doubled = policy.min_backoff_seconds * 2 ** min(k - 1, policy.max_doublings)
    return float(min(policy.max_backoff_seconds, doubled * max(1, k - policy.max_doublings)))


def policy_exhausted(
    *,
    max_attempts: int,
    max_retry_duration_seconds: float,
    attempts: int,
    first_attempt_at: datetime | None,
    now: datetime,
) -> bool:
    """No further attempt under Cloud Tasks' limits (API-cloudtasks.md "Retries").

    The limits that are set must all be reached: `max_attempts` (-1: not set)
    attempts made, and `max_retry_duration_seconds` (0: not set) passed since
    the first attempt.  With neither set, attempts never stop.
    """
    limits = []
    if max_attempts != UNLIMITED_ATTEMPTS:
        limits.append(attempts >= max_attempts)
    if max_retry_duration_seconds > 0:
        started = first_attempt_at or now
        limits.append((now - started).total_seconds() >= max_retry_duration_seconds)
    return bool(limits) and all(limits)


def after_failure(task: Task, now: datetime) -> datetime | None:
    """When the next attempt of `task`, whose attempt just failed, is due; None: no more.

    A task of the Cloud Tasks API follows its own `retry_config`, else its
    queue's `retry_policy` and maxAttempts (API-cloudtasks.md "Retries"); a
    native task stops after `max_retries` + 1 attempts, and waits by its queue's
    `retry_policy` when the queue has one, else by the deployment's rule.
    """
    queue = task.queue
    own = task.retry_config
    policy = retrypolicy.of(own) or retrypolicy.of(queue.retry_policy)
    if task.http_request is not None:
        policy = policy or retrypolicy.deployment()
        max_attempts = (
            int(own.get("max_attempts", queue.attempts_allowed)) if own else queue.attempts_allowed
        )
        if policy_exhausted(
            max_attempts=max_attempts,
            max_retry_duration_seconds=policy.max_retry_duration_seconds,
            attempts=task.attempts,
            first_attempt_at=task.first_claimed_at,
            now=now,
        ):
            return None
    elif task.attempts >= task.max_retries + 1:
        return None
    if policy is None:
        return next_attempt_at(now, task.attempts)
    return now + timedelta(seconds=policy_delay_seconds(policy, task.attempts))
