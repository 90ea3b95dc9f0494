from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest
import redis
from django.db import transaction
from django.utils import timezone

from queues.notify import DISPATCH_CHANNEL
from queues.tests.factories import QueueFactory
from taskforge.lib import pg
from tasks import buffer as buffer_module
from tasks import dispatcher, services, transitions
from tasks.buffer import get_buffer
from tasks.dispatcher import DispatcherLoop
from tasks.models import Task, TaskStatus
from tasks.services import TaskSpec
from tasks.tests.factories import TaskFactory

S = TaskStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client")]


def statuses(*tasks: Task) -> list[str]:
    return [Task.objects.get(pk=t.pk).status for t in tasks]


def test_tick__buffers_due_tasks_in_hand_out_order() -> None:
    queue = QueueFactory()
    late = TaskFactory(queue=queue, priority=7)
    urgent = TaskFactory(queue=queue, priority=2)
    future = TaskFactory(queue=queue, scheduled_at=timezone.now() + timedelta(hours=1))
    assert DispatcherLoop().tick() is False
    assert statuses(late, urgent, future) == [S.CLAIMED, S.CLAIMED, S.PENDING]
    assert get_buffer().take(queue.id, 10, None).ids == [str(urgent.pk), str(late.pk)]


def test_tick__returns_true_while_a_full_batch_was_moved(monkeypatch) -> None:
    from tasks import dispatcher

    monkeypatch.setattr(dispatcher, "BATCH", 2)
    queue = QueueFactory()
    for _ in range(3):
        TaskFactory(queue=queue)
    loop = DispatcherLoop()
    assert loop.tick() is True
    assert loop.tick() is False
    assert get_buffer().size(queue.id) == 3


def test_tick__skips_paused_queues_and_drains_their_buffer() -> None:
    queue = QueueFactory()
    task = TaskFactory(queue=queue)
    DispatcherLoop().tick()
    queue.paused = True
    queue.save()
    waiting = TaskFactory(queue=queue)
    DispatcherLoop().tick()
    assert statuses(task, waiting) == [S.PENDING, S.PENDING]
    assert get_buffer().size(queue.id) == 0


def test_tick__drains_a_paused_queues_push_lane() -> None:
    """Tasks with an HTTP target wait in the push lane; paused, they go back to pending,
    so push processes do not pop them on every pass only to put them back."""
    queue = QueueFactory()
    http = {"url": "https://example.com/", "http_method": "POST", "headers": {}}
    task = TaskFactory(queue=queue, http_request=http)
    DispatcherLoop().tick()
    assert statuses(task) == [S.CLAIMED]
    queue.paused = True
    queue.save()
    DispatcherLoop().tick()
    assert statuses(task) == [S.PENDING]
    assert get_buffer().take(queue.id, 10, None, lane=buffer_module.HTTP_LANE).ids == []


def test_tick__leaves_a_run_tasks_task_in_a_paused_queues_run_lane() -> None:
    """A RunTask's task waits in the run lane: the reconcile of a new queue does not take
    it for lost and push it to the push lane too, whose drain would take it back."""
    queue = QueueFactory(paused=True)
    http = {"url": "https://example.com/", "http_method": "POST", "headers": {}}
    task = TaskFactory(queue=queue, http_request=http)
    with transaction.atomic():
        transitions.run_now(Task.objects.select_for_update().get(pk=task.pk))
    get_buffer().push(queue.id, [(str(task.pk), 0)], lane=buffer_module.RUN_LANE)
    DispatcherLoop().tick()  # a full pass: the queue is new, its claimed tasks reconciled
    assert statuses(task) == [S.CLAIMED]
    assert get_buffer().take(queue.id, 10, None, lane=buffer_module.HTTP_LANE).ids == []
    assert get_buffer().take(queue.id, 10, None, lane=buffer_module.RUN_LANE).ids == [str(task.pk)]


def test_tick__full_buffer_admits_more_urgent_tasks(settings) -> None:
    settings.TASKFORGE_BUFFER_SIZE = 2
    queue = QueueFactory()
    slow = [TaskFactory(queue=queue, priority=9) for _ in range(2)]
    loop = DispatcherLoop()
    loop.tick()
    urgent = TaskFactory(queue=queue, priority=1)
    loop._next_full_pass = 0
    loop.tick()
    assert statuses(urgent, *slow) == [S.CLAIMED, S.CLAIMED, S.PENDING]
    assert get_buffer().take(queue.id, 10, None).ids == [str(urgent.pk), str(slow[0].pk)]


def test_tick__watches_a_full_buffer_and_refills_it_as_it_drains(settings) -> None:
    """Found full, a queue's buffer is polled for room and marked watched (so that
    enqueues into its backlog need not NOTIFY): no wake-up needed to refill it.  The
    mark goes once the buffer has room again."""
    settings.TASKFORGE_BUFFER_SIZE = 2
    queue = QueueFactory()
    tasks = [TaskFactory(queue=queue) for _ in range(3)]
    loop = DispatcherLoop()
    loop.tick()
    assert statuses(*tasks) == [S.CLAIMED, S.CLAIMED, S.PENDING]
    assert get_buffer().client.pttl(buffer_module.watched_key(queue.id)) > 0
    get_buffer().take(queue.id, 2, None)  # claims drain it
    assert not loop._woken and loop._next_full_pass > time.monotonic()
    loop.tick()
    assert statuses(tasks[2]) == [S.CLAIMED]
    assert not get_buffer().client.exists(buffer_module.watched_key(queue.id))


@pytest.mark.django_db(transaction=True)
def test_enqueue__into_a_watched_full_buffer_wakes_dispatchers_only_for_more_urgent_tasks(
    settings,
) -> None:
    settings.TASKFORGE_BUFFER_SIZE = 2
    queue = QueueFactory()
    services.enqueue(queue, [TaskSpec(payload={"n": n}) for n in range(2)])  # buffered
    loop = DispatcherLoop()
    loop.tick()  # finds it full: watches it
    loop._next_full_pass = time.monotonic() + 60
    loop.wait(0.01)  # LISTEN before anything is sent
    [same] = services.enqueue(queue, [TaskSpec(payload={"n": 2})])
    loop.wait(0.3)
    assert same.task.status == S.PENDING and loop._woken == set()
    [urgent] = services.enqueue(queue, [TaskSpec(payload={"n": 3}, priority=1)])
    loop.wait(2.0)
    assert urgent.task.status == S.PENDING and loop._woken == {str(queue.id)}
    loop._listener.reset()


def test_tick__redis_down_puts_tasks_back_to_pending(monkeypatch) -> None:
    queue = QueueFactory()
    task = TaskFactory(queue=queue)
    get_buffer().lost_queues([queue.id])
    dead = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2)
    monkeypatch.setattr(buffer_module, "get_buffer", lambda: buffer_module.Buffer(dead))
    from tasks import dispatcher

    monkeypatch.setattr(dispatcher, "get_buffer", lambda: buffer_module.Buffer(dead))
    with pytest.raises(redis.exceptions.ConnectionError):
        DispatcherLoop().tick()
    assert statuses(task) == [S.PENDING]


def test_tick__lost_redis_data_is_restored_at_once(redis_client: redis.Redis) -> None:
    queue = QueueFactory()
    task = TaskFactory(queue=queue)
    DispatcherLoop().tick()
    redis_client.flushdb()
    DispatcherLoop().tick()
    assert get_buffer().take(queue.id, 10, None).ids == [str(task.pk)]


def test_tick__keys_lost_for_some_queues_are_restored_at_once(redis_client: redis.Redis) -> None:
    """A cluster node that comes back empty loses the keys of its queues only."""
    kept, lost = QueueFactory(), QueueFactory()
    kept_task, lost_task = TaskFactory(queue=kept), TaskFactory(queue=lost)
    loop = DispatcherLoop()
    loop.tick()
    redis_client.delete(buffer_module.ready_key(lost.id), buffer_module.epoch_key(lost.id))
    loop._next_full_pass = 0
    loop.tick()
    assert get_buffer().take(lost.id, 10, None).ids == [str(lost_task.pk)]
    assert get_buffer().take(kept.id, 10, None).ids == [str(kept_task.pk)]


def test_run__stops_on_flag_and_once_runs_one_tick() -> None:
    queue = QueueFactory()
    task = TaskFactory(queue=queue)
    loop = DispatcherLoop()
    assert loop.run(once=True) == 0
    assert statuses(task) == [S.CLAIMED]
    loop.stopping = True
    assert loop.run() == 0


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("burst", "expected"), [(True, {"q1", "q2"}), (False, {"q1"})])
def test_wait__a_burst_of_notifies_is_gathered_into_one_pass(
    monkeypatch: pytest.MonkeyPatch, burst: bool, expected: set[str]
) -> None:
    """Every enqueue into a queue with a backlog NOTIFYs; while they come in a burst, one
    wake-up serves those of the next moment too. A lone NOTIFY is served at once."""
    # Whether the last wake-up was recent is the test's choice, not the clock's: "recent"
    # is the whole test long (a loaded machine took more than 50 ms to connect and send).
    monkeypatch.setattr(dispatcher, "BURST_SECONDS", 60.0 if burst else 0.0)
    monkeypatch.setattr(dispatcher, "GATHER_SECONDS", 2.0)
    loop = DispatcherLoop()
    loop._next_full_pass = time.monotonic() + 60
    loop.wait(0.01)  # LISTEN before anything is sent
    loop._last_wake = time.monotonic() if burst else 0.0
    # A connection of its own in autocommit: each NOTIFY is sent at once.
    conn = pg.connect_own(autocommit=True)

    def send() -> None:
        conn.execute("SELECT pg_notify(%s, 'q1')", [DISPATCH_CHANNEL])
        # Inside the gathering window, or well after a lone wake-up was served.
        time.sleep(0.1 if burst else 1.5)
        conn.execute("SELECT pg_notify(%s, 'q2')", [DISPATCH_CHANNEL])

    sender = threading.Thread(target=send)
    try:
        sender.start()
        loop.wait(5.0)
        sender.join()
    finally:
        conn.close()
    assert loop._woken == expected
    loop._listener.reset()


def test_dispatch_keys__refills_each_key_to_its_bound_in_key_order(
    settings, django_capture_on_commit_callbacks
) -> None:
    settings.TASKFORGE_BUFFER_SIZE = 5
    queue = QueueFactory()
    with django_capture_on_commit_callbacks(execute=True):
        services.enqueue(queue, [TaskSpec(payload=n, fairness_key="A") for n in range(12)])
        services.enqueue(queue, [TaskSpec(payload=n, fairness_key="B") for n in range(3)])
        later = timezone.now() + timedelta(hours=1)
        services.enqueue(queue, [TaskSpec(payload=0, fairness_key="C", scheduled_at=later)])
    loop = DispatcherLoop()
    assert loop.dispatch_keys(queue) is dispatcher.FULL  # A's backlog waits for room
    buffer = get_buffer()
    assert buffer.key_sizes(queue.id, ["A", "B", "C"]) == [5, 3, 0]
    taken = buffer.take(queue.id, 6, None)
    assert len(taken.ids) == 6
    loop.dispatch_keys(queue)
    assert buffer.key_sizes(queue.id, ["A", "B", "C"])[0] == 5
    a_tasks = Task.objects.filter(queue=queue, fairness_key="A").order_by("id")
    order = [str(t.pk) for t in a_tasks]
    handed = [i for i in taken.ids if i in order]
    assert handed == order[: len(handed)]  # the v1 order within the key


def test_dispatch_keys__keys_with_only_later_tasks_do_not_spin(monkeypatch) -> None:
    monkeypatch.setattr(dispatcher, "KEYS_PER_PASS", 2)
    queue = QueueFactory()
    later = timezone.now() + timedelta(hours=1)
    services.enqueue(
        queue, [TaskSpec(payload=0, fairness_key=f"k{n}", scheduled_at=later) for n in range(5)]
    )
    loop = DispatcherLoop()
    outcomes = [loop.dispatch_keys(queue) for _ in range(4)]
    assert dispatcher.MORE not in outcomes[:2]  # nothing moved: no pass again at once


def test_restore_key_rates__a_lost_bucket_comes_back_from_postgres(
    django_capture_on_commit_callbacks,
) -> None:
    """After Redis lost a queue's keys, each key's bucket holds what its recent
    hand-outs left (key_rate_limit 2: burst 2, refilled in 1 s), not a new burst."""
    from tasks.fair_buffer import KeyLimits
    from tasks.reconcile import restore_key_rates

    queue = QueueFactory(key_rate_limit=2)
    for _ in range(2):
        TaskFactory(queue=queue, fairness_key="A", status=S.EXECUTING)  # handed out now
    TaskFactory(queue=queue, fairness_key="B", status=S.EXECUTING)
    with django_capture_on_commit_callbacks(execute=True):
        services.enqueue(
            queue, [TaskSpec(payload=n, fairness_key=k) for k in ("A", "B") for n in range(3)]
        )
    assert restore_key_rates([queue]) == 2
    taken = get_buffer().take(queue.id, 10, None, keys=KeyLimits(rate_limit=2))
    keys = sorted(str(Task.objects.get(pk=i).fairness_key) for i in taken.ids)
    assert keys == ["B"]  # A spent its burst before the loss; B has one token left
