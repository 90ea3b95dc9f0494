from __future__ import annotations

import time

from taskforge.lib.ttlcache import TTLCache


def test_ttlcache__value_until_it_expires() -> None:
    cache: TTLCache[str] = TTLCache(0.05)
    cache.put("k", "v")
    assert cache.get("k") == "v"
    time.sleep(0.06)
    assert cache.get("k") is None


def test_ttlcache__forget_clear_and_bound() -> None:
    cache: TTLCache[int] = TTLCache(60, max_entries=2)
    cache.put("a", 1)
    cache.forget("a")
    assert cache.get("a") is None
    cache.put("a", 1)
    cache.put("b", 2)
    cache.put("c", 3)  # full: starts over rather than growing
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, None, 3)
    cache.clear()
    assert cache.get("c") is None
