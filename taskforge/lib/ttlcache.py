"""A small per-process cache whose entries expire after a fixed time.

For rows the hot paths read on every request (API keys, queues) and that
change rarely: a change made in another process shows within `seconds`.
Thread-safe; reads take no lock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable
from typing import Generic, TypeVar

V = TypeVar("V")


class TTLCache(Generic[V]):
    def __init__(self, seconds: float, max_entries: int = 10_000) -> None:
        self.seconds = seconds
        self.max_entries = max_entries
        self._entries: dict[Hashable, tuple[V, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        """The value stored under `key`, unless it has expired."""
        hit = self._entries.get(key)
        if hit is not None and hit[1] > time.monotonic():
            return hit[0]
        return None

    def put(self, key: Hashable, value: V) -> None:
        with self._lock:
            if len(self._entries) >= self.max_entries:
                self._entries.clear()
            self._entries[key] = (value, time.monotonic() + self.seconds)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
