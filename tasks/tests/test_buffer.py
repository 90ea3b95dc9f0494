from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
import redis

from tasks import buffer as buffer_module
from tasks.buffer import (
    WATCH_MARGIN_MS,
    Admission,
    Buffer,
    bucket_key,
    counted_key,
    epoch_key,
    ready_key,
    running_key,
    score,
    wake_channel,
    watched_key,
)

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


def test_keys__running_count_shares_the_queue_hash_tag() -> None:
    assert running_key("abc") == "tf:{abc}:running"
    assert counted_key("abc") == "tf:{abc}:counted"


def test_take__capped_queue_without_a_count_takes_nothing(buffer: Buffer) -> None:
    buffer.push("q", [("a", 1)])
    taken = buffer.take("q", 10, None, 2)
    assert (taken.ids, taken.uncounted, taken.full) == ([], True, False)
    assert buffer.size("q") == 1


def test_take__cap_bounds_what_is_taken_until_released(buffer: Buffer) -> None:
    buffer.push("q", [(f"t{i}", i) for i in range(5)])
    buffer.count("q", [])
    assert buffer.take("q", 10, None, 2).ids == ["t0", "t1"]
    full = buffer.take("q", 10, None, 2)
    assert (full.ids, full.full) == ([], True)
    assert buffer.release("q", ["t0", "t0", "nope"], 2) == 1  # idempotent
    assert buffer.take("q", 10, None, 2).ids == ["t2"]
    assert sorted(buffer.running("q")) == ["t1", "t2"]


def test_take__fractional_rate_spaces_hand_outs(buffer: Buffer) -> None:
    """A rate of 0.5 (set over the Cloud Tasks API) hands out one task, then one
    2 s later: a bucket of max(1, ceil(R)) tokens, not of R (which never holds one)."""
    buffer.push("q", [(f"t{i}", i) for i in range(5)])
    assert buffer.take("q", 5, 0.5).ids == ["t0"]
    second = buffer.take("q", 5, 0.5)
    assert second.ids == []
    assert 1900 <= second.wait_ms <= 2000


def test_take__cap_and_rate_limit_together(buffer: Buffer) -> None:
    buffer.push("q", [(f"t{i}", i) for i in range(10)])
    buffer.count("q", [])
    assert buffer.take("q", 10, 3, 5).ids == ["t0", "t1", "t2"]  # three tokens
    assert buffer.take("q", 10, 3, 5).wait_ms > 0


def test_take__an_id_still_holding_a_slot_waits_for_its_release(buffer: Buffer) -> None:
    buffer.push("q", [("a", 1), ("b", 2)])
    buffer.count("q", ["a"])  # a's previous attempt is not released yet
    assert buffer.take("q", 1, None, 5).ids == ["b"]
    assert buffer.take("q", 1, None, 5).ids == []
    assert buffer.size("q") == 1  # a went back with its place
    buffer.release("q", ["a"], 5)
    assert buffer.take("q", 1, None, 5).ids == ["a"]


def test_release__wakes_claims_only_when_the_queue_was_full(
    buffer: Buffer, redis_client: redis.Redis
) -> None:
    buffer.count("q", ["a", "b", "c"])
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(wake_channel())
    pubsub.get_message(timeout=1)
    buffer.release("q", ["a"], 5)  # 3 of 5: nobody waits for a slot
    assert pubsub.get_message(timeout=0.2) is None
    buffer.release("q", ["b"], 2)  # 2 of 2: a claim may wait
    message = pubsub.get_message(timeout=1)
    assert message is not None and message["data"] == b"q:1"
    pubsub.close()


def test_prune__frees_only_slots_taken_before_the_cutoff(buffer: Buffer) -> None:
    buffer.count("q", ["old"])
    cutoff = buffer.now_ms() + 1
    time.sleep(0.01)
    buffer.count("q", ["new"])
    assert buffer.running("q", before_ms=cutoff) == ["old"]
    assert buffer.prune("q", ["old", "new"], before_ms=cutoff) == 1
    assert buffer.running("q") == ["new"]


def test_start_counting__one_caller_at_a_time(buffer: Buffer) -> None:
    assert buffer.start_counting("q") is True
    assert buffer.start_counting("q") is False
    buffer.done_counting("q")
    assert buffer.start_counting("q") is True


def test_admit__into_the_buffer_or_pending_with_or_without_a_wake_up(
    buffer: Buffer, redis_client: redis.Redis, settings: Any
) -> None:
    settings.TASKFORGE_BUFFER_SIZE = 2
    assert buffer.admit("adm", 2, 500) is Admission.BUFFER
    buffer.push("adm", [("a", 100), ("b", 300)])
    assert buffer.admit("adm", 1, 500) is Admission.WAKE  # full, and nobody watches it
    buffer.watch("adm")
    assert buffer.admit("adm", 1, 300) is Admission.QUIET  # no more urgent than "b"
    assert buffer.admit("adm", 1, 299) is Admission.WAKE  # more urgent: to be swapped in
    redis_client.set(watched_key("adm"), "1", px=WATCH_MARGIN_MS - 200)  # a watch ending
    assert buffer.admit("adm", 1, 500) is Admission.WAKE


def test_admit__without_a_round_trip_while_the_last_push_left_room_twice_over(
    buffer: Buffer, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.TASKFORGE_BUFFER_SIZE = 10
    buffer.push("roomy", [("a", 100)], wake=True)  # the buffer holds 1 of 10

    def asked(**kwargs: Any) -> int:
        raise AssertionError("admit asked Redis")

    monkeypatch.setattr(buffer, "_admit", asked)
    assert buffer.admit("roomy", 4, 500) is Admission.BUFFER  # 1 + 4 <= 10 // 2
    with pytest.raises(AssertionError):
        buffer.admit("roomy", 5, 500)  # 1 + 5: past half the bound, Redis says
    with pytest.raises(AssertionError):
        buffer.admit("other", 1, 500)  # nothing seen of that queue
    monkeypatch.setattr(buffer_module, "SEEN_SIZE_SECONDS", 0.0)
    with pytest.raises(AssertionError):
        buffer.admit("roomy", 1, 500)  # seen too long ago
