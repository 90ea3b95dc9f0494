"""Fairness keys end to end (API.md "Fairness keys (v1.2)"): the API, the loops and a
push process as real processes (tests/service.py), workers and producers over HTTP.

One service for the module (a push process included); each test its own queues.
Backlogs are made with the batch endpoint; the buffer holds 1,000 tasks per key,
so a backlog of 10,000 is mostly `pending` in Postgres and the dispatcher refills
each key's buffer as it drains.
"""

from __future__ import annotations

import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection

from taskforge.api.models import ApiKey
from tasks.models import Task
from tests.pushtarget import Answer, Request, Target
from tests.service import Api, Service, api_process, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def fair_service(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None
) -> Iterator[Service]:
    svc = Service(
        tmp_path_factory.mktemp("fairness"),
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "fairness-secret-key",
            "TASKFORGE_PUSH_ALLOWED_NETWORKS": "127.0.0.0/8",
            # The default bound of each key's buffer (FAST_KNOBS has 200): a claim loop
            # that drains a key faster than the dispatcher's polls refill it would
            # measure the dispatcher on a busy machine, not the order.
            "TASKFORGE_BUFFER_SIZE": "1000",
            # No lease ends under a test's feet on a busy machine.
            "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS": "30",
        },
        extra_loops=("pusher",),
    )
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()
        print(svc.tails())


class Clients:
    def __init__(self, svc: Service) -> None:
        keys = {
            role: ApiKey.issue(name=f"fair-{role}", role=role)[1]
            for role in ("admin", "producer", "worker")
        }
        self.admin = Api(svc.base_url, keys["admin"])
        self.producer = Api(svc.base_url, keys["producer"])
        self.worker = Api(svc.base_url, keys["worker"])
        self.worker_key = keys["worker"]

    def enqueue(self, queue: str, bodies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        tasks: list[dict[str, Any]] = []
        for start in range(0, len(bodies), 1000):
            answer = self.producer.ok(
                "POST", f"/queues/{queue}/tasks/batch", {"tasks": bodies[start : start + 1000]}
            )
            tasks += answer["results"]
        return tasks

    def claim(
        self,
        queue: str,
        max_tasks: int = 10,
        wait: float = 0.0,
        worker: str = "w1",
        api: Api | None = None,
    ) -> list[dict[str, Any]]:
        body = {
            "worker_id": worker,
            "queues": [queue],
            "max_tasks": max_tasks,
            "wait_seconds": wait,
        }
        answer = (api or self.worker).ok("POST", "/workers/claim", body, timeout=wait + 30)
        tasks: list[dict[str, Any]] = answer["tasks"]
        return tasks

    def ack(self, task: dict[str, Any], worker: str = "w1") -> None:
        self.worker.ok(
            "POST",
            "/workers/ack",
            {"worker_id": worker, "task_id": task["id"], "attempt": task["attempts"]},
        )


@pytest.fixture
def api(fair_service: Service, redis_client: redis.Redis) -> Clients:
    return Clients(fair_service)


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _buffered(queue: str, key: str | None) -> int:
    return Task.objects.filter(queue__name=queue, fairness_key=key, status="claimed").count()


def test_backlog__b_served_within_220_hand_outs_behind_a_10000(api: Clients) -> None:
    """A enqueues 10,000, then B 100 (weight 1 each, claims of 10): all of B's within
    the next 220 hand-outs, B's k-th within 2k + 20."""
    api.admin.ok("POST", "/queues", {"name": "starve"})
    api.enqueue("starve", [{"payload": {"n": n}, "fairness_key": "A"} for n in range(10_000)])
    _wait(lambda: _buffered("starve", "A") >= 1000, 20, "A's buffer filled")
    b_ids = {
        t["id"]
        for t in api.enqueue(
            "starve", [{"payload": {"n": n}, "fairness_key": "B"} for n in range(100)]
        )
    }
    time.sleep(0.2)  # one scheduler tick (FAST_KNOBS)
    order: list[str] = []
    while b_ids - set(order):
        tasks = api.claim("starve", 10)
        assert tasks, "nothing handed out while B has due tasks"
        order += [t["id"] for t in tasks]
        assert len(order) <= 400
    positions = [i + 1 for i, task_id in enumerate(order) if task_id in b_ids]
    print(f"B's 100 handed out by hand-out {positions[-1]} (bound 220); first at {positions[0]}")
    assert positions[-1] <= 220
    for k, position in enumerate(positions, start=1):
        assert position <= 2 * k + 20, (k, position)


def test_weights__a_weight_of_3_gets_three_quarters(api: Clients) -> None:
    api.admin.ok("POST", "/queues", {"name": "weighted", "key_weights": {"A": 3}})
    api.enqueue("weighted", [{"payload": n, "fairness_key": "A"} for n in range(1500)])
    api.enqueue("weighted", [{"payload": n, "fairness_key": "B"} for n in range(700)])
    _wait(lambda: _buffered("weighted", "A") >= 1000, 20, "A's buffer filled")
    keys: list[str] = []
    while len(keys) < 1200:
        tasks = api.claim("weighted", 10)
        assert tasks
        keys += [t["fairness_key"] for t in tasks]
    shares = [
        sum(1 for k in keys[start : start + 800] if k == "A") / 800 for start in range(0, 401, 50)
    ]
    print(f"A's share of each 800 consecutive hand-outs: {min(shares):.3f}..{max(shares):.3f}")
    assert all(0.65 <= share <= 0.85 for share in shares), shares


def test_priority__before_fairness_across_keys(api: Clients) -> None:
    api.admin.ok("POST", "/queues", {"name": "prio"})
    api.enqueue("prio", [{"payload": n, "fairness_key": "A", "priority": 5} for n in range(1200)])
    api.enqueue("prio", [{"payload": n, "priority": 3} for n in range(5)])
    api.enqueue("prio", [{"payload": n, "fairness_key": "B", "priority": 1} for n in range(5)])
    _wait(
        lambda: Task.objects.filter(queue__name="prio", status="claimed").count() >= 210,
        20,
        "buffered",
    )
    tasks = api.claim("prio", 10) + api.claim("prio", 10)
    assert [t["priority"] for t in tasks] == [1] * 5 + [3] * 5 + [5] * 10
    assert {t["fairness_key"] for t in tasks[:5]} == {"B"}
    assert {t["fairness_key"] for t in tasks[5:10]} == {None}


def test_key_cap__held_key_blocks_no_other_and_a_waiting_claim_is_woken(api: Clients) -> None:
    queue = api.admin.ok("POST", "/queues", {"name": "kcap", "key_max_concurrency": 1})
    assert queue["key_max_concurrency"] == 1
    api.enqueue("kcap", [{"payload": n, "fairness_key": "A"} for n in range(3)])
    [first] = api.claim("kcap", 10)
    assert first["fairness_key"] == "A"
    assert api.claim("kcap", 10) == []  # A at its cap
    api.enqueue("kcap", [{"payload": 0, "fairness_key": "B"}])
    [other] = api.claim("kcap", 10)
    assert other["fairness_key"] == "B"  # A's cap holds back A only
    api.ack(other)
    got: list[list[dict[str, Any]]] = []
    began = time.monotonic()
    waiter = threading.Thread(
        target=lambda: got.append(api.claim("kcap", 10, wait=10, worker="w2"))
    )
    waiter.start()
    time.sleep(0.5)  # the claim waits: every key with tasks is at its cap
    assert not got
    freed = time.monotonic()
    api.ack(first)
    waiter.join(15)
    assert got, "no answer"
    assert [t["fairness_key"] for t in got[0]] == ["A"]
    print(f"waiting claim answered {time.monotonic() - freed:.3f}s after the ack")
    assert time.monotonic() - freed < 2.0
    assert time.monotonic() - began < 10


def test_key_rate__across_two_api_processes(api: Clients, tmp_path: Path) -> None:
    """key_rate_limit 4: greedy claims through two API processes hand out at most
    R*T + max(1, R) tasks of each key over any T, and a key held back holds no other."""
    rate = 4
    api.admin.ok("POST", "/queues", {"name": "krate", "key_rate_limit": rate})
    api.enqueue(
        "krate", [{"payload": n, "fairness_key": key} for key in ("A", "B") for n in range(200)]
    )
    api.enqueue("krate", [{"payload": n} for n in range(30)])  # the anonymous key: no rate
    from django.conf import settings as django_settings

    with api_process(tmp_path, {"SECRET_KEY": django_settings.SECRET_KEY}) as second:
        other = Api(second.base_url, api.worker_key)
        times: dict[str | None, list[float]] = {"A": [], "B": [], None: []}
        lock = threading.Lock()
        stop = time.monotonic() + 3.0

        def greedy(client: Api, worker: str) -> None:
            while time.monotonic() < stop:
                for task in api.claim("krate", 10, wait=0.5, worker=worker, api=client):
                    with lock:
                        times[task["fairness_key"]].append(time.monotonic())

        threads = [
            threading.Thread(target=greedy, args=(client, f"g{i}"))
            for i, client in enumerate([api.worker, other, api.worker, other])
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(times[None]) == 30  # the anonymous key is not rate limited
    for key in ("A", "B"):
        stamps = sorted(times[key])
        worst = max(
            sum(1 for t in stamps if start <= t <= start + window) - rate * window
            for start in stamps
            for window in (0.5, 1.0, 2.0)
        )
        print(f"key {key}: {len(stamps)} hand-outs in 3 s; worst excess over R*T: {worst:.2f}")
        assert worst <= max(1, rate) + 1  # + 1: the client's clock is not Redis's
        assert len(stamps) >= rate * 2  # held back by its own rate only


def test_push_queue__takes_turns_by_key(api: Clients) -> None:
    arrived: list[str] = []
    lock = threading.Lock()

    def script(request: Request) -> Answer:
        with lock:
            arrived.append(request.json()["key"])
        return Answer(200, b"{}")

    with Target(script) as target:
        api.admin.ok(
            "POST",
            "/queues",
            {
                "name": "pushfair",
                "max_concurrency": 2,
                "push": {"url": target.url()},
                "paused": True,
            },
        )
        api.enqueue(
            "pushfair", [{"payload": {"key": "A"}, "fairness_key": "A"} for _ in range(300)]
        )
        api.enqueue("pushfair", [{"payload": {"key": "B"}, "fairness_key": "B"} for _ in range(20)])
        api.admin.ok("POST", "/queues/pushfair/resume")
        _wait(lambda: arrived.count("B") == 20, 30, "B's 20 delivered")
    positions = [i + 1 for i, key in enumerate(arrived) if key == "B"]
    print(f"push: B's 20 delivered by delivery {positions[-1]} of {len(arrived)}")
    for k, position in enumerate(positions, start=1):
        # A turn of a push queue is at most min(max_concurrency, 10) deliveries; + 2 in flight.
        assert position <= 2 * k + 2 * 2 + 2, (k, position)


def test_ten_thousand_keys__each_handed_out_once_and_counted(api: Clients) -> None:
    api.admin.ok("POST", "/queues", {"name": "many"})
    began = time.monotonic()
    created = api.enqueue(
        "many", [{"payload": n, "fairness_key": f"k{n:05d}"} for n in range(10_000)]
    )
    print(f"10,000 keys enqueued in {time.monotonic() - began:.2f}s")
    assert created[0]["fairness_key"] == "k00000"
    stats = api.producer.ok("GET", "/queues/many/stats")
    assert stats["keys"] == 10_000
    seen: Counter[str] = Counter()
    began = time.monotonic()
    while sum(seen.values()) < 10_000:
        tasks = api.claim("many", 100)
        assert tasks
        seen.update(t["id"] for t in tasks)
    print(f"10,000 keys (one task each) handed out in {time.monotonic() - began:.2f}s")
    assert max(seen.values()) == 1 and len(seen) == 10_000


def test_keys_endpoint__pages_in_code_point_order(api: Clients) -> None:
    api.admin.ok("POST", "/queues", {"name": "keyed"})
    keys = ["b", "a", "Z", "é", "a b", "zz"] + [f"k{n:02d}" for n in range(20)]
    api.enqueue("keyed", [{"payload": 0, "fairness_key": key} for key in keys for _ in range(2)])
    api.enqueue("keyed", [{"payload": 0}])
    api.enqueue("keyed", [{"payload": 0, "fairness_key": "later", "delay_seconds": 3600}])
    rows: list[dict[str, Any]] = []
    path = "/queues/keyed/keys?limit=7"
    pages = 0
    while path:
        page = api.producer.ok("GET", path)
        assert len(page["results"]) <= 7
        rows += page["results"]
        pages += 1
        parts = urllib.parse.urlsplit(page["next"] or "")
        path = f"{parts.path}?{parts.query}" if page["next"] else ""
    assert pages == 4
    assert [row["key"] for row in rows] == [None, *sorted([*keys, "later"])]
    by_key = {row["key"]: row for row in rows}
    assert by_key["a"]["pending"] == 2 and by_key["a"]["executing"] == 0
    assert by_key["later"]["pending"] == 0
    assert by_key[None]["pending"] == 1
    filtered = api.producer.ok("GET", "/queues/keyed/keys?min_pending=2&limit=500")["results"]
    assert [row["key"] for row in filtered] == sorted(keys)
    assert api.producer.call("GET", "/queues/keyed/keys?min_pending=-1")[0] == 400
    assert api.producer.call("GET", "/queues/keyed/keys?min_pending=x")[0] == 400
    tasks = api.producer.ok("GET", "/queues/keyed/tasks?fairness_key=a")["results"]
    assert len(tasks) == 2 and {t["fairness_key"] for t in tasks} == {"a"}
    anonymous = api.producer.ok("GET", "/queues/keyed/tasks?fairness_key=")["results"]
    assert len(anonymous) == 1 and anonymous[0]["fairness_key"] is None
    assert api.producer.ok("GET", "/queues/keyed/stats")["keys"] == len(keys) + 2


def test_fault__redis_flushed_mid_run_with_1000_keys(
    api: Clients, redis_client: redis.Redis, fair_service: Service
) -> None:
    """FLUSHDB while 8 workers drain 1,000 keys capped at 2 each: every task done once
    (attempt 1, handed out once), and no key above its cap outside the reconcile
    interval after the flush (the rebuild of the per-key counts from Postgres)."""
    cap = 2
    api.admin.ok("POST", "/queues", {"name": "flushed", "key_max_concurrency": cap})
    # 20 busy keys (40 tasks each) that meet their cap, among 980 of 2 tasks.
    bodies = [{"payload": n, "fairness_key": f"t{k:04d}"} for k in range(20) for n in range(40)]
    bodies += [
        {"payload": n, "fairness_key": f"t{k:04d}"} for k in range(20, 1000) for n in range(2)
    ]
    api.enqueue("flushed", bodies)
    total = len(bodies)
    handed: Counter[str] = Counter()
    lock = threading.Lock()
    done = threading.Event()
    samples: list[tuple[float, int]] = []  # (when, most executing of one key)

    def work(n: int) -> None:
        while not done.is_set():
            tasks = api.claim("flushed", 10, wait=1, worker=f"w{n}")
            with lock:
                handed.update(t["id"] for t in tasks)
            time.sleep(0.05)
            for task in tasks:
                api.ack(task, worker=f"w{n}")

    def sample() -> None:
        while not done.is_set():
            counts = Counter(
                Task.objects.filter(queue__name="flushed", status="executing").values_list(
                    "fairness_key", flat=True
                )
            )
            samples.append((time.monotonic(), max(counts.values(), default=0)))
            time.sleep(0.02)
        connection.close()

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    threads.append(threading.Thread(target=sample))
    for thread in threads:
        thread.start()
    try:
        _wait(
            lambda: Task.objects.filter(queue__name="flushed", status="done").count() >= total // 4,
            60,
            "a quarter done",
        )
        redis_client.flushdb()
        flushed_at = time.monotonic()
        _wait(
            lambda: Task.objects.filter(queue__name="flushed", status="done").count() == total,
            90,
            "every task done",
        )
    finally:
        done.set()
        for thread in threads:
            thread.join(30)
    reconcile = fair_service.knob("BUFFER_RECONCILE_SECONDS")
    assert sum(handed.values()) == total and max(handed.values()) == 1
    attempts = Counter(
        Task.objects.filter(queue__name="flushed").values_list("attempts", flat=True)
    )
    assert attempts == {1: total}
    outside = [most for at, most in samples if not flushed_at <= at <= flushed_at + reconcile + 1]
    inside = [most for at, most in samples if flushed_at <= at <= flushed_at + reconcile + 1]
    print(
        f"{len(samples)} samples; most executing of one key: {max(outside)} "
        f"(within {reconcile + 1}s of the flush: {max(inside, default=0)})"
    )
    assert max(outside) <= cap


def test_sdk__carries_the_fairness_fields(api: Clients, fair_service: Service) -> None:
    from taskforge_client import TaskForge, TaskSpec

    admin = api.admin.key or ""
    with TaskForge(fair_service.base_url, admin) as client:
        queue = client.create_queue(
            "sdkfair", key_weights={"A": 2}, key_max_concurrency=3, key_rate_limit=2.5
        )
        assert (queue.key_weights, queue.key_max_concurrency, queue.key_rate_limit) == (
            {"A": 2},
            3,
            2.5,
        )
        changed = client.update_queue("sdkfair", key_weights={}, key_rate_limit=None)
        assert (changed.key_weights, changed.key_max_concurrency, changed.key_rate_limit) == (
            {},
            3,
            None,
        )
        one = client.enqueue("sdkfair", {"n": 1}, fairness_key="A")
        assert one.fairness_key == "A"
        many = client.enqueue_many(
            "sdkfair", [TaskSpec({"n": 2}, fairness_key="B"), {"payload": 3}]
        )
        assert [t.fairness_key for t in many] == ["B", None]
        with client.batcher() as batcher:
            assert batcher.enqueue("sdkfair", {"n": 4}, fairness_key="C").fairness_key == "C"
        assert [k.key for k in client.list_keys("sdkfair")] == [None, "A", "B", "C"]
        assert [k.key for k in client.list_keys("sdkfair", limit=2)] == [None, "A"]
        assert [t.fairness_key for t in client.list_tasks("sdkfair", fairness_key="")] == [None]
        assert client.stats("sdkfair").keys == 4
