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

    response = staff_client.get(f"{D}/workers/")

    rows = {row["worker"].worker_id: row for row in response.context["rows"]}
    assert set(rows) == {"fresh", "quiet"}  # seen in the last hour, as GET /workers
    assert rows["fresh"]["stale"] is False and rows["quiet"]["stale"] is True
    assert rows["fresh"]["tasks"] == [{"id": str(running.pk), "url": f"{D}/tasks/{running.pk}"}]
    assert response.context["rows"][0]["worker"].worker_id == "quiet"  # stale first
    html = response.content.decode()
    assert 'class="is-stale" data-worker="quiet"' in html
