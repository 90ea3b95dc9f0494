from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
import redis

from tasks.buffer import Buffer, bucket_key, epoch_key, ready_key, score

pytestmark = pytest.mark.usefixtures("redis_client")


@pytest.fixture
def buffer(redis_client: redis.Redis) -> Buffer:
    return Buffer(redis_client)


def test_keys__share_the_queue_hash_tag() -> None:
    # One hash tag per queue: a script touching both keys stays in one cluster slot.
    assert ready_key("abc") == "tf:{abc}:ready"
    assert bucket_key("abc") == "tf:{abc}:bucket"


def test_score__orders_by_priority_then_time() -> None:
    early = datetime(2026, 1, 1, tzinfo=UTC)
    late = datetime(2090, 1, 1, tzinfo=UTC)
    assert score(1, late) < score(2, early) < score(2, late)
    assert float(score(10, datetime(2200, 1, 1, tzinfo=UTC))).is_integer()


def test_take__pops_in_score_then_id_order(buffer: Buffer) -> None:
    buffer.push("q", [("b", 5), ("a", 5), ("c", 1)])
    assert buffer.take("q", 10, None).ids == ["c", "a", "b"]
    assert buffer.take("q", 10, None).ids == []


def test_push__keeps_an_existing_entry(buffer: Buffer) -> None:
    assert buffer.push("q", [("a", 5)]) == 1
    assert buffer.push("q", [("a", 1), ("b", 2)]) == 1
    assert buffer.take("q", 10, None).ids == ["b", "a"]


def test_take__rate_limit_bounds_hand_outs(buffer: Buffer) -> None:
    """Over any T seconds at most R*T + R tasks leave a queue of rate R."""
    rate = 20
    buffer.push("q", [(f"t{i:04}", i) for i in range(1000)])
    started = time.monotonic()
    taken = 0
    while time.monotonic() - started < 1.0:
        result = buffer.take("q", 100, rate)
        taken += len(result.ids)
        if not result.ids:
            assert result.wait_ms > 0
            time.sleep(result.wait_ms / 1000)
    elapsed = time.monotonic() - started
    assert taken <= rate * elapsed + rate
    assert taken >= rate  # the first burst at least


def test_take__empty_bucket_says_when_to_retry(buffer: Buffer) -> None:
    buffer.push("q", [(f"t{i}", i) for i in range(10)])
    assert len(buffer.take("q", 10, 2).ids) == 2
    result = buffer.take("q", 10, 2)
    assert result.ids == []
    assert 0 < result.wait_ms <= 500


def test_take__empty_set_with_tokens_has_no_wait(buffer: Buffer) -> None:
    assert buffer.take("q", 5, 10).wait_ms == 0


def test_present_worst_and_pops(buffer: Buffer) -> None:
    buffer.push("q", [("a", 1), ("b", 2), ("c", 3)])
    assert buffer.present("q", ["a", "x", "c"]) == [True, False, True]
    assert buffer.worst_score("q") == 3
    assert buffer.pop_worst("q", 1) == ["c"]
    assert buffer.pop_all("q") == ["a", "b"]
    assert buffer.worst_score("q") is None


def test_lost_queues__reports_new_and_lost_queues(
    buffer: Buffer, redis_client: redis.Redis
) -> None:
    assert buffer.lost_queues(["q", "r"]) == ["q", "r"]
    assert buffer.lost_queues(["q", "r"]) == []
    redis_client.delete(epoch_key("r"))
    assert buffer.lost_queues(["q", "r"]) == ["r"]
    redis_client.flushdb()
    assert buffer.lost_queues(["q", "r", "s"]) == ["q", "r", "s"]
    assert buffer.lost_queues([]) == []
