"""Heartbeat history (workers.heartbeats): a capped Redis list per task."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from workers import heartbeats

T0 = datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=UTC)


def test_record_and_history__newest_first(redis_client: Any) -> None:
    heartbeats.record(["a", "b"], T0)
    heartbeats.record(["a"], T0 + timedelta(seconds=10))

    assert heartbeats.history("a") == [T0 + timedelta(seconds=10), T0]
    assert heartbeats.history("b") == [T0]
    assert heartbeats.history("never") == []


def test_history__since_keeps_the_current_attempt(redis_client: Any) -> None:
    for seconds in (0, 10, 20, 30):
        heartbeats.record(["a"], T0 + timedelta(seconds=seconds))

    claimed_at = T0 + timedelta(seconds=20, microseconds=400)  # same millisecond as a beat

    assert heartbeats.history("a", since=claimed_at) == [
        T0 + timedelta(seconds=30),
        T0 + timedelta(seconds=20),
    ]


def test_record__keeps_the_last_beats_and_expires(redis_client: Any) -> None:
    for n in range(heartbeats.KEEP + 5):
        heartbeats.record(["a"], T0 + timedelta(seconds=n))

    history = heartbeats.history("a")
    assert history is not None and len(history) == heartbeats.KEEP
    assert history[0] == T0 + timedelta(seconds=heartbeats.KEEP + 4)
    ttl = redis_client.ttl(heartbeats.history_key("a"))
    assert 0 < ttl <= heartbeats.TTL_SECONDS


def test_redis_down__record_is_silent_and_history_is_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    monkeypatch.setattr(heartbeats, "get_client", lambda: dead)

    heartbeats.record(["a"], T0)  # must not raise: a heartbeat never fails for this

    assert heartbeats.history("a") is None
    assert "heartbeat history not recorded" in caplog.text
