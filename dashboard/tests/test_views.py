"""Dashboard pages and actions through Django's test client.

Every page needs a staff login; every action is a CSRF-checked POST that
changes state through the domain layer (the status moves come with their
TaskEvent rows, which only `tasks.transitions` writes).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.utils import timezone

from dashboard import queries
from dlq import services as dlq_services
from dlq.models import DeadLetterTask
from queues import services as queue_services
from queues.models import Queue
from queues.tests.factories import QueueFactory
from tasks import transitions
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory
from workers import heartbeats
from workers.models import Worker

pytestmark = pytest.mark.django_db

S = TaskStatus
D = "/admin/dashboard"
ANY_ID = "0b5e6a2c-8f5d-4b8e-9d0a-6f1f2a3b4c5d"

PAGES = [
    f"{D}/",
    f"{D}/stream",
    f"{D}/tasks/",
    f"{D}/tasks/{ANY_ID}",
    f"{D}/tasks/{ANY_ID}/status",
    f"{D}/dlq/",
    f"{D}/workers/",
    f"{D}/queues/q/purge",
]
ACTIONS = [
    f"{D}/queues/q/pause",
    f"{D}/queues/q/resume",
    f"{D}/queues/q/purge",
    f"{D}/tasks/{ANY_ID}/cancel",
    f"{D}/dlq/replay",
    f"{D}/dlq/discard",
    f"{D}/dlq/{ANY_ID}/replay",
    f"{D}/dlq/{ANY_ID}/discard",
]


def _messages(response: Any) -> list[str]:
    return [str(m) for m in response.context["messages"]]


# Access ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_access__anonymous_is_sent_to_the_admin_login(path: str) -> None:
    QueueFactory(name="q")
    method = Client().post if path in ACTIONS else Client().get

    response = method(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_access__a_logged_in_user_who_is_not_staff_is_refused(path: str) -> None:
    QueueFactory(name="q")
    client = Client()
    client.force_login(User.objects.create_user("visitor", password="x"))
    method = client.post if path in ACTIONS else client.get

    response = method(path)

    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    assert Queue.objects.get(name="q").paused is False


@pytest.mark.parametrize("path", [p for p in ACTIONS if not p.endswith("/purge")])
def test_actions__answer_405_to_get(path: str, staff_client: Client) -> None:
    QueueFactory(name="q")

    assert staff_client.get(path).status_code == 405


@pytest.mark.parametrize("path", [f"{D}/", f"{D}/tasks/", f"{D}/dlq/", f"{D}/workers/"])
def test_pages__answer_405_to_post(path: str, staff_client: Client) -> None:
    assert staff_client.post(path).status_code == 405


@pytest.mark.parametrize("path", ACTIONS)
def test_actions__refuse_a_post_without_the_csrf_token(path: str, csrf_client: Client) -> None:
    QueueFactory(name="q")

    response = csrf_client.post(path, {"confirm": "q", "all": "1"})

    assert response.status_code == 403
    assert Queue.objects.get(name="q").paused is False


def test_actions__accept_a_post_with_the_csrf_token(csrf_client: Client) -> None:
    QueueFactory(name="q")
    csrf_client.get(f"{D}/")  # sets the CSRF cookie, as a browser would

    response = csrf_client.post(
        f"{D}/queues/q/pause", {"csrfmiddlewaretoken": csrf_client.cookies["csrftoken"].value}
    )

    assert response.status_code == 302
    assert Queue.objects.get(name="q").paused is True


# Queue overview ----------------------------------------------------------------------


def test_overview__shows_every_queue_with_depth_rates_and_health(staff_client: Client) -> None:
    good = QueueFactory(name="good")
    bad = QueueFactory(name="bad")
    TaskFactory(queue=good)
    TaskFactory(queue=good, status="done")
    for _ in range(3):
        TaskFactory(queue=bad, status="retry")
    TaskFactory(queue=bad, status="dead")

    response = staff_client.get(f"{D}/")

    assert response.status_code == 200
    rows = {row["name"]: row for row in response.context["snapshot"]["queues"]}
    assert rows["good"]["depth"]["pending"] == 1
    assert rows["good"]["health"] == "ok"
    assert rows["good"]["throughput_per_second"] > 0
    assert rows["bad"]["health"] == "crit"
    assert rows["bad"]["error_rate"] == 1.0
    assert rows["bad"]["dlq_depth"] == 1
    assert rows["bad"]["depth"]["retry"] == 3
    html = response.content.decode()
    assert 'data-queue="good"' in html and 'data-queue="bad"' in html
    assert "1 of 2 queues needs attention" in html
    assert "100% of attempts failing" in html
    assert 'id="snapshot-data"' in html


def test_overview__without_queues_says_how_to_make_one(staff_client: Client) -> None:
    response = staff_client.get(f"{D}/")

    assert "No queues yet" in response.content.decode()


def test_overview__links_only_local_static_files(staff_client: Client) -> None:
    QueueFactory(name="q")
    html = staff_client.get(f"{D}/").content.decode()

    assert "/static/dashboard/dashboard.css" in html
    assert "/static/dashboard/dashboard.js" in html
    for external in ("http://", "https://", "//cdn", "fonts.googleapis"):
        assert f'src="{external}' not in html and f'href="{external}' not in html


def test_static__css_and_js_are_served(staff_client: Client) -> None:
    for path in ("/static/dashboard/dashboard.css", "/static/dashboard/dashboard.js"):
        response = staff_client.get(path)
        assert response.status_code == 200
        b"".join(response.streaming_content)  # type: ignore[attr-defined]


def test_pause_and_resume__go_through_queue_services(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    QueueFactory(name="q")
    calls: list[dict[str, Any]] = []
    real = queue_services.update_queue

    def spy(queue: Queue, **fields: Any) -> Queue:
        calls.append(fields)
        return real(queue, **fields)

    monkeypatch.setattr(queue_services, "update_queue", spy)

    response = staff_client.post(f"{D}/queues/q/pause", follow=True)
    assert Queue.objects.get(name="q").paused is True
    assert "Paused queue q" in _messages(response)[0]
    staff_client.post(f"{D}/queues/q/resume")
    assert Queue.objects.get(name="q").paused is False
    assert calls == [{"paused": True}, {"paused": False}]


def test_pause__returns_to_a_local_next_and_ignores_a_foreign_one(staff_client: Client) -> None:
    QueueFactory(name="q")

    local = staff_client.post(f"{D}/queues/q/pause", {"next": f"{D}/tasks/?queue=q"})
    foreign = staff_client.post(f"{D}/queues/q/resume", {"next": "https://evil.example/"})

    assert local["Location"] == f"{D}/tasks/?queue=q"
    assert foreign["Location"] == f"{D}/"


def test_pause__unknown_queue_is_404(staff_client: Client) -> None:
    assert staff_client.post(f"{D}/queues/nope/pause").status_code == 404


def test_purge__get_shows_what_would_be_cancelled(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    TaskFactory(queue=queue)
    TaskFactory(queue=queue, status="retry")

    response = staff_client.get(f"{D}/queues/q/purge")

    assert response.status_code == 200
    html = response.content.decode()
    assert "Purge queue “q”?" in html
    assert 'name="confirm"' in html
    assert Task.objects.filter(status=S.CANCELLED).count() == 0


def test_purge__needs_the_typed_queue_name(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    task = TaskFactory(queue=queue)

    response = staff_client.post(f"{D}/queues/q/purge", {"confirm": "wrong"})

    assert response["Location"] == f"{D}/queues/q/purge"
    task.refresh_from_db()
    assert task.status == S.PENDING


def test_purge__cancels_tasks_not_started_and_keeps_the_others(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    waiting = [TaskFactory(queue=queue), TaskFactory(queue=queue, status="retry")]
    running = TaskFactory(queue=queue, status="executing")
    dead = TaskFactory(queue=queue, status="dead")

    response = staff_client.post(f"{D}/queues/q/purge", {"confirm": "q"}, follow=True)

    assert "2 tasks cancelled" in _messages(response)[0]
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert [statuses[t.pk] for t in waiting] == [S.CANCELLED, S.CANCELLED]
    assert statuses[running.pk] == S.EXECUTING
    assert statuses[dead.pk] == S.DEAD
    assert TaskEvent.objects.filter(to_status=S.CANCELLED).count() == 2


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
    assert _messages(response) == ["Task cancelled."]


@pytest.mark.parametrize("status", [S.EXECUTING, S.DONE, S.DEAD])
def test_cancel__refuses_a_task_that_ran(status: str, staff_client: Client) -> None:
    task = TaskFactory(status=status)

    response = staff_client.post(f"{D}/tasks/{task.pk}/cancel", follow=True)

    task.refresh_from_db()
    assert task.status == status
    assert "can no longer be cancelled" in _messages(response)[0]


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


# Dead-letter queue -------------------------------------------------------------------


def test_dlq__lists_dead_tasks_only_with_their_replay_count(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    dead = TaskFactory(queue=queue, status="dead")
    twice = TaskFactory(queue=queue, status="dead")
    dlq_services.replay_one(queue, str(twice.pk))
    twice.refresh_from_db()
    from tasks.tests.factories import walk

    walk(twice, "dead")  # died again
    replayed = TaskFactory(queue=queue, status="dead")
    dlq_services.replay_one(queue, str(replayed.pk))

    response = staff_client.get(f"{D}/dlq/")

    entries = [row["entry"] for row in response.context["rows"]]
    assert {e.task_id for e in entries} == {dead.pk, twice.pk}
    assert {e.task_id: e.replay_count for e in entries} == {dead.pk: 0, twice.pk: 1}


def test_dlq__filters_by_queue_and_time(staff_client: Client) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    old = TaskFactory(queue=a, status="dead")
    new = TaskFactory(queue=a, status="dead")
    other = TaskFactory(queue=b, status="dead")
    DeadLetterTask.objects.filter(task_id=old.pk).update(
        died_at=timezone.now() - timedelta(hours=2)
    )
    hour_ago = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")

    def listed(query: str) -> set[uuid.UUID]:
        response = staff_client.get(f"{D}/dlq/?{query}")
        return {row["entry"].task_id for row in response.context["rows"]}

    assert listed("") == {old.pk, new.pk, other.pk}
    assert listed("queue=a") == {old.pk, new.pk}
    assert listed(f"queue=a&died_after={hour_ago}") == {new.pk}
    assert listed(f"died_before={hour_ago}") == {old.pk}


def test_dlq__keyset_pages(staff_client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(queries, "PAGE_SIZE", 2)
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    dead = [TaskFactory(queue=a if n % 2 else b, status="dead") for n in range(5)]

    seen: list[uuid.UUID] = []
    url: str | None = f"{D}/dlq/"
    while url:
        response = staff_client.get(url)
        seen += [row["entry"].task_id for row in response.context["rows"]]
        url = response.context["next_url"]
    assert seen == [t.pk for t in reversed(dead)]


def test_dlq_replay__selected_ids_across_queues(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    first, second = TaskFactory(queue=a, status="dead"), TaskFactory(queue=b, status="dead")
    kept = TaskFactory(queue=a, status="dead")
    calls: list[tuple[str, list[str]]] = []
    real = dlq_services.replay_many

    def spy(queue: Queue, ids: Any) -> int:
        calls.append((queue.name, sorted(ids)))
        return real(queue, ids)

    monkeypatch.setattr(dlq_services, "replay_many", spy)

    response = staff_client.post(
        f"{D}/dlq/replay",
        {"ids": [str(first.pk), str(second.pk), "not-an-id", ANY_ID], "next": f"{D}/dlq/"},
        follow=True,
    )

    assert _messages(response) == ["Replayed 2 tasks."]
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert statuses[first.pk] == statuses[second.pk] == S.PENDING
    assert statuses[kept.pk] == S.DEAD
    assert sorted(calls) == [("a", [str(first.pk)]), ("b", [str(second.pk)])]
    assert DeadLetterTask.objects.get(task_id=first.pk).replay_count == 1


def test_dlq_replay__nothing_selected_is_a_warning(staff_client: Client) -> None:
    response = staff_client.post(f"{D}/dlq/replay", follow=True)

    assert "Select the tasks to replay first." in _messages(response)


def test_dlq_replay__all_of_one_queue(staff_client: Client) -> None:
    a, b = QueueFactory(name="a"), QueueFactory(name="b")
    in_a = [TaskFactory(queue=a, status="dead") for _ in range(3)]
    in_b = TaskFactory(queue=b, status="dead")

    response = staff_client.post(f"{D}/dlq/replay", {"all": "1", "queue": "a"}, follow=True)

    assert _messages(response) == ["Replayed 3 tasks."]
    assert set(Task.objects.filter(status=S.PENDING).values_list("pk", flat=True)) == {
        t.pk for t in in_a
    }
    in_b.refresh_from_db()
    assert in_b.status == S.DEAD


def test_dlq_replay__all_matching_a_time_range(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    old = TaskFactory(queue=queue, status="dead")
    new = TaskFactory(queue=queue, status="dead")
    DeadLetterTask.objects.filter(task_id=old.pk).update(
        died_at=timezone.now() - timedelta(hours=2)
    )
    hour_ago = (timezone.now() - timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M")

    staff_client.post(f"{D}/dlq/replay", {"all": "1", "died_after": hour_ago})

    statuses = dict(Task.objects.values_list("pk", "status"))
    assert statuses == {old.pk: S.DEAD, new.pk: S.PENDING}


def test_dlq_replay_one__and_a_task_no_longer_dead(staff_client: Client) -> None:
    task = TaskFactory(status="dead")

    first = staff_client.post(f"{D}/dlq/{task.pk}/replay", follow=True)
    again = staff_client.post(f"{D}/dlq/{task.pk}/replay", follow=True)

    task.refresh_from_db()
    assert task.status == S.PENDING and task.attempts == 0
    assert "Task replayed" in _messages(first)[0]
    assert "not dead any more" in _messages(again)[0]


def test_dlq_discard__selected_dead_tasks_are_gone_for_good(staff_client: Client) -> None:
    queue = QueueFactory(name="q")
    dead = [TaskFactory(queue=queue, status="dead") for _ in range(2)]
    alive = TaskFactory(queue=queue)

    response = staff_client.post(
        f"{D}/dlq/discard", {"ids": [str(t.pk) for t in dead] + [str(alive.pk)]}, follow=True
    )

    assert _messages(response) == ["Discarded 2 tasks for good."]
    assert list(Task.objects.values_list("pk", flat=True)) == [alive.pk]
    assert not DeadLetterTask.objects.exists()


def test_dlq_discard_one(staff_client: Client) -> None:
    task = TaskFactory(status="dead")

    response = staff_client.post(f"{D}/dlq/{task.pk}/discard")

    assert response.status_code == 302
    assert not Task.objects.filter(pk=task.pk).exists()
    assert staff_client.get(f"{D}/tasks/{task.pk}").status_code == 404


def test_dlq_discard_one__refuses_a_task_that_is_not_dead(staff_client: Client) -> None:
    task = TaskFactory(status="dead")
    dlq_services.replay_one(task.queue, str(task.pk))

    response = staff_client.post(f"{D}/dlq/{task.pk}/discard", follow=True)

    assert Task.objects.filter(pk=task.pk).exists()
    assert "nothing was discarded" in _messages(response)[0]


# Workers -----------------------------------------------------------------------------


def test_workers__active_and_stale_with_current_tasks(staff_client: Client, settings: Any) -> None:
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 30
    now = timezone.now()
    Worker.objects.create(worker_id="fresh", last_seen_at=now - timedelta(seconds=5))
    Worker.objects.create(worker_id="quiet", last_seen_at=now - timedelta(minutes=5))
    Worker.objects.create(worker_id="gone", last_seen_at=now - timedelta(hours=3))
    running = TaskFactory(status="executing", worker_id="fresh")
    TaskFactory(status="done", worker_id="fresh")

    response = staff_client.get(f"{D}/workers/")

    rows = {row["worker"].worker_id: row for row in response.context["rows"]}
    assert set(rows) == {"fresh", "quiet"}  # seen in the last hour, as GET /workers
    assert rows["fresh"]["stale"] is False and rows["quiet"]["stale"] is True
    assert rows["fresh"]["tasks"] == [{"id": str(running.pk), "url": f"{D}/tasks/{running.pk}"}]
    assert response.context["rows"][0]["worker"].worker_id == "quiet"  # stale first
    html = response.content.decode()
    assert 'class="is-stale" data-worker="quiet"' in html
