"""The workers page."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.tests.pages import D
from tasks.tests.factories import TaskFactory
from workers.models import Worker

pytestmark = pytest.mark.django_db


# Workers -----------------------------------------------------------------------------


def test_workers__active_and_stale_with_current_tasks(staff_client: Client, settings: Any) -> None:
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 30
    now = timezone.now()
    Worker.objects.create(worker_id="fresh", last_seen_at=now - timedelta(seconds=5))
    Worker.objects.create(worker_id="quiet", last_seen_at=now - timedelta(minutes=5))
    Worker.objects.create(worker_id="gone", last_seen_at=now - timedelta(hours=3))
    running = TaskFactory(status="executing", worker_id="fresh")
    TaskFactory(status="done", worker_id="fresh")
    TaskFactory(status="executing", worker_id="quiet")

    response = staff_client.get(f"{D}/workers/")

    rows = {row["worker"].worker_id: row for row in response.context["rows"]}
    assert set(rows) == {"fresh", "quiet"}  # seen in the last hour, as GET /workers
    assert rows["fresh"]["state"] == "active" and rows["quiet"]["state"] == "stale"
    label = f"{str(running.pk)[:8]}…{str(running.pk)[-4:]}"
    assert rows["fresh"]["tasks"] == [
        {"id": str(running.pk), "url": f"{D}/tasks/{running.pk}", "label": label}
    ]
    assert response.context["rows"][0]["worker"].worker_id == "quiet"  # stale first
    html = response.content.decode()
    assert 'class="is-stale" data-worker="quiet"' in html
    assert f'<a href="{D}/tasks/{running.pk}" title="{running.pk}">{label}</a>' in html


def test_workers__a_busy_worker_shows_its_count_and_its_first_tasks(
    staff_client: Client, settings: Any
) -> None:
    Worker.objects.create(worker_id="busy", last_seen_at=timezone.now())
    held = sorted(str(TaskFactory(status="executing", worker_id="busy").pk) for _ in range(23))

    response = staff_client.get(f"{D}/workers/")

    [row] = response.context["rows"]
    assert (row["task_count"], row["more"]) == (23, 3)
    shown = [task["id"] for task in row["tasks"]]
    assert len(shown) == 20 and set(shown) <= set(held) and shown == sorted(shown)


def test_workers__a_quiet_worker_holding_nothing_has_left(
    staff_client: Client, settings: Any
) -> None:
    """Issue 14 (on-call noise): a worker stopped cleanly showed as stale."""
    settings.TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS = 30
    now = timezone.now()
    Worker.objects.create(worker_id="fresh", last_seen_at=now - timedelta(seconds=5))
    Worker.objects.create(worker_id="drained", last_seen_at=now - timedelta(minutes=5))
    Worker.objects.create(worker_id="hung", last_seen_at=now - timedelta(minutes=5))
    TaskFactory(status="executing", worker_id="hung")
    TaskFactory(status="done", worker_id="drained")

    response = staff_client.get(f"{D}/workers/")

    states = [(row["worker"].worker_id, row["state"]) for row in response.context["rows"]]
    assert states == [("hung", "stale"), ("fresh", "active"), ("drained", "left")]
    assert (response.context["stale_count"], response.context["left_count"]) == (1, 1)
    html = response.content.decode()
    assert 'class="is-left" data-worker="drained"' in html
    assert '<span class="pill">Left</span>' in html
