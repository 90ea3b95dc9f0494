"""The retry rule of API.md, in one place."""

from __future__ import annotations

import random
from datetime import datetime, timedelta

from taskforge.conf import conf

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
