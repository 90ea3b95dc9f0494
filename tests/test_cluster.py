"""TaskForge on a 3-master Redis Cluster (REDIS_URL `redis+cluster://...`).

The module starts its own cluster on free loopback ports from the
`redis-server` on PATH (tests/rediscluster.py) and points the whole service
at it: run_api (two processes) and the three loops get the cluster URL as
REDIS_URL, as an operator would set it.  Then:

- the engine tests of test_faults that only measure the service run again
  unchanged: claim order (priority, then FIFO), the rate limit across both
  API processes (one token bucket in the queue's slot), the long-poll wake-up
  (a PUBLISH on one node reaching the listeners subscribed on another), DLQ
  replay;
- the fleet workload of test_faults (ack, nack, abandon, zombie, slow
  workers) with a FLUSHALL of the node that holds the queue's keys mid-run:
  no task lost, no attempt handed out twice, hand-outs resume at once;
- the buffer and heartbeat history across nodes: a node flushed alone loses
  exactly the epoch marks of its queues; one heartbeat pipeline spans nodes;
- Django's cache on the cluster (taskforge.lib.cache);
- /readyz (every primary answers, cluster_state ok), and a primary that stops:
  /readyz fails and a claim on its queue answers 503, never 500;
- failover: on a cluster with a replica per master, the master holding a
  queue is SIGKILLed mid-run; claims answer 503 until its replica is promoted,
  then every task finishes, none handed out twice.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from django.conf import settings
from django.test import Client
from redis.cluster import RedisCluster as ClusterClient
from rest_framework import status
from rest_framework.test import APIClient

import tasks.buffer
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.health import forget_readiness
from taskforge.lib.cache import RedisClusterCache
from taskforge.lib.redisconn import connect
from tasks.buffer import counted_key, ready_key, running_key
from tasks.fair_buffer import KeyLimits
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory, age_lease
from tests.helpers import assert_error
from tests.rediscluster import RedisCluster, redis_server
from tests.service import Service
from tests.test_faults import (  # noqa: F401  (fixtures and tests run here against the cluster)
    SLACK,
    Clients,
    Fleet,
    Worker,
    api,
    create_queue,
    enqueue,
    knobs,
    mix,
    run_fleet_to_completion,
    service,
    services,
    shared_service,
    status_counts,
    terminal,
    test_claim__priority_order_then_fifo,
    test_dlq__dead_tasks_replayed_to_completion,
    test_long_poll__claim_is_woken_by_the_enqueue,
    test_rate_limit__greedy_workers_get_at_most_r_t_plus_r,
    wait_for,
)
from workers import heartbeats
from workers.watchdog import WatchdogLoop

pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(redis_server() is None, reason="redis-server and redis-cli are not on PATH"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    """A fresh cluster for the module; REDIS_URL names it meanwhile."""
    nodes = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    saved_url = settings.REDIS_URL
    try:
        nodes.start()
        settings.REDIS_URL = nodes.url
        tasks.buffer._client = None  # this process's buffer client, rebuilt on first use
        yield nodes
    finally:
        settings.REDIS_URL = saved_url
        tasks.buffer._client = None
        nodes.stop()


@pytest.fixture(autouse=True)
def redis_client(cluster: RedisCluster) -> Iterator[ClusterClient]:
    """The cluster (overrides the suite's single-db fixture), flushed before and after."""
    client = connect(cluster.url)
    assert isinstance(client, ClusterClient)
    cluster.flushall()
    yield client
    cluster.flushall()
    client.close()


def node_of_queue(cluster: RedisCluster, client: ClusterClient, name: str) -> int:
    """Port of the master holding the queue's keys (its hash tag's slot)."""
    queue = Queue.objects.get(name=name)
    node = client.get_node_from_key(ready_key(queue.id))
    port = int(node.port)
    assert port in cluster.ports
    return port


def test_cluster__queues_spread_over_the_nodes(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    """A sanity check of the setup the other tests rely on: three masters, all slots."""
    assert len(redis_client.get_primaries()) == 3
    ports = {int(redis_client.get_node_from_key(ready_key(str(n))).port) for n in range(30)}
    assert ports == set(cluster.ports)


def test_buffer__a_flushed_node_loses_exactly_its_queues(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    """The per-queue epoch marks tell which queues a node that came back empty held."""
    buffer = tasks.buffer.get_buffer()
    assert isinstance(buffer.client, ClusterClient)
    queue_ids = [f"q{n}" for n in range(30)]
    for queue_id in queue_ids:
        buffer.push(queue_id, [("a", 2), ("b", 1)], wake=True)
    assert buffer.lost_queues(queue_ids) == queue_ids  # new queues
    assert buffer.lost_queues(queue_ids) == []
    port = cluster.ports[1]
    on_node = [q for q in queue_ids if redis_client.get_node_from_key(ready_key(q)).port == port]
    assert 0 < len(on_node) < len(queue_ids)
    cluster.node(port).flushall()
    assert buffer.lost_queues(queue_ids) == on_node
    assert [buffer.size(q) for q in queue_ids] == [0 if q in on_node else 2 for q in queue_ids]
    taken = buffer.take(queue_ids[0], 5, 100)
    assert taken.ids == ([] if queue_ids[0] in on_node else ["b", "a"])


def test_heartbeats__one_pipeline_over_tasks_on_every_node(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    at = datetime(2026, 5, 1, 10, 0, tzinfo=UTC)
    task_ids = [f"t{n}" for n in range(30)]  # hash tags on every node
    heartbeats.record(task_ids, at)
    heartbeats.record(task_ids[:3], at + timedelta(seconds=10))
    assert heartbeats.history("t0") == [at + timedelta(seconds=10), at]
    assert all(heartbeats.history(t) == [at] for t in task_ids[3:])


def test_buffer__forget_running_drops_the_sets_on_every_node(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    buffer = tasks.buffer.get_buffer()
    queue_ids = [f"q{n}" for n in range(30)]  # hash tags on every node
    for queue_id in queue_ids:
        buffer.count(queue_id, ["a", "b"], mark_ttl_ms=0)

    buffer.forget_running(queue_ids[:20])
    buffer.forget_queue(queue_ids[29])

    left = [redis_client.exists(running_key(q), counted_key(q)) for q in queue_ids]
    assert left == [0] * 20 + [2] * 9 + [0]


def test_buffer__fairness_keys_in_one_slot_per_queue_on_every_node(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    """The keyed take, release, sizes and drain name their keys from the queue's prefix:
    one slot per queue, whichever node holds it."""
    buffer = tasks.buffer.get_buffer()
    limits = KeyLimits(max_concurrency=1, rate_limit=50, weights={"A": 2})
    for n in range(12):  # hash tags on every node
        queue_id = f"fq{n}"
        buffer.count(queue_id, [])
        at = 5 * 10**13  # priority 5 (tasks.buffer.score)
        buffer.push_keyed(queue_id, [("a1", at, "A"), ("a2", at + 1, "A"), ("b1", at + 2, "B")])
        taken = buffer.take(queue_id, 10, None, None, keys=limits)
        assert sorted(taken.ids) == ["a1", "b1"]
        assert buffer.release(queue_id, ["a1"], None, 1) == 1
        assert buffer.take(queue_id, 10, None, None, keys=limits).ids == ["a2"]
        assert buffer.key_sizes(queue_id, ["A", "B"]) == [0, 0]
        buffer.push_keyed(queue_id, [("c1", at, "C")])
        assert buffer.pop_all(queue_id) == ["c1"]
        buffer.forget_queue(queue_id)


def test_watchdog__a_tick_reclaims_expired_leases_and_rebuffers_lost_tasks(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    """Regression: on a cluster every watchdog tick failed once an uncapped queue
    existed (its running set was dropped with one two-key DEL in a pipeline, which
    redis-py's cluster pipeline refuses), after the lease check and before the lost
    tasks were put back; the loop backed off to 10 s between ticks, so an expired
    lease was reclaimed up to 10 s late and a zombie worker's late heartbeat could
    win it back."""
    expired = TaskFactory(status=TaskStatus.EXECUTING)
    age_lease(expired.pk, 60)
    lost = TaskFactory(queue=expired.queue, status=TaskStatus.CLAIMED)
    Task.objects.filter(pk=lost.pk).update(
        status_changed_at=datetime.now(UTC) - timedelta(minutes=1)
    )
    key = ready_key(expired.queue_id)
    redis_client.zrem(key, str(lost.pk))  # the buffer lost it
    loop = WatchdogLoop()

    loop._safe_tick()

    assert loop.failures == 0
    # The reclaim's own event: the task's status may already have moved on, when loops
    # of a service another test of this module started promote and buffer it.
    reclaimed = TaskEvent.objects.filter(
        task_id=expired.pk, from_status=TaskStatus.EXECUTING, to_status=TaskStatus.RETRY
    )
    assert reclaimed.exists()
    assert redis_client.zscore(key, str(lost.pk)) is not None


@pytest.mark.timeout(150)
def test_fleet__flushall_of_one_node_mid_run_loses_no_task(
    cluster: RedisCluster,
    redis_client: ClusterClient,
    service: Service,  # noqa: F811  (the fixture imported from test_faults)
    api: Clients,  # noqa: F811
) -> None:
    """8 workers ack, nack, abandon; the node holding the queue loses its data mid-run.

    Every task ends done or dead, no attempt is handed out twice, every ack is
    the holder's, and the task events follow the lifecycle.  The buffered ids
    the flush lost are back within the reconcile time (the dispatcher finds
    the queue's epoch mark gone and re-buffers the queue at once).
    """
    create_queue(api, "spread", max_retries=3)
    total = 500
    reconcile = service.knob("BUFFER_RECONCILE_SECONDS")
    fleet = Fleet(
        api,
        "spread",
        size=8,
        lease_seconds=service.knob("HEARTBEAT_TIMEOUT_SECONDS"),
        policy=mix(
            {
                "ack": 0.72,
                "ack2": 0.04,
                "nack": 0.10,
                "nack_later": 0.03,
                "kill": 0.01,
                "abandon": 0.04,
                "zombie": 0.03,
                "slow": 0.03,
            }
        ),
    )
    restored: list[tuple[int, float]] = []

    def flush() -> None:
        wait_for(lambda: terminal("spread") >= total // 4, 40, "a quarter of the tasks")
        key = ready_key(Queue.objects.get(name="spread").id)
        node = cluster.node(node_of_queue(cluster, redis_client, "spread"))
        lost = [str(member, "ascii") for member in cast(list[bytes], node.zrange(key, 0, -1))]
        node.flushall()
        assert lost, "the buffer held tasks: the flush lost them"

        def back() -> bool:
            # Every lost id still `claimed` in Postgres is buffered again.
            waiting = [
                str(task_id)
                for task_id in Task.objects.filter(
                    pk__in=lost, status=TaskStatus.CLAIMED
                ).values_list("id", flat=True)
            ]
            return not waiting or all(
                score is not None for score in redis_client.zmscore(key, waiting)
            )

        restored.append((len(lost), wait_for(back, 30, "the lost ids to be buffered again")))

    run_fleet_to_completion(
        api, service, "spread", total=total, fleet=fleet, timeout=110, during=flush
    )
    counts = status_counts("spread")
    assert counts["done"] + counts["dead"] == total
    [(lost, took)] = restored
    print(f"FLUSHALL of the queue's node lost {lost} buffered ids; back in {took:.3f}s")
    assert took <= reconcile + SLACK, f"lost ids buffered again only after {took:.2f}s"
    answers = fleet.ledger.answers
    assert answers["ack 409"] + answers["heartbeat 409"] > 0, answers


@pytest.fixture
def replicated(tmp_path: Path, cluster: RedisCluster) -> Iterator[RedisCluster]:
    """Three masters with a replica each; REDIS_URL names it during the test."""
    nodes = RedisCluster(tmp_path / "replicated", replicas=1)
    try:
        nodes.start()
        settings.REDIS_URL = nodes.url
        tasks.buffer._client = None
        yield nodes
    finally:
        settings.REDIS_URL = cluster.url
        tasks.buffer._client = None
        nodes.stop()


@pytest.mark.timeout(120)
def test_failover__a_master_killed_mid_run_its_replica_takes_over(
    replicated: RedisCluster,
    service: Service,  # noqa: F811  (started after `replicated`: on its URL)
    api: Clients,  # noqa: F811
) -> None:
    """SIGKILL the master holding the queue: 503s for a few seconds, then work goes on.

    Workers retry a claim answered 503; every task ends done, no attempt is
    handed out twice, and hand-outs resume once the replica is promoted.
    """
    create_queue(api, "failover")
    total = 300
    enqueue(api, "failover", [{"payload": n} for n in range(total)])
    handouts: Counter[tuple[str, int]] = Counter()
    unavailable: list[float] = []
    errors: list[str] = []
    lock = threading.Lock()
    stop = threading.Event()

    def work(worker: Worker) -> None:
        try:
            while not stop.is_set():
                body = {"worker_id": worker.id, "queues": ["failover"], "max_tasks": 5,
                        "wait_seconds": 0.5}  # fmt: skip
                code, answer = worker.api.call("POST", "/workers/claim", body, timeout=30)
                if code == 503:
                    with lock:
                        unavailable.append(time.monotonic())
                    time.sleep(0.2)
                    continue
                assert code == 200, (code, answer)
                for task in answer["tasks"]:
                    with lock:
                        handouts[(task["id"], task["attempts"])] += 1
                    assert worker.ack(task)[0] == 200
        except Exception as exc:
            errors.append(repr(exc))

    threads = [
        threading.Thread(target=work, args=(api.worker(f"f-{i}"),), daemon=True) for i in range(4)
    ]
    for thread in threads:
        thread.start()
    try:
        wait_for(lambda: terminal("failover") >= total // 3, 30, "a third of the tasks")
        client = connect(replicated.url)
        assert isinstance(client, ClusterClient)
        key = ready_key(Queue.objects.get(name="failover").id)
        port = int(client.get_node_from_key(key).port)
        client.close()
        replicated.kill(port)
        killed_at = time.monotonic()
        took = wait_for(lambda: terminal("failover") == total, 60, "every task done", 0.2)
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=40)
    assert not errors, errors
    assert status_counts("failover") == {"done": total}
    assert max(handouts.values()) == 1, [k for k, n in handouts.items() if n > 1][:5]
    outage = [t - killed_at for t in unavailable if t >= killed_at]
    print(f"after the kill: {len(outage)} claims answered 503, last at "
          f"{max(outage, default=0):.1f}s; all done {took:.1f}s after")  # fmt: skip
    # cluster-node-timeout 2 s, then the election: seconds, not the whole run.
    assert max(outage, default=0) < 15, f"503s for {max(outage):.1f}s after the kill"
    service.assert_running()


def test_cache__round_trips_across_slots_and_clears_only_its_keys(
    cluster: RedisCluster, redis_client: ClusterClient
) -> None:
    cache = RedisClusterCache([cluster.url], {"KEY_PREFIX": "taskforge", "TIMEOUT": 30})
    snapshot = {"queues": [{"name": "emails", "pending": 3}]}
    cache.set("snapshot", snapshot, timeout=30)
    assert cache.get("snapshot") == snapshot
    key = cache.make_key("snapshot")
    assert key == "taskforge:1:snapshot"
    assert 0 < redis_client.ttl(key) <= 30
    many = {f"k{n}": n for n in range(20)}  # keys on every node
    cache.set_many(many)
    assert cache.get_many([*many, "absent"]) == many
    assert cache.add("k1", "other") is False
    assert cache.add("fresh", 1) is True
    redis_client.set("tf:{q}:ready-like", "kept")
    cache.clear()
    assert cache.get_many(list(many)) == {}
    assert redis_client.get("tf:{q}:ready-like") == b"kept"
    cache.delete_many(["fresh"])
    assert cache.get("fresh", default="gone") == "gone"


def test_cache__incr_is_atomic_across_threads(cluster: RedisCluster) -> None:
    cache = RedisClusterCache([cluster.url], {"KEY_PREFIX": "taskforge"})
    cache.set("revoked", 5)
    assert cache.get("revoked") == 5
    threads = [
        threading.Thread(target=lambda: [cache.incr("revoked") for _ in range(50)])
        for _ in range(4)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert cache.get("revoked") == 205
    assert cache.decr("revoked", 5) == 200
    with pytest.raises(ValueError):
        cache.incr("absent")
    cache.set("flag", True)
    assert cache.get("flag") is True


def test_cache__cluster_unreachable_misses_instead_of_failing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    closed = RedisCluster(tmp_path)  # ports found free, nothing started on them
    cache = RedisClusterCache([closed.url], {"KEY_PREFIX": "taskforge"})
    with caplog.at_level("ERROR", logger="taskforge.cache"):
        cache.set("snapshot", {"queues": []}, timeout=30)
        assert cache.get("snapshot", default="fallback") == "fallback"
    assert len([r for r in caplog.records if r.name == "taskforge.cache"]) == 2


def test_readyz__ok_when_every_primary_answers(cluster: RedisCluster) -> None:
    forget_readiness()
    response = Client().get("/readyz")
    assert response.status_code == status.HTTP_200_OK
    assert response.json() == {"status": "ok", "checks": {"postgres": "ok", "redis": "ok"}}


@pytest.mark.timeout(60)
def test_node_down__readyz_fails_claims_are_unavailable_enqueues_work(
    tmp_path: Path, settings: Any, worker_client: APIClient, producer_client: APIClient
) -> None:
    """A primary without a replica stops: 503 `unavailable`, never a 500; enqueues go on."""
    own = RedisCluster(tmp_path)
    own.start()
    try:
        settings.REDIS_URL = own.url
        tasks.buffer._client = None
        queue = QueueFactory()
        client = connect(own.url)
        assert isinstance(client, ClusterClient)
        port = int(client.get_node_from_key(ready_key(queue.id)).port)
        client.close()
        own.processes[port].terminate()
        own.processes[port].wait(timeout=10)

        forget_readiness()
        readyz = Client().get("/readyz")
        assert readyz.status_code == status.HTTP_503_SERVICE_UNAVAILABLE
        assert readyz.json()["checks"] == {"postgres": "ok", "redis": "failed"}
        claim = worker_client.post(
            "/workers/claim",
            {"worker_id": "w-1", "queues": [queue.name], "max_tasks": 1},
            format="json",
        )
        assert_error(claim, status.HTTP_503_SERVICE_UNAVAILABLE, "unavailable")
        # An enqueue needs Postgres only: its task waits there for the dispatcher.
        enqueued = producer_client.post(
            f"/queues/{queue.name}/tasks", {"payload": 1}, format="json"
        )
        assert enqueued.status_code == status.HTTP_201_CREATED, enqueued.content
        assert enqueued.json()["status"] == "pending"
    finally:
        tasks.buffer._client = None
        forget_readiness()
        own.stop()
