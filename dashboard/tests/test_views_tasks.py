"""The task inspector and the task page."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dashboard import queries
from dashboard.tests.pages import ANY_ID, D, flashed
from queues.tests.factories import QueueFactory
from tasks import transitions
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory
from tasks.tests.test_plans import listed_sorting_off
from workers import heartbeats

pytestmark = pytest.mark.django_db

S = TaskStatus


# Task inspector ----------------------------------------------------------------------


def _listed(response: Any) -> list[uuid.UUID]:
    return [row["task"].pk for row in response.context["rows"]]


def test_tasks__newest_first_across_queues(staff_client: Client) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    made = [TaskFactory(queue=a), TaskFactory(queue=b), TaskFactory(queue=a)]

    response = staff_client.get(f"{D}/tasks/")

    assert _listed(response) == [t.pk for t in reversed(made)]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("queue=a", ["a-pending", "a-dead", "a-done-w2"]),
        ("status=dead", ["b-dead", "a-dead"]),
        ("queue=a&status=dead", ["a-dead"]),
        ("worker=w2", ["b-dead", "a-done-w2"]),
        ("worker=w2&queue=a", ["a-done-w2"]),
        ("worker=w2&status=dead", ["b-dead"]),
    ],
)
def test_tasks__filters(query: str, expected: list[str], staff_client: Client) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    made = {
        "a-done-w2": TaskFactory(queue=a, status="done", worker_id="w2"),
        "a-dead": TaskFactory(queue=a, status="dead", worker_id="w1"),
        "b-dead": TaskFactory(queue=b, status="dead", worker_id="w2"),
        "a-pending": TaskFactory(queue=a),
    }
    # Newest first: reverse creation order among the matches.
    order = list(made)[::-1]
    expected_sorted = [name for name in order if name in expected]

    response = staff_client.get(f"{D}/tasks/?{query}")

    assert response.status_code == 200
    assert _listed(response) == [made[name].pk for name in expected_sorted]


def test_tasks__a_status_is_listed_with_sorting_off(staff_client: Client) -> None:
    """The walk of task_not_done_idx whatever the statistics (pg.ORDERED_BY_INDEX,
    tasks/tests/test_plans.py), with a queue or over all of them."""
    TaskFactory(queue=QueueFactory(name="a"))
    assert listed_sorting_off(staff_client, f"{D}/tasks/?queue=a&status=pending")
    assert listed_sorting_off(staff_client, f"{D}/tasks/?status=pending")
    assert not listed_sorting_off(staff_client, f"{D}/tasks/?queue=a")


def test_tasks__time_range_is_exclusive(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    old, mid, new = (TaskFactory(queue=queue) for _ in range(3))
    for task, minutes in [(old, 30), (mid, 20), (new, 10)]:
        Task.objects.filter(pk=task.pk).update(
            created_at=timezone.now() - timedelta(minutes=minutes)
        )
    after = (timezone.now() - timedelta(minutes=25)).strftime("%Y-%m-%dT%H:%M")
    before = (timezone.now() - timedelta(minutes=15)).strftime("%Y-%m-%dT%H:%M")

    response = staff_client.get(f"{D}/tasks/?created_after={after}&created_before={before}")

    assert _listed(response) == [mid.pk]


def test_tasks__keyset_pages_cover_every_task_once(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    made = [TaskFactory(queue=a if n % 2 else b) for n in range(5)]
    # Two tasks with the same created_at: the id breaks the tie.
    Task.objects.filter(pk=made[3].pk).update(created_at=made[2].created_at)

    seen: list[uuid.UUID] = []
    url: str | None = f"{D}/tasks/?status=pending"
    pages = 0
    while url:
        response = staff_client.get(url)
        seen += _listed(response)
        url = response.context["next_url"]
        pages += 1
    assert pages == 3
    assert sorted(seen) == sorted(t.pk for t in made)
    assert len(seen) == len(set(seen))


def test_tasks__search_by_id_opens_the_task(staff_client: Client) -> None:
    task = TaskFactory()

    response = staff_client.get(f"{D}/tasks/?id=%20{task.pk}%20")

    assert response.status_code == 302
    assert response["Location"] == f"{D}/tasks/{task.pk}"


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("id=nope", "Not a task id"),
        (f"id={ANY_ID}", "No task has this id"),
        ("status=sleeping", "Select a valid choice"),
        ("queue=nope", "Select a valid choice"),
        ("created_after=yesterday", "Enter a valid date/time"),
        ("cursor=garbage", "not valid any more"),
    ],
)
def test_tasks__bad_input_is_explained_not_a_500(
    query: str, message: str, staff_client: Client
) -> None:
    TaskFactory()

    response = staff_client.get(f"{D}/tasks/?{query}")

    assert response.status_code == 200
    assert message in response.content.decode()


def test_task_page__shows_payload_transitions_error_and_dlq_entry(staff_client: Client) -> None:
    task = TaskFactory(status="dead", worker_id="w-9", payload={"order": {"id": 7, "tags": ["x"]}})

    response = staff_client.get(f"{D}/tasks/{task.pk}")

    assert response.status_code == 200
    html = response.content.decode()
    assert "&quot;order&quot;: {\n    &quot;id&quot;: 7," in html  # pretty JSON
    events = [row["event"] for row in response.context["events"]]
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, S.PENDING),
        (S.PENDING, S.CLAIMED),
        (S.CLAIMED, S.EXECUTING),
        (S.EXECUTING, S.DEAD),
    ]
    assert events[-1].worker_id == "w-9" and events[-1].error == "boom"
    assert 'id="last-error"' in html
    assert "replayed 0\u00d7" in html
    assert response.context["is_dead"] and not response.context["can_cancel"]


def test_task_page__shows_the_heartbeats_of_the_current_attempt_only(
    staff_client: Client, redis_client: Any
) -> None:
    task = TaskFactory(status="executing")
    assert task.claimed_at is not None
    heartbeats.record([task.pk], task.claimed_at - timedelta(seconds=30))  # an earlier attempt
    for seconds in (10, 20, 65):
        heartbeats.record([task.pk], task.claimed_at + timedelta(seconds=seconds))

    response = staff_client.get(f"{D}/tasks/{task.pk}")

    beats = response.context["beats"]
    assert [b["gap"] for b in beats] == ["+45.0s", "+10.0s", None]
    assert [b["late"] for b in beats] == [True, False, False]
    assert "Lease expires at" in response.content.decode()


def test_task_page__says_when_the_heartbeat_history_cannot_be_read(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = TaskFactory(status="executing")
    monkeypatch.setattr(heartbeats, "history", lambda *a, **k: None)

    response = staff_client.get(f"{D}/tasks/{task.pk}")

    assert "Heartbeat history is unavailable" in response.content.decode()


def test_task_page__unknown_task_is_an_html_404(staff_client: Client) -> None:
    response = staff_client.get(f"{D}/tasks/{ANY_ID}")

    assert response.status_code == 404
    assert "There is no task" in response.content.decode()


def test_task_status__reports_a_version_that_changes_when_the_task_moves(
    staff_client: Client,
) -> None:
    task = TaskFactory()
    before = staff_client.get(f"{D}/tasks/{task.pk}/status").json()
    page = staff_client.get(f"{D}/tasks/{task.pk}")
    assert page.context["watch_version"] == before["version"]

    staff_client.post(f"{D}/tasks/{task.pk}/cancel")
    after = staff_client.get(f"{D}/tasks/{task.pk}/status").json()

    assert after["status"] == S.CANCELLED
    assert after["version"] != before["version"]


@pytest.mark.parametrize("status", [S.PENDING, S.CLAIMED, S.RETRY])
def test_cancel__moves_a_waiting_task_through_the_transition(
    status: str, staff_client: Client
) -> None:
    task = TaskFactory(status=status)

    response = staff_client.post(f"{D}/tasks/{task.pk}/cancel", follow=True)

    task.refresh_from_db()
    assert task.status == S.CANCELLED
    assert TaskEvent.objects.filter(task=task, to_status=S.CANCELLED).count() == 1
    assert flashed(response) == ["Task cancelled."]


@pytest.mark.parametrize("status", [S.EXECUTING, S.DONE, S.DEAD])
def test_cancel__refuses_a_task_that_ran(status: str, staff_client: Client) -> None:
    task = TaskFactory(status=status)

    response = staff_client.post(f"{D}/tasks/{task.pk}/cancel", follow=True)

    task.refresh_from_db()
    assert task.status == status
    assert "can no longer be cancelled" in flashed(response)[0]


def test_cancel__locks_the_row_and_calls_transitions_cancel(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    task = TaskFactory()
    seen: list[Any] = []
    real = transitions.cancel

    def spy(tasks: Any, **kwargs: Any) -> None:
        from django.db import connection

        seen.append(connection.in_atomic_block)
        real(tasks, **kwargs)

    monkeypatch.setattr(transitions, "cancel", spy)

    staff_client.post(f"{D}/tasks/{task.pk}/cancel")

    assert seen == [True]


def test_task_detail__a_push_tasks_attempts_show_status_body_and_time(staff_client: Client) -> None:
    queue = QueueFactory(
        name="hooks", push={"url": "https://h.example/x?k=1", "timeout_seconds": 5, "headers": {}}
    )
    [task] = transitions.create([transitions.NewTask(queue, {"n": 1}, 5, timezone.now(), 3)])
    Task.objects.filter(pk=task.pk).update(status=S.CLAIMED)
    start = timezone.now()
    [task] = transitions.hand_out([str(task.pk)], worker_id="push:host-1", now=start, push=True)
    task = Task.objects.select_related("queue").get(pk=task.pk)
    transitions.fail(task, error="HTTP 503: upstream down", now=start + timedelta(milliseconds=42))

    response = staff_client.get(f"{D}/tasks/{task.pk}")

    assert response.context["push_url"] == "https://h.example/x"
    [row] = response.context["push_attempts"]
    assert (row["attempt"], row["outcome"], row["answer"], row["took"], row["by"]) == (
        1,
        "503",
        "upstream down",
        "42 ms",
        "push:host-1",
    )
    html = response.content.decode()
    assert 'id="push"' in html and 'id="heartbeats"' not in html
    assert "upstream down" in html and "42 ms" in html


def test_tasks__fairness_key_filter_and_the_queue_top_keys(staff_client: Client) -> None:
    q = QueueFactory(name="tenants")
    for _ in range(3):
        TaskFactory(queue=q, fairness_key="big")
    TaskFactory(queue=q, fairness_key="small")
    TaskFactory(queue=q, fairness_key="small", status=S.EXECUTING)
    TaskFactory(queue=q)

    filtered = staff_client.get(f"{D}/tasks/?queue=tenants&fairness_key=small")
    assert len(_listed(filtered)) == 2
    shown = [(k.key, k.pending, k.executing) for k in filtered.context["top_keys"]]
    assert shown == [("big", 3, 0), ("small", 1, 1), (None, 1, 0)]
    assert b'id="top-keys"' in filtered.content
    # Without a queue: no keys panel; a NUL in the filter is refused, not a 5xx.
    assert staff_client.get(f"{D}/tasks/?fairness_key=big").context["top_keys"] == []
    assert staff_client.get(f"{D}/tasks/?fairness_key=a%00b").status_code in (200, 400)
