"""The schedules page: next and last run, pause and resume."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from dashboard.tests.pages import D
from tasks import schedules
from tasks.models import Schedule, Task
from tasks.tests.factories import ScheduleFactory

pytestmark = pytest.mark.django_db


def test_schedules__lists_next_and_last_run(staff_client: Client) -> None:
    ran = ScheduleFactory(name="hourly", cron="0 * * * *")
    Schedule.objects.filter(pk=ran.pk).update(next_run_at=timezone.now() - timedelta(seconds=1))
    schedules.fire_due()
    ScheduleFactory(name="idle", cron="@yearly", paused=True)

    response = staff_client.get(f"{D}/schedules/")

    assert response.status_code == 200
    rows = {row["schedule"].name: row for row in response.context["rows"]}
    assert set(rows) == {"hourly", "idle"}
    assert rows["hourly"]["last_run"] is not None and rows["idle"]["last_run"] is None
    html = response.content.decode()
    assert f'data-schedule="{ran.queue.name}/hourly"' in html
    assert "never" in html and "Paused" in html and "Resume" in html
    assert response.context["paused_count"] == 1


def test_schedules__empty(staff_client: Client) -> None:
    response = staff_client.get(f"{D}/schedules/")
    assert "No schedules yet" in response.content.decode()


def test_pause_and_resume__through_the_service(staff_client: Client) -> None:
    schedule = ScheduleFactory(cron="* * * * *")
    response = staff_client.post(f"{D}/schedules/{schedule.pk}/pause")
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert schedule.paused is True
    # A minute passes while paused; resuming fires the missed time once.
    Schedule.objects.filter(pk=schedule.pk).update(
        next_run_at=timezone.now() - timedelta(minutes=3)
    )
    staff_client.post(f"{D}/schedules/{schedule.pk}/resume")
    schedule.refresh_from_db()
    assert schedule.paused is False
    assert schedules.fire_due() == 1
    assert Task.objects.filter(queue=schedule.queue).count() == 1


def test_pause__needs_post_and_staff(staff_client: Client, client: Client) -> None:
    schedule = ScheduleFactory()
    assert staff_client.get(f"{D}/schedules/{schedule.pk}/pause").status_code == 405
    response = client.post(f"{D}/schedules/{schedule.pk}/pause")
    assert response.status_code == 302 and "/login/" in response["Location"]
    schedule.refresh_from_db()
    assert schedule.paused is False


def test_admin__creates_through_the_service_and_checks_the_cron(superuser_client: Client) -> None:
    queue = ScheduleFactory().queue
    url = "/admin/tasks/schedule/add/"
    form = {
        "queue": str(queue.pk),
        "name": "nightly",
        "cron": "0 0 * * * *",
        "timezone": "UTC",
        "payload": '{"a": 1}',
        "priority": "5",
        "max_retries": "",
    }
    response = superuser_client.post(url, form)
    assert response.status_code == 200 and "has 6" in response.content.decode()
    response = superuser_client.post(url, {**form, "cron": "0 0 * * *"})
    assert response.status_code == 302
    created = Schedule.objects.get(name="nightly")
    assert created.next_run_at > timezone.now() and created.next_run_at.hour == 0


def test_admin__pause_action(superuser_client: Client) -> None:
    schedule = ScheduleFactory()
    superuser_client.post(
        "/admin/tasks/schedule/",
        {"action": "pause", "_selected_action": [str(schedule.pk)]},
    )
    schedule.refresh_from_db()
    assert schedule.paused is True
