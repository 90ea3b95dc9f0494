"""The watchdog vacuums and analyzes the task tables when Postgres has not (tasks.vacuum)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from django.conf import LazySettings
from django.db import connection
from django.utils import timezone

from queues.tests.factories import QueueFactory
from taskforge.lib import pg
from tasks import transitions, vacuum
from tasks.vacuum import Vacuumer
from workers.watchdog import WatchdogLoop

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


def _counts(table: str) -> tuple[int, int, int]:
    """(dead rows, vacuums run by hand, analyzes run by hand) of `table`."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT n_dead_tup, vacuum_count, analyze_count FROM pg_stat_user_tables"
            " WHERE relname = %s",
            [table],
        )
        dead, vacuums, analyzes = cursor.fetchone()
    return dead, vacuums, analyzes


def _poll_to_the_end(vacuumer: Vacuumer | None = None) -> None:
    """One poll that starts a run, waited for to its end."""
    thread = (vacuumer or Vacuumer()).poll()
    assert thread is not None
    _finish(thread)


def _finish(thread: threading.Thread) -> None:
    thread.join(timeout=30)
    assert not thread.is_alive()


@pytest.fixture(autouse=True)
def _vacuumed() -> None:
    """No dead rows nor changes left by earlier tests (a TRUNCATE resets neither count)."""
    vacuum.run([vacuum.Job(table, 0, 0, vacuum=True, analyze=True) for table in vacuum.TABLES])


def _insert_tasks(cursor: Any, count: int) -> Any:
    """`count` pending tasks of a new queue, by SQL; the queue."""
    queue = QueueFactory()
    cursor.execute(
        "INSERT INTO tasks_task (id, queue_id, payload, status, priority, scheduled_at,"
        " attempts, max_retries, created_at, updated_at, status_changed_at)"
        " SELECT gen_random_uuid(), %s, '{}', 'pending', 5, now(), 0, 3, now(), now(), now()"
        " FROM generate_series(1, %s)",
        [queue.pk, count],
    )
    return queue


def _dead_rows(count: int) -> None:
    """Leave at least `count` dead versions in tasks_task, and wait until the
    statistics count them."""
    with connection.cursor() as cursor:
        queue = _insert_tasks(cursor, count)
        cursor.execute("UPDATE tasks_task SET priority = 6 WHERE queue_id = %s", [queue.pk])
        cursor.execute("SELECT pg_stat_force_next_flush()")
    deadline = time.monotonic() + 10
    while _counts("tasks_task")[0] < count:
        assert time.monotonic() < deadline, "the statistics never counted the dead rows"
        time.sleep(0.1)


def test_poll__vacuums_a_table_past_the_threshold(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 200
    _dead_rows(500)
    _, vacuums, analyzes = _counts("tasks_task")
    _poll_to_the_end()
    dead, vacuums_after, analyzes_after = _counts("tasks_task")
    # One VACUUM (ANALYZE): the 1000 changed rows were due an analyze as well.
    assert (vacuums_after, analyzes_after) == (vacuums + 1, analyzes + 1)
    assert dead < 500


def test_poll__leaves_the_tables_alone_when_off(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 0
    _dead_rows(500)
    assert Vacuumer().poll() is None


def test_poll__analyzes_a_changed_table_below_the_dead_rows_threshold(
    settings: LazySettings, caplog: pytest.LogCaptureFixture
) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 10_000
    _dead_rows(500)
    _, vacuums, analyzes = _counts("tasks_task")
    _poll_to_the_end()
    _, vacuums_after, analyzes_after = _counts("tasks_task")
    assert (vacuums_after, analyzes_after) == (vacuums, analyzes + 1)
    done = [r for r in caplog.records if r.msg == "analyze.done"]
    assert [(r.table, r.analyzed) for r in done] == [("tasks_task", True)]  # type: ignore[attr-defined]
    assert done[0].changed_rows >= 1000  # type: ignore[attr-defined]


def test_due__nothing_for_a_table_that_changed_little(settings: LazySettings) -> None:
    """Below autovacuum's analyze threshold (50 rows and a tenth of the live ones)."""
    with connection.cursor() as cursor:
        _insert_tasks(cursor, 20)
        cursor.execute("SELECT pg_stat_force_next_flush()")
    assert vacuum.due(200) == []


def _hand_out_plan(task_id: str) -> str:
    """The plan this connection's prepared hand-out statement runs with now."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT name FROM pg_prepared_statements WHERE strpos(statement, %s) > 0",
            ["SET status = 'executing', attempts = t.attempts + 1"],
        )
        (name,) = cursor.fetchone()
        # Its parameters, in the order they first appear: ids, push, run,
        # worker_id, key_id, now (tasks.sql.HAND_OUT).
        cursor.execute(
            f"EXPLAIN EXECUTE {name}(ARRAY[%s]::uuid[], false, false, 'w', NULL, now())",
            [task_id],
        )
        return "\n".join(row[0] for row in cursor.fetchall())


def test_analyze__a_prepared_statement_planned_on_a_small_table_is_planned_again(
    settings: LazySettings,
) -> None:
    """The API's hot statements are prepared and run their generic plans
    (taskforge.lib.pg), made when the table was small (it reads the table whole) and
    kept until the statistics change: after the watchdog's analyze, made again
    through the primary key."""
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 20_000
    queue = QueueFactory()
    now = timezone.now()
    created = transitions.create(
        [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(8)], buffer=True
    )
    for task in created[:7]:
        assert transitions.hand_out([str(task.pk)], worker_id="w")
    before = _hand_out_plan(str(created[7].pk))
    assert "Seq Scan on tasks_task" in before, before
    _dead_rows(5000)  # the table grows (and changes) well past the analyze threshold
    _poll_to_the_end()
    assert transitions.hand_out([str(created[7].pk)], worker_id="w")
    after = _hand_out_plan(str(created[7].pk))
    assert "Seq Scan on tasks_task" not in after, after
    assert "tasks_task_pkey" in after, after


def test_poll__looks_again_only_after_a_while(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 200
    vacuumer = Vacuumer()
    assert vacuumer.poll() is None  # nothing to do: looked, and waits CHECK_SECONDS
    _dead_rows(500)
    assert vacuumer.poll() is None
    vacuumer._next_check = 0.0
    _poll_to_the_end(vacuumer)


def test_vacuum__skips_a_table_that_is_being_vacuumed(caplog: pytest.LogCaptureFixture) -> None:
    """Another vacuum (autovacuum, another watchdog) holds the table: skipped, not waited for."""
    with pg.connect_own() as holder:
        # The lock a VACUUM takes; held in an open transaction.
        holder.execute("LOCK TABLE tasks_task IN SHARE UPDATE EXCLUSIVE MODE")
        started = time.monotonic()
        vacuum.run([vacuum.Job("tasks_task", 1, 0, vacuum=True, analyze=False)])
        assert time.monotonic() - started < 5
        holder.rollback()
    assert [getattr(r, "table", None) for r in caplog.records if r.msg == "vacuum.done"] == [
        "tasks_task"
    ]
    assert not [r for r in caplog.records if r.msg == "vacuum.failed"]


def test_watchdog__vacuums_in_its_ticks(settings: LazySettings) -> None:
    settings.TASKFORGE_VACUUM_DEAD_ROWS = 200
    _dead_rows(500)
    _, vacuums, _ = _counts("tasks_task")
    loop = WatchdogLoop()
    loop.tick()
    thread = loop.vacuumer._thread
    assert thread is not None
    _finish(thread)
    assert _counts("tasks_task")[1] == vacuums + 1
