"""The hot statements' plans do not follow the statistics (issue 12, steady speed).

On a server with history the statistics say that almost no task is live, and a
plan that reads a live status's partial index whole looks free.  The statements
that find tasks by id must reach them through the primary key whatever the
statistics say (their status guards prove no partial index), and the
dispatcher's must walk task_pending_due_idx in order.  Checked here under the
worst statistics: every row finished, as ANALYZE sees it, then the live rows.

The API runs these statements prepared, with their generic plans (made without
the parameters' values, kept until the table's statistics change:
taskforge.lib.pg); so the generic plans are checked too, under history
statistics and under those of a table whose tasks were never claimed.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.db import connection, transaction
from django.db.models import Count
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from queues.tests.factories import QueueFactory
from taskforge.lib import pg
from tasks import sql, stats, transitions
from tasks.lifecycle import IN_PROGRESS
from tasks.models import Task
from workers import sql as worker_sql
from workers.models import Worker, current_tasks, held_tasks
from workers.sql import HELD_TASKS

PARTIAL = re.compile(r"using (task_\w+_idx)")


class Rollback(Exception):
    pass


def plan(text: str, params: dict[str, Any], off: tuple[str, ...] = ()) -> str:
    lines: list[str] = []
    try:
        with transaction.atomic(), pg.cursor() as cursor, pg.planner_off(cursor, off):
            cursor.execute("EXPLAIN " + text, params)
            lines = [row[0] for row in cursor.fetchall()]
            raise Rollback
    except Rollback:
        pass
    return "\n".join(lines)


def generic_plan(text: str, params: dict[str, Any], off: tuple[str, ...] = ()) -> str:
    """The plan a prepared `text` runs with once Postgres settles on a generic one
    (with the planner settings `off` turned off, as its caller runs it)."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", number, text)
    with connection.cursor() as cursor:
        cursor.execute(f"PREPARE generic_plan_check AS {numbered}")
        try:
            cursor.execute("SET plan_cache_mode = force_generic_plan")
            for method in off:
                cursor.execute(f"SET {method} = off")
            arguments = ", ".join(["%s"] * len(order))
            cursor.execute(
                f"EXPLAIN EXECUTE generic_plan_check({arguments})", [params[k] for k in order]
            )
            lines = [row[0] for row in cursor.fetchall()]
        finally:
            for method in ("plan_cache_mode", *off):
                cursor.execute(f"RESET {method}")
            cursor.execute("DEALLOCATE generic_plan_check")
    return "\n".join(lines)


def _through_the_primary_key(plans: dict[str, str]) -> None:
    for name, text in plans.items():
        assert "tasks_task_pkey" in text, (name, text)
        assert not PARTIAL.findall(text), (name, text)
        assert "Seq Scan on tasks_task" not in text, (name, text)


@pytest.fixture
def history_statistics() -> Any:
    """Finished tasks only when ANALYZE looks, live ones after (as after months of traffic).

    Enough of them (5000, all run by the worker the statements name) that
    reading a table or an index whole costs more than the lookups by id.
    """
    queue = QueueFactory()
    now = timezone.now()
    for _ in range(5):
        created = transitions.create(
            [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(1000)], buffer=True
        )
        held = transitions.hand_out([str(task.pk) for task in created], worker_id="w")
        transitions.ack([(str(task.pk), None, None) for task in held], worker_id="w")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_task")
    return queue


@pytest.mark.django_db(transaction=True)
def test_statements_by_id__use_the_primary_key_under_history_statistics(
    history_statistics: Any,
) -> None:
    queue = history_statistics
    now = timezone.now()
    created = transitions.create(
        [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(40)], buffer=True
    )
    ids = [str(task.pk) for task in created]
    held = transitions.hand_out(ids[:20], worker_id="w")
    held_ids = [str(task.pk) for task in held]
    nones: list[None] = [None] * len(held_ids)
    common = {"worker_id": "w", "key_id": None, "now": now}
    plans = {
        "hand_out": plan(
            sql.HAND_OUT.text, {**common, "ids": ids[20:], "push": False, "run": False}
        ),
        "ack": plan(sql.ACK.text, {**common, "ids": held_ids, "attempts": nones, "results": nones}),
        "heartbeat": plan(worker_sql.HEARTBEAT, {**common, "ids": held_ids, "attempts": nones}),
    }
    for name, text in plans.items():
        assert "tasks_task_pkey" in text, (name, text)
        assert not PARTIAL.findall(text), (name, text)


@pytest.mark.django_db(transaction=True)
def test_buffer_due__walks_the_pending_index_in_order_under_history_statistics(
    history_statistics: Any,
) -> None:
    queue = history_statistics
    now = timezone.now()
    transitions.create([transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(400)])
    params = {"queue_id": queue.id, "now": now, "limit": 100, "better_than": None}
    text = plan(sql.BUFFER_DUE.text, params, sql.BUFFER_DUE.off)
    assert PARTIAL.findall(text) == ["task_pending_due_idx"], text
    assert "JIT" not in text


@pytest.mark.django_db(transaction=True)
def test_who_holds_what__one_probe_per_worker_under_history_statistics(
    history_statistics: Any,
) -> None:
    """The dashboard asks, per worker, whether it executes a task now: through
    task_executing_by_idx, not the worker's history (task_claimed_by_idx, 5000 done
    tasks of "w" here) nor every executing task (an index of them all: 24 s for the
    overview with 50,000 executing tasks and 200 workers)."""
    queue = history_statistics
    now = timezone.now()
    created = transitions.create(
        [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(300)], buffer=True
    )
    for n in range(30):
        batch = created[n * 10 : (n + 1) * 10]
        transitions.hand_out([str(task.pk) for task in batch], worker_id=f"x{n}")
    Worker.objects.bulk_create(
        Worker(worker_id=name, last_seen_at=now) for name in ["w", *(f"x{n}" for n in range(30))]
    )
    holding = Worker.objects.recent(now).with_holding().explain()
    assert PARTIAL.findall(holding) == ["task_executing_by_idx"], holding
    held_now = current_tasks(["w", "x1"])
    assert set(held_now) == {"x1"}
    assert sorted(held_now["x1"]) == sorted(str(task.pk) for task in created[10:20])
    # The workers page: how many each holds and a few of them, counted in Postgres.
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + HELD_TASKS, [["w", "x1", "x2"], 3])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert set(PARTIAL.findall(plan)) == {"task_executing_by_idx"}, plan
    held = held_tasks(["w", "x1", "x2"], 3)
    assert set(held) == {"x1", "x2"}
    for name, batch in (("x1", created[10:20]), ("x2", created[20:30])):
        count, shown = held[name]
        assert count == 10 and len(shown) == 3 and shown == sorted(shown)
        assert set(shown) <= {str(task.pk) for task in batch}


@pytest.mark.django_db(transaction=True)
def test_statements_by_id__generic_plans_use_the_primary_key_before_any_claim() -> None:
    """ANALYZE saw 2000 tasks enqueued ahead of the first workers (none ever claimed:
    task_claimed_by_idx looks empty); the prepared hand-out, ack, heartbeat and
    the dispatcher's statement still go through the primary key, not through an
    index or the table read whole."""
    queue = QueueFactory()
    now = timezone.now()
    created = transitions.create(
        [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(2000)]
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_task")
    ids = [str(task.pk) for task in created[:3]]
    common = {"worker_id": "w", "key_id": None, "now": now, "ids": ids}
    nones: list[None] = [None] * len(ids)
    plans = {
        "hand_out": generic_plan(sql.HAND_OUT.text, {**common, "push": False, "run": False}),
        "ack": generic_plan(sql.ACK.text, {**common, "attempts": nones, "results": nones}),
        "heartbeat": generic_plan(worker_sql.HEARTBEAT, {**common, "attempts": nones}),
    }
    _through_the_primary_key(plans)
    params = {"queue_id": queue.id, "now": now, "limit": 100, "better_than": None}
    text = generic_plan(sql.BUFFER_DUE.text, params, sql.BUFFER_DUE.off)
    assert PARTIAL.findall(text) == ["task_pending_due_idx"], text
    assert "tasks_task_pkey" in text and "Seq Scan on tasks_task" not in text, text


@pytest.mark.django_db(transaction=True)
def test_expired_leases__through_the_hand_out_times_under_history_statistics(
    history_statistics: Any,
) -> None:
    """The watchdog's query reads task_executing_since_idx (tasks handed out before
    the cutoff), not every executing task, nor the history."""
    from workers.watchdog import BATCH

    now = timezone.now()
    query = (
        Task.objects.lease_expired(now)
        .select_for_update(skip_locked=True, no_key=True, of=("self",))
        .order_by("claimed_at")[:BATCH]
    )
    with transaction.atomic():
        text = query.explain()
    assert PARTIAL.findall(text) == ["task_executing_since_idx"], text


@pytest.mark.django_db(transaction=True)
def test_statements_by_id__generic_plans_use_the_primary_key_under_history_statistics(
    history_statistics: Any,
) -> None:
    """The plans the API's prepared statements run (`pg._generic_plans`), after months of
    traffic as ANALYZE sees them."""
    queue = history_statistics
    now = timezone.now()
    created = transitions.create(
        [transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(3)], buffer=True
    )
    ids = [str(task.pk) for task in created]
    common = {"worker_id": "w", "key_id": None, "now": now, "ids": ids}
    nones: list[None] = [None] * len(ids)
    plans = {
        "hand_out": generic_plan(sql.HAND_OUT.text, {**common, "push": False, "run": False}),
        "ack": generic_plan(sql.ACK.text, {**common, "attempts": nones, "results": nones}),
    }
    _through_the_primary_key(plans)
    params = {"queue_id": queue.id, "now": now, "limit": 100, "better_than": None}
    text = generic_plan(sql.BUFFER_DUE.text, params, sql.BUFFER_DUE.off)
    assert PARTIAL.findall(text) == ["task_pending_due_idx"], text


def _plan_cache_mode() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW plan_cache_mode")
        return str(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_prepared_statements__run_generic_plans_set_once_outside_a_transaction() -> None:
    queue = QueueFactory()
    now = timezone.now()
    _plan_cache_mode()
    raw = connection.connection  # made a new connection's
    raw.execute("RESET plan_cache_mode")
    raw._taskforge_generic_plans = False
    with transaction.atomic():
        transitions.create([transitions.NewTask(queue, {"n": 1}, 5, now, 3)])
        assert _plan_cache_mode() == "auto"  # a rollback would undo it: not in here
    assert _plan_cache_mode() == "auto"
    transitions.create([transitions.NewTask(queue, {"n": 2}, 5, now, 3)])
    assert _plan_cache_mode() == "force_generic_plan"


def listed_sorting_off(client: Any, url: str) -> bool:
    """Whether GET `url` ran its task list query with sorting off (pg.ORDERED_BY_INDEX)."""
    with CaptureQueriesContext(connection) as queries:
        assert client.get(url).status_code == 200, url
    statements = [q["sql"] for q in queries.captured_queries]
    listed = next(
        i for i, s in enumerate(statements) if 'FROM "tasks_task"' in s and "ORDER BY" in s
    )
    return "SET LOCAL enable_sort = off" in statements[:listed]


@pytest.mark.django_db(transaction=True)
def test_task_list_by_status__walks_the_not_done_index_under_history_statistics(
    history_statistics: Any, producer_client: Any
) -> None:
    """A page of a queue's tasks with a live status stops after the page on
    task_not_done_idx, with 2000 pending tasks in another queue that the
    statistics do not know of (allowed to sort, the planner read them all
    through task_pending_sched_idx and sorted them); the API's list runs it so
    (pg.ORDERED_BY_INDEX), the dashboard's too (dashboard/tests)."""
    queue = history_statistics
    other = QueueFactory()
    now = timezone.now()
    transitions.create([transitions.NewTask(other, {"n": n}, 5, now, 3) for n in range(2000)])
    for status in ("pending", "claimed", "executing", "retry", "dead"):
        page = Task.objects.filter(queue=queue, status=status).order_by("-created_at", "-id")
        with pg.planned_without(pg.ORDERED_BY_INDEX):
            text = page[:101].explain()
        assert "task_not_done_idx" in text, (status, text)
        assert "Sort" not in text, (status, text)
    assert listed_sorting_off(producer_client, f"/queues/{queue.name}/tasks?status=pending")
    assert not listed_sorting_off(producer_client, f"/queues/{queue.name}/tasks")


@pytest.mark.django_db(transaction=True)
def test_stats_count__never_plans_parallel_workers(history_statistics: Any) -> None:
    """The stats' count of a queue's live tasks is one index walk; with parallel
    plans made cheap (as a wrong estimate of the live share makes them look on
    a server with history), it runs without workers all the same
    (pg.NO_PARALLEL), while the same count planned freely would start them."""
    queue = history_statistics
    now = timezone.now()
    transitions.create([transitions.NewTask(queue, {"n": n}, 5, now, 3) for n in range(2000)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE tasks_task")  # thousands of live tasks: worth workers?
    counted = Task.objects.filter(queue_id__in=[queue.id], status__in=IN_PROGRESS).values(
        "queue_id"
    )
    cheap = {
        "parallel_setup_cost": "0",
        "parallel_tuple_cost": "0",
        "min_parallel_index_scan_size": "0",
        "min_parallel_table_scan_size": "0",
    }
    with connection.cursor() as cursor:
        for name, value in cheap.items():
            cursor.execute(f"SET {name} = {value}")
        try:
            assert "Gather" in counted.annotate(n=Count("id")).explain()
            with CaptureQueriesContext(connection) as queries:
                stats.queue_stats(queue)
            with pg.planned_without(pg.NO_PARALLEL):
                assert "Gather" not in counted.annotate(n=Count("id")).explain()
        finally:
            for name in cheap:
                cursor.execute(f"RESET {name}")
    statements = [q["sql"] for q in queries.captured_queries]
    counting = next(i for i, s in enumerate(statements) if 'COUNT("tasks_task"' in s)
    assert "SET LOCAL max_parallel_workers_per_gather = 0" in statements[:counting]
