"""The worker protocol (workers.protocol), called as the API views call it."""

from __future__ import annotations

import time
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from queues.exceptions import UnknownQueue
from queues.tests.factories import QueueFactory
from taskforge.api import revocation
from tasks import wakeup
from tasks.dispatcher import DispatcherLoop
from tasks.models import Task, TaskStatus, lease_timeout
from tasks.tests.factories import TaskFactory
from workers import heartbeats, protocol
from workers.exceptions import LeaseLost
from workers.models import Worker

S = TaskStatus
pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_client")]


def _buffered(queue_name: str = "q", count: int = 1) -> list[Any]:
    queue = QueueFactory(name=queue_name)
    tasks = [TaskFactory(queue=queue) for _ in range(count)]
    loop = DispatcherLoop()
    while loop.tick():
        pass
    return tasks


def test_claim__hands_out_buffered_tasks_and_records_the_worker() -> None:
    [task] = _buffered()
    # A worker id of its own: the protocol remembers recent ones per process.
    [handed] = protocol.claim(protocol.ClaimRequest("w-recorded", ["q"], max_tasks=5))
    assert (handed.pk, handed.status, handed.claimed_by, handed.attempts) == (
        task.pk,
        S.EXECUTING,
        "w-recorded",
        1,
    )
    assert Worker.objects.filter(worker_id="w-recorded").exists()


def test_claim__pops_on_through_stale_ids_to_a_task_behind_them() -> None:
    """Ids no longer `claimed` ahead of a buffered task (duplicates a reconcile restored
    while their hand-out committed) do not use up the claim's pops: a claim of one task
    gets the task behind ten of them at once, not at a later look."""
    from tasks.buffer import get_buffer, score

    [*gone, task] = _buffered(count=11)
    earlier = protocol.claim(protocol.ClaimRequest("w-first", ["q"], max_tasks=10))
    assert {t.pk for t in earlier} == {t.pk for t in gone}
    # Their ids back in the buffer, scored ahead of the task still buffered there.
    get_buffer().push(
        task.queue_id, [(str(t.pk), score(t.priority, t.scheduled_at) - 1000) for t in gone]
    )
    [handed] = protocol.claim(protocol.ClaimRequest("w-second", ["q"], max_tasks=1))
    assert handed.pk == task.pk
    assert get_buffer().size(task.queue_id) == 0


def test_claim__unknown_queue_is_a_domain_error() -> None:
    """Regression for issue 9: the protocol raised Django's Http404."""
    with pytest.raises(UnknownQueue):
        protocol.claim(protocol.ClaimRequest("w1", ["nope"]))


def test_claim__a_client_gone_during_the_wait_gets_nothing() -> None:
    QueueFactory(name="q")
    answers = iter([True])
    got = protocol.claim(
        protocol.ClaimRequest("w1", ["q"], wait_seconds=5), gone=lambda: next(answers)
    )
    assert got == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("listening", "looks"), [(True, (3, 4)), (False, (10, 15))])
def test_claim__an_idle_wait_looks_again_when_woken_or_now_and_then(
    monkeypatch: pytest.MonkeyPatch, listening: bool, looks: tuple[int, int]
) -> None:
    """Issue 11: 1,000 idle pollers looking every second kept 0.2 of a core busy. With
    the wake-up listener subscribed, a wait looks again only every QUIET_LOOK_SECONDS
    (here 1 s, slices of 0.2 s); without it, every slice.  Plus the look before the
    claim registers for wake-ups (test_claim__looks_before_it_registers_for_wake_ups)."""
    QueueFactory(name="q")
    monkeypatch.setattr(protocol, "MAX_WAIT_SLICE", 0.2)
    monkeypatch.setattr(protocol, "QUIET_LOOK_SECONDS", 1.0)
    monkeypatch.setattr(wakeup.waiters, "listening", lambda: listening)
    calls: list[float] = []
    real = protocol.take

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(time.monotonic())
        return real(*args, **kwargs)

    monkeypatch.setattr(protocol, "take", counted)
    assert protocol.claim(protocol.ClaimRequest("w1", ["q"], wait_seconds=2.1)) == []
    assert looks[0] <= len(calls) <= looks[1], calls


def test_claim__looks_before_it_registers_for_wake_ups(monkeypatch: pytest.MonkeyPatch) -> None:
    """A claim that finds work at its first look never registers for wake-ups nor
    watches its key; one that waits looks again once registered, so a task that
    arrives between the first look and the registration is handed out at once."""
    [first] = _buffered()
    registered: list[str] = []
    real_interest, real_watch = wakeup.waiters.interest, revocation.watch_key

    def interest(*args: Any, **kwargs: Any) -> Any:
        registered.append("interest")
        return real_interest(*args, **kwargs)

    def watch_key(*args: Any, **kwargs: Any) -> Any:
        registered.append("watch_key")
        return real_watch(*args, **kwargs)

    monkeypatch.setattr(wakeup.waiters, "interest", interest)
    monkeypatch.setattr(revocation, "watch_key", watch_key)
    [task] = protocol.claim(protocol.ClaimRequest("w1", ["q"], wait_seconds=5))
    assert registered == []
    # Nothing at the first look; the task lands before the claim registers.
    real_take = protocol.take
    looks: list[int] = []

    def take(*args: Any, **kwargs: Any) -> Any:
        found = real_take(*args, **kwargs)
        looks.append(len(found[0]))
        if len(looks) == 1:
            TaskFactory(queue=first.queue)
            loop = DispatcherLoop()
            while loop.tick():
                pass
        return found

    monkeypatch.setattr(protocol, "take", take)
    started = time.monotonic()
    [second] = protocol.claim(protocol.ClaimRequest("w1", ["q"], wait_seconds=5))
    assert time.monotonic() - started < 1.0  # not after a wait slice
    assert looks == [0, 1] and registered == ["interest", "watch_key"]
    assert second.pk != task.pk == first.pk


def test_heartbeat__extends_the_lease_and_keeps_the_history() -> None:
    _buffered()
    [task] = protocol.claim(protocol.ClaimRequest("w1", ["q"]))
    [outcome] = protocol.heartbeat("w1", [protocol.Item(str(task.pk), task.attempts)])
    assert outcome.error is None and outcome.heartbeat_at is not None
    assert heartbeats.history(task.pk) == [
        outcome.heartbeat_at.replace(microsecond=outcome.heartbeat_at.microsecond // 1000 * 1000)
    ]
    assert protocol.lease_expires_at(outcome.heartbeat_at) == outcome.heartbeat_at + lease_timeout()
    [foreign] = protocol.heartbeat("w2", [protocol.Item(str(task.pk))])
    assert isinstance(foreign.error, LeaseLost)


def _hot_updates() -> int:
    """Postgres's count of HOT updates of tasks_task, this session's included."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = 'tasks_task'")
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_heartbeat__is_a_hot_update() -> None:
    """A heartbeat writes heartbeat_at alone, which no index holds: Postgres
    writes it without a new entry in any index (migration tasks 0011)."""
    _buffered(count=5)
    held = protocol.claim(protocol.ClaimRequest("w1", ["q"], max_tasks=5))
    assert len(held) == 5
    before = _hot_updates()
    outcomes = protocol.heartbeat("w1", [protocol.Item(str(task.pk)) for task in held])
    assert all(outcome.error is None for outcome in outcomes)
    deadline = time.monotonic() + 10
    while _hot_updates() - before < 5:
        assert time.monotonic() < deadline, _hot_updates() - before
        time.sleep(0.1)


def test_ack__repeats_safely_for_the_holder_only() -> None:
    _buffered()
    [task] = protocol.claim(protocol.ClaimRequest("w1", ["q"]))
    item = protocol.Item(str(task.pk), task.attempts, {"ok": 1})
    [first] = protocol.ack("w1", [item])
    [again] = protocol.ack("w1", [item])
    [foreign] = protocol.ack("w2", [item])
    assert first.task is not None and first.task.status == S.DONE
    assert again.task is not None and again.error is None
    assert isinstance(foreign.error, LeaseLost)
    assert Task.objects.get(pk=task.pk).result == {"ok": 1}


def test_nack__a_stale_attempt_is_lease_lost_and_changes_nothing() -> None:
    _buffered()
    [task] = protocol.claim(protocol.ClaimRequest("w1", ["q"]))
    with pytest.raises(LeaseLost):
        protocol.nack("w1", protocol.Item(str(task.pk), task.attempts + 1), error="e")
    assert Task.objects.get(pk=task.pk).status == S.EXECUTING
    failed = protocol.nack("w1", protocol.Item(str(task.pk), task.attempts), error="e")
    assert failed.status == S.RETRY and failed.scheduled_at > timezone.now()
