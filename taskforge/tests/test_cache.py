"""Django's cache (django-redis) against the real Redis of REDIS_URL."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import redis
from django.conf import LazySettings
from django.core.cache import cache


def test_cache__round_trips_through_redis_url_db(redis_client: redis.Redis) -> None:
    snapshot = {"queues": [{"name": "emails", "pending": 3}], "at": "2026-11-30T05:02:45Z"}
    cache.set("snapshot", snapshot, timeout=30)
    assert cache.get("snapshot") == snapshot
    # Stored in REDIS_URL's db under TaskForge's prefix, with its expiry.
    key = cache.make_key("snapshot")
    assert key.startswith("taskforge:")
    assert redis_client.exists(key) == 1
    assert 0 < redis_client.ttl(key) <= 30
    cache.delete("snapshot")
    assert cache.get("snapshot") is None


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_cache__redis_down_misses_instead_of_failing(
    settings: LazySettings, caplog: pytest.LogCaptureFixture
) -> None:
    down: dict[str, Any] = {**settings.CACHES["default"]}
    down["LOCATION"] = f"redis://127.0.0.1:{closed_port()}/0"
    settings.CACHES = {"default": down}
    with caplog.at_level("ERROR", logger="taskforge.cache"):
        cache.set("snapshot", {"queues": []}, timeout=30)
        assert cache.get("snapshot") is None
        assert cache.get("snapshot", default="fallback") == "fallback"
    assert len([r for r in caplog.records if r.name == "taskforge.cache"]) == 3
