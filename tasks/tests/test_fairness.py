"""The fairness keys' dispatch structure in Redis (tasks.buffer, FAIR_POP): order by
priority, then weighted turns between keys, then the v1 order in a key; caps and rates
per key that park a key out of the way (API.md "Fairness keys (v1.2)")."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tasks.buffer import Buffer, wake_channel
from tasks.fair_buffer import KeyLimits, fair_key, prefix

pytestmark = pytest.mark.usefixtures("redis_client")

W = 10**13


@pytest.fixture
def buffer(redis_client: redis.Redis) -> Buffer:
    return Buffer(redis_client)


def _push(buffer: Buffer, queue: str, key: str, count: int, *, priority: int = 5, at: int = 0):
    ids = [f"{key or 'anon'}-{at + i:06d}" for i in range(count)]
    items = [(task_id, priority * W + at + i) for i, task_id in enumerate(ids)]
    if key:
        buffer.push_keyed(queue, [(task_id, s, key) for task_id, s in items])
    else:
        buffer.push(queue, items)
    return ids


def _drain(buffer: Buffer, queue: str, *, size: int = 10, limits: KeyLimits | None = None):
    out: list[str] = []
    while True:
        ids = buffer.take(queue, size, None, None, keys=limits).ids
        if not ids:
            return out
        out += ids


def _key(task_id: str) -> str:
    return task_id.split("-")[0]


def test_backlog__a_later_key_is_served_within_the_bound(buffer: Buffer) -> None:
    """A holds 1,000 (its buffer's bound), B enqueues 100 after: B's k-th task goes
    out within 2k + 2*max_tasks hand-outs (API.md's measured promise, per claim of 10)."""
    _push(buffer, "q", "A", 1000)
    _push(buffer, "q", "B", 100, at=5000)
    order = _drain(buffer, "q")
    assert len(order) == 1100 and len(set(order)) == 1100
    b_at = [i + 1 for i, task_id in enumerate(order) if _key(task_id) == "B"]
    for k, position in enumerate(b_at, start=1):
        assert position <= 2 * k + 2 * 10, (k, position)
    assert b_at[-1] <= 220
    # Within a key, the v1 order.
    a_order = [t for t in order if _key(t) == "A"]
    assert a_order == sorted(a_order)


def test_weights__share_is_weight_over_the_sum(buffer: Buffer) -> None:
    _push(buffer, "q", "A", 1500)
    _push(buffer, "q", "B", 1000)
    limits = KeyLimits(weights={"A": 3})
    order = _drain(buffer, "q", limits=limits)[:1600]
    for start in range(0, 800, 50):
        window = order[start : start + 800]
        share = sum(1 for t in window if _key(t) == "A") / len(window)
        assert 0.65 <= share <= 0.85, (start, share)


def test_weights__a_change_reaches_the_take(buffer: Buffer) -> None:
    _push(buffer, "q", "A", 400)
    _push(buffer, "q", "B", 400)
    first = Counter(_key(t) for t in _take_n(buffer, "q", 200, KeyLimits(weights={"A": 3})))
    assert first["A"] == pytest.approx(150, abs=10)
    second = Counter(_key(t) for t in _take_n(buffer, "q", 200, KeyLimits(weights={"B": 4})))
    assert second["B"] == pytest.approx(160, abs=10)


def _take_n(buffer: Buffer, queue: str, n: int, limits: KeyLimits | None = None) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        ids = buffer.take(queue, min(10, n - len(out)), None, None, keys=limits).ids
        assert ids
        out += ids
    return out


def test_priority__before_fairness(buffer: Buffer) -> None:
    """Every due task of priority p before any of p+1, across keys, the anonymous key's too."""
    _push(buffer, "q", "A", 50, priority=5)
    _push(buffer, "q", "", 5, priority=3, at=100)
    _push(buffer, "q", "B", 5, priority=1, at=200)
    _push(buffer, "q", "A", 5, priority=1, at=300)
    order = _drain(buffer, "q")
    priorities = [1] * 10 + [3] * 5 + [5] * 50
    by_id = {t: p for t, p in zip(order, priorities, strict=True)}
    assert {_key(t) for t, p in by_id.items() if p == 1} == {"A", "B"}
    assert [_key(t) for t in order[10:15]] == ["anon"] * 5
    # A more urgent task pushed into a key moves the key to its ring.
    _push(buffer, "q2", "A", 20, priority=5)
    _push(buffer, "q2", "B", 20, priority=5, at=100)
    assert len(buffer.take("q2", 4, None, None).ids) == 4
    _push(buffer, "q2", "B", 1, priority=2, at=900)
    assert buffer.take("q2", 1, None, None).ids == ["B-000900"]


def test_anonymous_only__keeps_the_v1_keys(buffer: Buffer, redis_client: redis.Redis) -> None:
    _push(buffer, "q", "", 3)
    assert buffer.take("q", 10, None, None).ids == ["anon-000000", "anon-000001", "anon-000002"]
    assert redis_client.keys("*") == []
    # Once keyed tasks are gone, the mark goes too: the queue hands out as v1 again.
    _push(buffer, "q", "A", 2)
    assert redis_client.exists(fair_key("q"))
    assert len(_drain(buffer, "q")) == 2
    assert not redis_client.exists(fair_key("q"))


def test_key_cap__parks_the_key_and_a_release_brings_it_back(
    buffer: Buffer, redis_client: redis.Redis
) -> None:
    buffer.count("q", [])  # the running count is known (empty)
    limits = KeyLimits(max_concurrency=2)
    _push(buffer, "q", "A", 10)
    _push(buffer, "q", "B", 10, at=100)
    taken = buffer.take("q", 10, None, None, keys=limits)
    assert Counter(_key(t) for t in taken.ids) == {"A": 2, "B": 2}
    nothing = buffer.take("q", 10, None, None, keys=limits)
    assert nothing.ids == [] and nothing.full
    pubsub = redis_client.pubsub()
    pubsub.subscribe(wake_channel())
    pubsub.get_message(timeout=1)  # the subscription's confirmation
    a_ids = [t for t in taken.ids if _key(t) == "A"]
    assert buffer.release("q", a_ids[:1], None, 2) == 1
    woken = _messages(pubsub)
    assert any(m.startswith("q:") for m in woken), woken
    again = buffer.take("q", 10, None, None, keys=limits)
    assert [_key(t) for t in again.ids] == ["A"]
    pubsub.close()


def _messages(pubsub: redis.client.PubSub) -> list[str]:
    out: list[str] = []
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message and message["type"] == "message":
            out.append(bytes(message["data"]).decode())
            break
    return out


def test_key_cap__unknown_count_hands_out_nothing(buffer: Buffer) -> None:
    _push(buffer, "q", "A", 3)
    taken = buffer.take("q", 10, None, None, keys=KeyLimits(max_concurrency=1))
    assert taken.ids == [] and taken.uncounted
    buffer.count("q", ["A-000000"], keys={"A-000000": "A"})
    assert buffer.take("q", 10, None, None, keys=KeyLimits(max_concurrency=2)).ids == ["A-000001"]


def test_key_rate__parks_the_key_without_holding_another(buffer: Buffer) -> None:
    limits = KeyLimits(rate_limit=2)
    _push(buffer, "q", "A", 20)
    _push(buffer, "q", "B", 20, at=100)
    first = buffer.take("q", 10, None, None, keys=limits)
    assert Counter(_key(t) for t in first.ids) == {"A": 2, "B": 2}
    _push(buffer, "q", "C", 1, at=200)
    second = buffer.take("q", 10, None, None, keys=limits)
    assert second.ids == ["C-000200"]
    empty = buffer.take("q", 10, None, None, keys=limits)
    assert empty.ids == [] and 0 < empty.wait_ms <= 500
    time.sleep(empty.wait_ms / 1000 + 0.05)
    assert len(buffer.take("q", 10, None, None, keys=limits).ids) >= 2


def test_drain__returns_every_keyed_id(buffer: Buffer, redis_client: redis.Redis) -> None:
    a = _push(buffer, "q", "A", 5)
    b = _push(buffer, "q", "B", 5, priority=2, at=10)
    n = _push(buffer, "q", "", 2, at=20)
    assert sorted(buffer.pop_all("q")) == sorted(a + b + n)
    assert buffer.take("q", 10, None, None).ids == []
    assert not [k for k in redis_client.keys(f"{prefix('q')}*") if b"ring" in k]


def test_many_keys__each_claim_takes_the_next_keys(buffer: Buffer) -> None:
    """100,000 keys with a task each: hand-outs go key by key, none scanned or lost."""
    keys = [f"k{i:06d}" for i in range(100_000)]
    buffer.push_keyed("q", [(f"{k}-t", 5 * W + i, k) for i, k in enumerate(keys)])
    seen: set[str] = set()
    for _ in range(100):
        ids = buffer.take("q", 10, None, None).ids
        assert len(ids) == 10
        seen.update(ids)
    assert len(seen) == 1000


def test_present_keyed_and_forget(buffer: Buffer, redis_client: redis.Redis) -> None:
    _push(buffer, "q", "A", 2)
    assert buffer.present_keyed("q", [("A-000000", "A"), ("A-000009", "A")]) == [True, False]
    buffer.forget_queue("q")
    assert redis_client.keys(f"{prefix('q')}*") == []


# -- the contract's bound, for random sequences ---------------------------------------

KEYS = ["", "A", "B", "C"]
MAX_TASKS = 10

_ops = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from(KEYS), st.integers(1, 40)),
        st.tuples(st.just("take"), st.integers(1, MAX_TASKS)),
        st.tuples(st.just("ack"), st.integers(1, 10)),
    ),
    min_size=1,
    max_size=60,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=_ops, capped=st.booleans())
def test_property__every_key_served_within_the_bound(
    redis_client: redis.Redis, ops: list[tuple[Any, ...]], capped: bool
) -> None:
    """For random enqueue/claim/ack sequences over a few keys (weight 1 each):

    - every task is handed out once, in the v1 order within its key;
    - with no cap, a key's j-th hand-out since it last had due tasks comes
      within K*j + K*max_tasks hand-outs (K keys; API.md's 2k + 2*max_tasks
      for two keys);
    - with key_max_concurrency 3, no key ever holds more than 3 unacked tasks.
    """
    redis_client.flushdb()
    buffer = Buffer(redis_client)
    limits = KeyLimits(max_concurrency=3) if capped else None
    if capped:
        buffer.count("q", [])
    ready: dict[str, list[str]] = defaultdict(list)
    executing: dict[str, list[str]] = defaultdict(list)
    handed: set[str] = set()
    busy_since: dict[str, tuple[int, int]] = {}  # key -> (hand-outs then, its count then)
    served: Counter[str] = Counter()
    total = 0
    at = 0
    for op in ops:
        if op[0] == "push":
            _, key, count = op
            ids = _push(buffer, "q", key, count, at=at)
            at += count
            if not ready[key] and key not in busy_since:
                busy_since[key] = (total, served[key])
            ready[key] += ids
        elif op[0] == "take":
            ids = buffer.take("q", op[1], None, None, keys=limits).ids
            for task_id in ids:
                key = "" if _key(task_id) == "anon" else _key(task_id)
                assert task_id not in handed
                handed.add(task_id)
                assert ready[key] and ready[key][0] == task_id  # v1 order in the key
                ready[key].pop(0)
                executing[key].append(task_id)
                total += 1
                served[key] += 1
                if capped and key:
                    assert len(executing[key]) <= 3
            if not capped:
                for key, (start, before) in busy_since.items():
                    j = served[key] - before
                    if ready[key]:
                        # The next task of a key with due tasks is not overdue.
                        assert total - start <= len(KEYS) * (j + 1) + len(KEYS) * MAX_TASKS
            for key in [k for k in busy_since if not ready[k]]:
                del busy_since[key]
            if capped and not ids:
                # Nothing handed out: every key with due tasks is at its cap.
                assert all(len(executing[k]) >= 3 for k in KEYS if k and ready[k]), (
                    "a key that may hand out was held back"
                )
                assert not ready[""]
        else:
            n = op[1]
            done = [t for k in KEYS for t in executing[k]][:n]
            for task_id in done:
                key = "" if _key(task_id) == "anon" else _key(task_id)
                executing[key].remove(task_id)
            if capped:
                buffer.release("q", done, None, 3)
    # Nothing lost: ack everything and take the rest.
    while True:
        if capped:
            buffer.release("q", [t for k in KEYS for t in executing[k]], None, 3)
            executing.clear()
        ids = buffer.take("q", MAX_TASKS, None, None, keys=limits).ids
        if not ids:
            break
        for task_id in ids:
            assert task_id not in handed
            handed.add(task_id)
            key = "" if _key(task_id) == "anon" else _key(task_id)
            ready[key].remove(task_id)
            executing[key].append(task_id)
    assert not any(ready.values())
