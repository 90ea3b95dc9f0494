"""The queue overview page and its actions."""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client

from dashboard.tests.pages import D, flashed
from queues import services as queue_services
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.audit.log import Actor
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

S = TaskStatus


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


def test_overview__shows_a_capped_queue_running_against_its_cap(staff_client: Client) -> None:
    capped = QueueFactory(name="capped", max_concurrency=10)
    QueueFactory(name="free")
    for _ in range(3):
        TaskFactory(queue=capped, status="executing")

    response = staff_client.get(f"{D}/")

    rows = {row["name"]: row for row in response.context["snapshot"]["queues"]}
    assert (rows["capped"]["max_concurrency"], rows["capped"]["text"]["executing"]) == (
        10,
        "3 / 10",
    )
    assert (rows["free"]["max_concurrency"], rows["free"]["text"]["executing"]) == (None, "0")
    html = response.content.decode()
    assert "3 / 10" in html and "at most 10 at once (max_concurrency)" in html


def test_overview__shows_a_push_queues_target_without_secrets(staff_client: Client) -> None:
    push = {"url": "https://user:pw@hooks.example.com/t?token=abc", "timeout_seconds": 30}
    QueueFactory(name="pushed", push={**push, "headers": {"Authorization": "Bearer x"}})
    QueueFactory(name="pulled")

    response = staff_client.get(f"{D}/")

    rows = {row["name"]: row for row in response.context["snapshot"]["queues"]}
    assert rows["pushed"]["push_url"] == "https://hooks.example.com/t"
    assert rows["pulled"]["push_url"] is None
    html = response.content.decode()
    assert "push → https://hooks.example.com/t" in html
    assert "token=abc" not in html and "pw@" not in html and "Bearer" not in html


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
    real = queue_services.set_paused

    def spy(queue: Queue, *, paused: bool, actor: Actor) -> Queue:
        calls.append({"paused": paused, "actor": actor})
        return real(queue, paused=paused, actor=actor)

    monkeypatch.setattr(queue_services, "set_paused", spy)

    response = staff_client.post(f"{D}/queues/q/pause", follow=True)
    assert Queue.objects.get(name="q").paused is True
    assert "Paused queue q" in flashed(response)[0]
    staff_client.post(f"{D}/queues/q/resume")
    assert Queue.objects.get(name="q").paused is False
    oncall = Actor.user("oncall")
    assert calls == [{"paused": True, "actor": oncall}, {"paused": False, "actor": oncall}]


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

    assert "2 tasks cancelled" in flashed(response)[0]
    statuses = dict(Task.objects.values_list("pk", "status"))
    assert [statuses[t.pk] for t in waiting] == [S.CANCELLED, S.CANCELLED]
    assert statuses[running.pk] == S.EXECUTING
    assert statuses[dead.pk] == S.DEAD
    assert TaskEvent.objects.filter(to_status=S.CANCELLED).count() == 2
