from __future__ import annotations

import ast
import itertools
import json
import logging
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import connection, transaction
from django.utils import timezone

from dlq.models import DeadLetterTask
from queues.tests.factories import QueueFactory
from tasks import events, transitions
from tasks.exceptions import InvalidTransition
from tasks.lifecycle import CLAIM, is_allowed
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory

S = TaskStatus
ROOT = Path(__file__).resolve().parents[2]


def _buffer(task: Task) -> None:
    transitions.buffer_due(task.queue, limit=1)


def _hand_out(task: Task) -> None:
    transitions.hand_out([str(task.pk)], worker_id="w")


def _ack(task: Task) -> None:
    transitions.ack([(str(task.pk), None, "1")], worker_id=task.claimed_by or "w")


# Each verb of tasks.transitions, called on one task as production calls it.
CALLS: dict[str, Callable[[Task], object]] = {
    "buffer_due": _buffer,
    "unbuffer": lambda t: transitions.unbuffer([t]),
    "promote": lambda t: transitions.promote([t]),
    "hand_out": _hand_out,
    "ack": _ack,
    "fail": lambda t: transitions.fail(t, error="e"),
    "expire_lease": lambda t: transitions.expire_lease(t),
    "cancel": lambda t: transitions.cancel([t]),
    "cancel_attempt": lambda t: transitions.cancel_attempt(t),
    "run_now": lambda t: transitions.run_now(t),
    "replay": lambda t: transitions.replay([t]),
}

# The verb that takes each allowed move (besides create's None -> pending).
MOVES: dict[tuple[str, str], Callable[[Task], object]] = {
    (S.PENDING, S.CLAIMED): _buffer,
    (S.PENDING, S.CANCELLED): CALLS["cancel"],
    (S.CLAIMED, S.EXECUTING): _hand_out,
    (S.CLAIMED, S.PENDING): CALLS["unbuffer"],
    (S.CLAIMED, S.CANCELLED): CALLS["cancel"],
    (S.EXECUTING, S.DONE): _ack,
    (S.EXECUTING, S.RETRY): CALLS["fail"],
    (S.EXECUTING, S.DEAD): lambda t: transitions.fail(t, error="e", retry=False),
    (S.EXECUTING, S.CANCELLED): CALLS["cancel_attempt"],
    (S.RETRY, S.PENDING): CALLS["promote"],
    (S.RETRY, S.CANCELLED): CALLS["cancel"],
    (S.DEAD, S.PENDING): CALLS["replay"],
}


def test_verbs__every_call_here_is_a_verb_of_the_module() -> None:
    assert set(CALLS) == set(transitions.VERBS) - {"create"}


@pytest.mark.django_db
@pytest.mark.parametrize(("from_status", "to_status"), list(itertools.product(S.values, S.values)))
def test_move__every_pair_is_allowed_or_refused_as_the_table_says(
    from_status: str, to_status: str
) -> None:
    """An allowed pair moves through its verb with one event (carrying the queue when
    it is an attempt's outcome, models.TaskEvent.queue; a hand-out's is the task
    row's, then its outcome's, tasks.events); any verb that could reach
    `to_status` refuses (InvalidTransition) or skips a task in another status."""
    task = TaskFactory(status=from_status)
    events_before = TaskEvent.objects.filter(task=task).count()
    allowed = (from_status, to_status) in MOVES
    assert is_allowed(from_status, to_status) == allowed
    if allowed:
        with transaction.atomic():
            MOVES[(from_status, to_status)](task)
        task.refresh_from_db()
        assert task.status == to_status
        rows = list(TaskEvent.objects.filter(task=task).order_by("id"))
        chain = events.chain(task, 50)
        assert (chain[-1].from_status, chain[-1].to_status) == (from_status, to_status)
        if (from_status, to_status) == CLAIM:
            assert len(rows) == events_before
            assert (chain[-1].at, chain[-1].worker_id) == (task.claimed_at, task.claimed_by)
            return
        assert len(rows) == events_before + 1
        assert (rows[-1].from_status, rows[-1].to_status) == (from_status, to_status)
        outcome = from_status == S.EXECUTING
        assert rows[-1].queue_id == (task.queue_id if outcome else None)
        assert rows[-1].claimed_at == (task.claimed_at if outcome else None)
        return
    reaching = [
        name
        for name, edges in transitions.VERBS.items()
        if name in CALLS and any(to == to_status for _, to in edges)
    ]
    for name in reaching:
        try:
            with transaction.atomic():
                CALLS[name](Task.objects.select_related("queue").get(pk=task.pk))
        except InvalidTransition:
            pass
        task.refresh_from_db()
        assert task.status == from_status, name
        assert TaskEvent.objects.filter(task=task).count() == events_before, name


@pytest.mark.django_db
def test_move__refuses_a_row_whose_status_changed_under_it() -> None:
    task = TaskFactory()
    stale = Task.objects.get(pk=task.pk)
    with transaction.atomic():
        transitions.cancel([task])
    with pytest.raises(InvalidTransition), transaction.atomic():
        transitions.cancel([stale])
    assert Task.objects.get(pk=task.pk).status == S.CANCELLED


@pytest.mark.django_db
def test_create__returns_the_tasks_as_their_rows_are() -> None:
    """Regression for issue 9: create answered `pending` for a row it had made `claimed`."""
    queue = QueueFactory()
    now = timezone.now()
    due = transitions.NewTask(queue, 1, 5, now, 3)
    later = transitions.NewTask(queue, 2, 5, now + timedelta(hours=1), 3)
    with transaction.atomic():
        stored = transitions.create([due, later], now=now, buffer=True)
    assert [t.payload for t in stored] == [1, 2]
    for task in stored:
        row = Task.objects.get(pk=task.pk)
        assert (task.status, task.attempts, task.created_at) == (
            row.status,
            row.attempts,
            row.created_at,
        )
        assert not task._state.adding
    assert [t.status for t in stored] == [S.CLAIMED, S.PENDING]


@pytest.mark.django_db
def test_create__the_task_row_records_the_null_to_pending_event() -> None:
    task = TaskFactory()
    assert not TaskEvent.objects.filter(task=task).exists()
    [event] = events.chain(task, 10)
    assert (event.from_status, event.to_status, event.attempt) == (None, S.PENDING, 0)
    assert (event.at, event.worker_id, event.error) == (task.created_at, None, None)


@pytest.mark.django_db
def test_create__buffered_the_task_row_records_both_moves() -> None:
    """A task the enqueue put into the buffer has no event row until it moves on;
    its chain is rebuilt from its row, and stays so after later moves."""
    queue = QueueFactory()
    now = timezone.now()
    [task, later] = transitions.create(
        [
            transitions.NewTask(queue, {"n": 1}, 5, now, 3),
            transitions.NewTask(queue, {"n": 2}, 5, now, 3),
        ],
        buffer=True,
    )
    assert not TaskEvent.objects.filter(task_id__in=[task.pk, later.pk]).exists()
    task.refresh_from_db()
    made = [(e.from_status, e.to_status) for e in events.chain(task, 10)]
    assert made == [(None, S.PENDING), (S.PENDING, S.CLAIMED)]
    assert {(e.at, e.attempt, e.worker_id) for e in events.chain(task, 10)} == {
        (task.created_at, 0, None)
    }
    transitions.hand_out([str(task.pk)], worker_id="w-1")
    transitions.unbuffer([Task.objects.get(pk=later.pk)])
    for moved, last in ((task, (S.CLAIMED, S.EXECUTING)), (later, (S.CLAIMED, S.PENDING))):
        moved.refresh_from_db()
        chain = [(e.from_status, e.to_status) for e in events.chain(moved, 10)]
        assert chain == [(None, S.PENDING), (S.PENDING, S.CLAIMED), last]


@pytest.mark.django_db
def test_create__pending_then_buffered_by_a_dispatcher_stores_that_move() -> None:
    task = TaskFactory()  # pending
    transitions.buffer_due(task.queue, limit=10)
    task.refresh_from_db()
    assert task.status == S.CLAIMED
    [stored] = TaskEvent.objects.filter(task=task)
    assert (stored.from_status, stored.to_status) == (S.PENDING, S.CLAIMED)
    chain = [(e.from_status, e.to_status) for e in events.chain(task, 10)]
    assert chain == [(None, S.PENDING), (S.PENDING, S.CLAIMED)]


@pytest.mark.django_db
def test_chain__a_creation_stored_by_an_earlier_version_is_shown_once() -> None:
    task = TaskFactory()  # pending
    TaskEvent.objects.create(
        task=task, at=task.created_at, from_status=None, to_status=S.PENDING, attempt=0
    )
    transitions.buffer_due(task.queue, limit=10)
    task.refresh_from_db()
    chain = [(e.from_status, e.to_status) for e in events.chain(task, 10)]
    assert chain == [(None, S.PENDING), (S.PENDING, S.CLAIMED)]


@pytest.mark.django_db
def test_chain__each_attempt_s_claim_from_the_task_row_then_from_its_outcome() -> None:
    """Two attempts (a retry, then an ack): a row per outcome, none per hand-out;
    while an attempt runs its claim is the task row's, then its outcome row's,
    with the same time, worker and attempt."""
    task = TaskFactory(status=S.EXECUTING, worker_id="w-1")
    running = events.chain(task, 50)
    assert not TaskEvent.objects.filter(task=task).exists()
    with transaction.atomic():
        transitions.fail(task, error="again", retry_after_seconds=0)
    transitions.promote([Task.objects.get(pk=task.pk)])
    assert transitions.buffer_due(task.queue, limit=1)
    [handed] = transitions.hand_out([str(task.pk)], worker_id="w-2")
    second = events.chain(handed, 50)
    [acked] = transitions.ack([(str(task.pk), None, None)], worker_id="w-2")
    finished = events.chain(acked, 50)
    moves = [(e.from_status, e.to_status, e.worker_id, e.attempt) for e in finished]
    assert moves == [
        (None, S.PENDING, None, 0),
        (S.PENDING, S.CLAIMED, None, 0),
        (S.CLAIMED, S.EXECUTING, "w-1", 1),
        (S.EXECUTING, S.RETRY, "w-1", 1),
        (S.RETRY, S.PENDING, None, 1),
        (S.PENDING, S.CLAIMED, None, 1),
        (S.CLAIMED, S.EXECUTING, "w-2", 2),
        (S.EXECUTING, S.DONE, "w-2", 2),
    ]
    same = [(e.from_status, e.to_status, e.worker_id, e.attempt, e.at) for e in finished]
    assert same[:3] == [(e.from_status, e.to_status, e.worker_id, e.attempt, e.at) for e in running]
    assert same[:7] == [(e.from_status, e.to_status, e.worker_id, e.attempt, e.at) for e in second]
    assert [e.key for e in finished] == sorted(e.key for e in finished)
    rows = TaskEvent.objects.filter(task=task)
    assert sorted(r.to_status for r in rows) == sorted([S.RETRY, S.PENDING, S.CLAIMED, S.DONE])


@pytest.mark.django_db
def test_chain__a_claim_stored_by_an_earlier_version_is_shown_once() -> None:
    task = TaskFactory(status=S.EXECUTING, worker_id="w-1")
    TaskEvent.objects.create(
        task=task,
        at=task.claimed_at,
        from_status=S.CLAIMED,
        to_status=S.EXECUTING,
        worker_id="w-1",
        attempt=1,
    )
    assert [e.to_status for e in events.chain(task, 50)].count(S.EXECUTING) == 1
    [acked] = transitions.ack([(str(task.pk), None, None)], worker_id="w-1")
    chain = [(e.from_status, e.to_status) for e in events.chain(acked, 50)]
    assert chain == [
        (None, S.PENDING),
        (S.PENDING, S.CLAIMED),
        (S.CLAIMED, S.EXECUTING),
        (S.EXECUTING, S.DONE),
    ]


@pytest.mark.django_db
def test_hand_out__counts_the_attempt_and_starts_the_lease() -> None:
    task = TaskFactory(status=S.EXECUTING, worker_id="w-9")
    assert task.attempts == 1
    assert task.claimed_by == "w-9"
    assert task.heartbeat_at == task.claimed_at is not None


def _synchronous_commit() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        value: str = cursor.fetchone()[0]
    return value


@pytest.mark.django_db(transaction=True)
def test_hand_out__commits_without_waiting_for_the_flush_and_only_itself() -> None:
    """A hand-out's transaction turns synchronous_commit off for itself alone
    (tasks.sql.HAND_OUT): the setting must not outlive it on the connection,
    which the next request's enqueue or ack will use."""
    first, second = TaskFactory(status=S.CLAIMED), TaskFactory(status=S.CLAIMED)
    # As a production server has it (make test's own server turns it off for speed).
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit = on")
    try:
        with transaction.atomic():
            assert _synchronous_commit() == "on"
            [handed] = transitions.hand_out([str(first.pk)], worker_id="w")
            assert _synchronous_commit() == "off"
        assert _synchronous_commit() == "on"
        # In autocommit the statement is its own transaction.
        transitions.hand_out([str(second.pk)], worker_id="w")
        assert _synchronous_commit() == "on"
    finally:
        with connection.cursor() as cursor:
            cursor.execute("RESET synchronous_commit")
    assert handed.status == S.EXECUTING
    assert Task.objects.get(pk=second.pk).status == S.EXECUTING


@pytest.mark.django_db
def test_fail__last_attempt_goes_dead_with_a_dlq_entry_in_the_same_transaction() -> None:
    task = TaskFactory(status=S.EXECUTING, max_retries=0)
    with transaction.atomic():
        transitions.fail(task, error="kaput")
    task.refresh_from_db()
    assert task.status == S.DEAD
    assert task.finished_at is not None
    entry = DeadLetterTask.objects.get(task=task)
    assert (entry.last_error, entry.attempts, entry.replay_count) == ("kaput", 1, 0)


@pytest.mark.django_db
def test_fail__retry_after_overrides_the_backoff() -> None:
    task = TaskFactory(status=S.EXECUTING)
    with transaction.atomic():
        transitions.fail(task, error="later", retry_after_seconds=120)
    task.refresh_from_db()
    assert task.status == S.RETRY
    assert 119 <= (task.scheduled_at - task.updated_at).total_seconds() <= 121


@pytest.mark.django_db
def test_replay__resets_attempts_and_the_dlq_entry_counts_the_replay() -> None:
    task = TaskFactory(status=S.DEAD)
    with transaction.atomic():
        transitions.replay([task])
    task.refresh_from_db()
    assert (task.status, task.attempts, task.finished_at) == (S.PENDING, 0, None)
    entry = DeadLetterTask.objects.get(task=task)
    assert entry.replay_count == 1
    assert entry.replayed_at is not None


@pytest.mark.django_db(transaction=True)
def test_log__one_json_line_per_transition_after_commit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="taskforge.transitions")
    task = TaskFactory(status=S.DONE, worker_id="w-1")
    records = [r for r in caplog.records if r.name == "taskforge.transitions"]
    chain = [(r.from_status, r.to_status) for r in records]  # type: ignore[attr-defined]
    assert chain == [
        (None, S.PENDING),
        (S.PENDING, S.CLAIMED),
        (S.CLAIMED, S.EXECUTING),
        (S.EXECUTING, S.DONE),
    ]
    stored = events.chain(task, 10)
    assert [(e.from_status, e.to_status) for e in stored] == chain
    from taskforge.lib.logging import JsonFormatter

    line = json.loads(JsonFormatter().format(records[-1]))
    assert line["event"] == "task.acked"
    assert line["task_id"] == str(task.pk)
    assert line["queue"] == task.queue.name
    assert line["worker_id"] == "w-1"
    assert line["attempt"] == 1
    assert isinstance(line["duration_ms"], float)
    assert line["ts"].endswith("Z")


@pytest.mark.django_db
def test_log__nothing_is_logged_for_a_rolled_back_transition(
    caplog: pytest.LogCaptureFixture,
) -> None:
    task = TaskFactory()
    caplog.set_level(logging.INFO, logger="taskforge.transitions")
    caplog.clear()
    with pytest.raises(RuntimeError), transaction.atomic():
        transitions.cancel([task])
        raise RuntimeError("roll back")
    assert not [r for r in caplog.records if r.name == "taskforge.transitions"]


def _writes_status(node: ast.AST) -> bool:
    """True for `x.status = ...`, `.update(status=...)`, `Task(status=...)` and the like."""
    if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(isinstance(t, ast.Attribute) and t.attr == "status" for t in targets)
    if isinstance(node, ast.Call) and any(kw.arg == "status" for kw in node.keywords):
        func = node.func
        writer = {"update", "create", "update_or_create", "get_or_create", "Task"}
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        return name in writer
    return False


# The server's code: the SDK (taskforge_client) has an HTTP `status` of its own.
SERVER_PACKAGES = ("taskforge", "queues", "tasks", "workers", "dlq", "dashboard")

# SQL that writes a task's status: an INSERT of tasks, or an UPDATE of them
# whose SET names status.
_SQL_STATUS_WRITE = re.compile(
    r"INSERT\s+INTO\s+tasks_task\s*\("
    r"|UPDATE\s+tasks_task\b(?:(?!\bSET\b).)*\bSET\b"
    r"(?:(?!\bWHERE\b|\bFROM\b|\bRETURNING\b).)*?\bstatus\s*=",
    re.IGNORECASE | re.DOTALL,
)


def _sql_writes_status(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and bool(_SQL_STATUS_WRITE.search(node.value))
    )


def test_status_is_written_only_by_the_transitions_module() -> None:
    offenders = []
    paths = [path for package in SERVER_PACKAGES for path in (ROOT / package).rglob("*.py")]
    paths += list(ROOT.glob("*.py"))
    for path in paths:
        rel = path.relative_to(ROOT)
        parts = set(rel.parts)
        if parts & {".venv", "migrations", "tests", "build"} or rel.name == "conftest.py":
            continue
        if str(rel) in ("tasks/transitions.py", "tasks/sql.py"):
            continue
        tree = ast.parse(path.read_text(), filename=str(rel))
        offenders += [
            f"{rel}:{getattr(n, 'lineno', 0)}"
            for n in ast.walk(tree)
            if _writes_status(n) or _sql_writes_status(n)
        ]
    assert offenders == []


def test_status_guard__sees_status_writes_inside_sql_strings() -> None:
    """The guard above would catch a status UPDATE hidden in a SQL string."""
    tree = ast.parse('Q = """UPDATE tasks_task t\n SET heartbeat_at = now(), status = \'done\'"""')
    assert any(_sql_writes_status(n) for n in ast.walk(tree))
    tree = ast.parse("Q = \"UPDATE tasks_task SET heartbeat_at = now() WHERE status = 'x'\"")
    assert not any(_sql_writes_status(n) for n in ast.walk(tree))
