"""The watchdog vacuums the task tables when their dead rows pile up (tasks.vacuum)."""

from __future__ import annotations

import time

import pytest
from django.conf import LazySettings
from django.db import connection

from queues.tests.factories import QueueFactory
from taskforge.lib import pg
from tasks import vacuum
from tasks.vacuum import Vacuumer
from workers.watchdog import WatchdogLoop

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _stats(table: str) -> tuple[int, int]:
    """(dead rows, vacuums run by hand) of `table`, as Postgres's statistics say."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables WHERE relname = %s",
            [table],
        )
        dead, vacuums = cursor.fetchone()
    return dead, vacuums


@pytest.fixture(autouse=True)
def _vacuumed() -> None:
    """No dead rows left by earlier tests (a TRUNCATE does not reset the count)."""
    vacuum.vacuum([(table, 0) for table in vacuum.TABLES])


def _dead_rows(count: int) -> None:
    """Leave at least `count` dead versions in tasks_task, and wait until the
    statistics count them."""
    queue = QueueFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_task (id, queue_id, payload, status, priority, scheduled_at,"
            " attempts, max_retries, created_at, updated_at, status_changed_at)"
            " SELECT gen_random_uuid(), %s, '{}', 'pending', 5, now(), 0, 3, now(), now(), now()"
            " FROM generate_series(1, %s)",
            [queue.pk, count],
        )
        cursor.execute("UPDATE tasks_task SET priority = 6 WHERE queue_id = %s", [queue.pk])
        cursor.execute("SELECT pg_stat_force_next_flush()")
    deadline = time.monotonic() + 10
    while _stats("tasks_task")[0] < count:
        assert time.monotonic() < deadline, "the statistics never counted the dead rows"
        time.sleep(0.1)


def test_poll__vacuums_a_table_past_the_threshold(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 200
    _dead_rows(500)
    _, vacuums = _stats("tasks_task")
    thread = Vacuumer().poll()
    assert thread is not None
    thread.join(timeout=30)
    assert not thread.is_alive()
    dead, after = _stats("tasks_task")
    assert after == vacuums + 1
    assert dead < 500


@pytest.mark.parametrize("threshold", [0, 10_000])
def test_poll__leaves_the_tables_alone_when_off_or_below(
    settings: LazySettings, threshold: int
) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = threshold
    _dead_rows(500)
    assert Vacuumer().poll() is None


def test_poll__looks_again_only_after_a_while(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 200
    vacuumer = Vacuumer()
    assert vacuumer.poll() is None  # nothing to do: looked, and waits CHECK_SECONDS
    _dead_rows(500)
    assert vacuumer.poll() is None
    vacuumer._next_check = 0.0
    thread = vacuumer.poll()
    assert thread is not None
    thread.join(timeout=30)


def test_vacuum__skips_a_table_that_is_being_vacuumed(caplog: pytest.LogCaptureFixture) -> None:
    """Another vacuum (autovacuum, another watchdog) holds the table: skipped, not waited for."""
    with pg.connect_own() as holder:
        # The lock a VACUUM takes; held in an open transaction.
        holder.execute("LOCK TABLE tasks_task IN SHARE UPDATE EXCLUSIVE MODE")
        started = time.monotonic()
        vacuum.vacuum([("tasks_task", 1)])
        assert time.monotonic() - started < 5
        holder.rollback()
    assert [getattr(r, "table", None) for r in caplog.records if r.msg == "vacuum.done"] == [
        "tasks_task"
    ]
    assert not [r for r in caplog.records if r.msg == "vacuum.failed"]


def test_watchdog__vacuums_in_its_ticks(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 200
    _dead_rows(500)
    _, vacuums = _stats("tasks_task")
    loop = WatchdogLoop()
    loop.tick()
    thread = loop.vacuumer._thread
    assert thread is not None
    thread.join(timeout=30)
    assert _stats("tasks_task")[1] == vacuums + 1
