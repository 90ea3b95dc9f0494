"""Claims under a queue's `max_concurrency` (workers.protocol with tasks.concurrency).

Transactional: slots are freed once a move commits, as in production.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.db import connection
from django.utils import timezone

from queues import lookup
from queues.models import Queue
from queues.services import update_queue
from queues.tests.factories import QueueFactory
from taskforge.audit.log import CLI
from tasks import concurrency, services
from tasks.buffer import get_buffer
from tasks.dispatcher import DispatcherLoop
from tasks.models import Task, TaskStatus
from tasks.tests.factories import TaskFactory, age_lease
from workers import protocol
from workers.watchdog import WatchdogLoop

S = TaskStatus
pytestmark = [
    pytest.mark.postgres,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("redis_client"),
]


def _capped(cap: int | None, count: int, name: str = "q") -> tuple[Queue, list[Task]]:
    queue: Queue = QueueFactory(name=name, max_concurrency=cap)
    tasks: list[Task] = [TaskFactory(queue=queue) for _ in range(count)]
    _dispatch()
    return queue, tasks


def _dispatch() -> None:
    loop = DispatcherLoop()
    while loop.tick():
        pass


def _claim(worker: str = "w", *, max_tasks: int = 1, wait: float = 0.0) -> list[Task]:
    return protocol.claim(
        protocol.ClaimRequest(worker, ["q"], max_tasks=max_tasks, wait_seconds=wait)
    )


def _executing(queue: Queue) -> int:
    return Task.objects.filter(queue=queue, status=S.EXECUTING).count()


@pytest.fixture
def in_thread() -> Iterator[Callable[[Callable[[], Any]], threading.Thread]]:
    """Start a function in a thread with its own connection; re-raise its error at the end."""
    errors: list[BaseException] = []
    threads: list[threading.Thread] = []

    def start(function: Callable[[], Any]) -> threading.Thread:
        def run() -> None:
            try:
                function()
            except BaseException as exc:
                errors.append(exc)
            finally:
                connection.close()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        threads.append(thread)
        return thread

    yield start
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []


def test_claim__racing_claims_never_hand_out_past_the_cap(
    in_thread: Callable[[Callable[[], Any]], threading.Thread],
) -> None:
    """Sixteen workers claim, hold and ack at once; never more than the cap hold tasks."""
    cap = 4
    queue, tasks = _capped(cap, 120)
    lock = threading.Lock()
    held = 0
    most = 0
    done: list[str] = []
    sampled: list[int] = []
    stop = threading.Event()

    def worker(number: int) -> None:
        nonlocal held, most
        rng = random.Random(number)
        while not stop.is_set():
            got = _claim(f"w{number}", max_tasks=rng.randint(1, 3), wait=0.2)
            with lock:
                held += len(got)
                most = max(most, held)
            time.sleep(rng.uniform(0, 0.01))
            with lock:
                held -= len(got)
            for task in got:
                protocol.ack(f"w{number}", [protocol.Item(str(task.pk), task.attempts)])
            with lock:
                done.extend(str(task.pk) for task in got)
                if len(done) >= len(tasks):
                    stop.set()

    def sampler() -> None:
        while not stop.is_set():
            sampled.append(_executing(queue))

    workers = [in_thread(lambda n=n: worker(n)) for n in range(16)]  # type: ignore[misc]
    in_thread(sampler)
    for thread in workers:
        thread.join(timeout=60)
    stop.set()

    assert sorted(done) == sorted(str(task.pk) for task in tasks)
    assert most == cap  # reached, never passed
    assert max(sampled) <= cap
    assert get_buffer().running_count(queue.id) == 0


@pytest.mark.parametrize("end", ["ack", "nack", "lease expiry"])
def test_slot_freed__wakes_a_waiting_claim(
    end: str, in_thread: Callable[[Callable[[], Any]], threading.Thread], settings: Any
) -> None:
    _capped(1, 2)
    [first] = _claim("w1")
    got: list[Task] = []
    woken_at: list[float] = []

    def waiting() -> None:
        got.extend(_claim("w2", wait=10))
        woken_at.append(time.monotonic())

    thread = in_thread(waiting)
    time.sleep(0.3)
    assert not got  # at its cap
    freed_at = time.monotonic()
    if end == "ack":
        protocol.ack("w1", [protocol.Item(str(first.pk), first.attempts)])
    elif end == "nack":
        protocol.nack("w1", protocol.Item(str(first.pk)), error="boom", retry_after_seconds=60)
    else:
        settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 1
        age_lease(first.pk, 5)
        freed_at = time.monotonic()
        assert WatchdogLoop().expire_leases() is False
    thread.join(timeout=5)
    assert len(got) == 1 and got[0].pk != first.pk
    # Woken by the release, well before the claim's own one-second look.
    assert woken_at[0] - freed_at < 0.5


def test_lowering_the_cap__hands_out_nothing_until_under_it() -> None:
    queue, _ = _capped(3, 6)
    running = _claim(max_tasks=3)
    assert len(running) == 3
    update_queue(queue, max_concurrency=1, actor=CLI)
    lookup.clear()
    for task in running[:2]:
        protocol.ack("w", [protocol.Item(str(task.pk))])
        assert _claim() == []  # 2, then 1 running: not under 1
    assert _executing(queue) == 1  # nothing running was interrupted
    protocol.ack("w", [protocol.Item(str(running[2].pk))])
    assert len(_claim(max_tasks=3)) == 1


def test_a_new_cap__counts_the_tasks_already_running() -> None:
    queue, _ = _capped(None, 4)
    assert len(_claim(max_tasks=3)) == 3
    update_queue(queue, max_concurrency=2, actor=CLI)
    lookup.clear()
    assert _claim() == []
    assert get_buffer().running_count(queue.id) == 3


def test_redis_lost__the_count_is_rebuilt_and_the_queue_goes_on(
    redis_client: redis.Redis,
) -> None:
    queue, _ = _capped(2, 5)
    running = _claim(max_tasks=2)
    redis_client.flushdb()
    _dispatch()  # the dispatcher notices and re-buffers every claimed task
    assert _claim() == []  # the two executing tasks are counted again
    assert get_buffer().running_count(queue.id) == 2
    protocol.ack("w", [protocol.Item(str(running[0].pk))])
    assert len(_claim(max_tasks=2)) == 1
    assert _executing(queue) == 2


def test_reconcile__frees_a_slot_a_dead_claim_left_taken(settings: Any) -> None:
    """A claim that died between its take and its hand-out does not wedge the queue."""
    settings.TASKFORGE_BUFFER_RECONCILE_SECONDS = 3
    queue, [task] = _capped(1, 1)
    concurrency.count_running(queue)
    taken = get_buffer().take(queue.id, 1, None, 1)  # popped; the process dies here
    assert taken.ids == [str(task.pk)]
    assert _claim() == []
    Task.objects.filter(pk=task.pk).update(status_changed_at=timezone.now() - timedelta(seconds=2))
    time.sleep(1.6)  # older than the reconcile's grace (half its interval)
    WatchdogLoop().reconcile()
    [handed] = _claim()
    assert handed.pk == task.pk


def test_reconcile__counts_executing_tasks_the_set_misses() -> None:
    queue, _ = _capped(5, 3)
    _claim(max_tasks=3)
    get_buffer().forget_running([queue.id])
    assert concurrency.reconcile_running() == 0
    assert get_buffer().running_count(queue.id) == 3


def test_ids_not_handed_out__give_their_slots_back() -> None:
    queue, [cancelled, kept] = _capped(2, 2)
    services.cancel(cancelled.pk, actor=CLI)  # its id stays in the buffer
    [handed] = _claim(max_tasks=2)
    assert handed.pk == kept.pk
    assert get_buffer().running(queue.id) == [str(kept.pk)]


def test_ids_put_back_for_a_paused_queue__give_their_slots_back() -> None:
    queue, _ = _capped(2, 2)
    lookup.by_names(["q"])  # the claim reads the queue as running
    Queue.objects.filter(pk=queue.pk).update(paused=True)
    assert _claim(max_tasks=2) == []
    assert get_buffer().running_count(queue.id) == 0
    assert get_buffer().size(queue.id) == 2


def test_uncapped_queue__keeps_no_running_set() -> None:
    queue, _ = _capped(None, 2)
    assert len(_claim(max_tasks=2)) == 2
    assert get_buffer().running_count(queue.id) == 0


def test_claim__skips_a_full_queue_and_takes_from_the_next() -> None:
    _capped(1, 2)
    _capped(None, 1, name="other")
    assert len(_claim()) == 1  # q is full now
    [handed] = protocol.claim(protocol.ClaimRequest("w", ["q", "other"], max_tasks=2))
    assert handed.queue.name == "other"


def test_redis_lost__a_claim_finding_the_count_being_rebuilt_waits_for_it() -> None:
    queue, _ = _capped(2, 2)
    assert get_buffer().start_counting(queue.id)  # another claim is rebuilding it
    assert _claim() == []
    assert concurrency.recount_for_claim(queue) is False
    get_buffer().done_counting(queue.id)
    assert len(_claim(max_tasks=2)) == 2
