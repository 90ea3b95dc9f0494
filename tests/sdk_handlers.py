"""Task handlers for the SDK tests (run by in-process and subprocess workers)."""

from __future__ import annotations

import time
from typing import Any

from taskforge_client import Permanent, RetryAfter, Task


def slow(task: Task) -> Any:
    """Sleeps `payload["sleep"]` seconds, then answers what it was given."""
    time.sleep(float(task.payload.get("sleep", 0)))
    return {"slept": task.payload.get("sleep", 0), "attempt": task.attempts}


def double(task: Task) -> Any:
    """`{"n": 3}` -> `{"doubled": 6}`."""
    return {"doubled": task.payload["n"] * 2}


def by_kind(task: Task) -> Any:
    """Fails as `payload["kind"]` says: crash, permanent, retry_after, or succeeds."""
    kind = task.payload.get("kind")
    if kind == "crash":
        raise ValueError(f"boom on attempt {task.attempts}")
    if kind == "permanent":
        raise Permanent("this payload can never work")
    if kind == "retry_after" and task.attempts == 1:
        raise RetryAfter(0.5, "come back later")
    return {"ok": kind}
