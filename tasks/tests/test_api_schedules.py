"""The /queues/:name/schedules endpoints (API.md, Schedules v1.1)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone
from rest_framework import status
from rest_framework.test import APIClient

from queues.tests.factories import QueueFactory
from tasks.models import Schedule
from tasks.tests.factories import ScheduleFactory

pytestmark = pytest.mark.django_db

FIELDS = {
    "id",
    "queue",
    "name",
    "cron",
    "timezone",
    "payload",
    "priority",
    "max_retries",
    "paused",
    "next_run_at",
    "last_run_at",
    "created_at",
}


def parse(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_create__defaults(admin_client: APIClient) -> None:
    QueueFactory(name="reports")
    response = admin_client.post(
        "/queues/reports/schedules",
        {"name": "nightly", "cron": "0 3 * * *", "payload": {"kind": "nightly"}},
        format="json",
    )
    assert response.status_code == status.HTTP_201_CREATED
    body = response.json()
    assert set(body) == FIELDS
    assert body["queue"] == "reports"
    assert (body["timezone"], body["priority"], body["max_retries"], body["paused"]) == (
        "UTC",
        5,
        None,
        False,
    )
    assert body["last_run_at"] is None
    next_run = parse(body["next_run_at"])
    assert (next_run.hour, next_run.minute) == (3, 0)
    assert timezone.now() < next_run <= timezone.now() + timedelta(days=1)
    assert body["next_run_at"].endswith("Z") and body["created_at"].endswith("Z")


def test_create__all_fields_in_a_time_zone(admin_client: APIClient) -> None:
    QueueFactory(name="reports")
    response = admin_client.post(
        "/queues/reports/schedules",
        {
            "name": "paris-9am",
            "cron": "0 9 * * mon-fri",
            "timezone": "Europe/Paris",
            "payload": [1, "two"],
            "priority": 1,
            "max_retries": 0,
            "paused": True,
        },
        format="json",
    )
    assert response.status_code == status.HTTP_201_CREATED
    body = response.json()
    assert (body["priority"], body["max_retries"], body["paused"]) == (1, 0, True)
    local = parse(body["next_run_at"]).astimezone(ZoneInfo("Europe/Paris"))
    assert (local.hour, local.minute) == (9, 0) and local.weekday() < 5


def test_create__stores_the_expression_normalised(admin_client: APIClient) -> None:
    QueueFactory(name="q")
    for name, sent, stored in [("a", "@Daily", "@daily"), ("b", " 0  3 * * * ", "0 3 * * *")]:
        body = {"name": name, "cron": sent, "payload": 1}
        response = admin_client.post("/queues/q/schedules", body, format="json")
        assert response.json()["cron"] == stored


def test_create__existing_name_is_409(admin_client: APIClient) -> None:
    schedule = ScheduleFactory(name="nightly")
    response = admin_client.post(
        f"/queues/{schedule.queue.name}/schedules",
        {"name": "nightly", "cron": "@daily", "payload": 1},
        format="json",
    )
    assert response.status_code == status.HTTP_409_CONFLICT
    assert response.json()["error"]["code"] == "schedule_exists"


def test_create__the_same_name_in_another_queue_is_fine(admin_client: APIClient) -> None:
    ScheduleFactory(name="nightly")
    QueueFactory(name="other")
    response = admin_client.post(
        "/queues/other/schedules",
        {"name": "nightly", "cron": "@daily", "payload": 1},
        format="json",
    )
    assert response.status_code == status.HTTP_201_CREATED


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "x", "cron": "0 0 * * * *", "payload": 1}, "cron"),
        ({"name": "x", "cron": "61 * * * *", "payload": 1}, "cron"),
        ({"name": "x", "cron": "@reboot", "payload": 1}, "cron"),
        ({"name": "x", "cron": "0 0 30 2 *", "payload": 1}, "cron"),
        ({"name": "x", "cron": 5, "payload": 1}, "cron"),
        ({"name": "x", "cron": "@daily", "payload": 1, "timezone": "Mars/Base"}, "timezone"),
        ({"name": "x", "cron": "@daily", "payload": 1, "timezone": ""}, "timezone"),
        ({"name": "x", "cron": "@daily", "payload": None}, "payload"),
        ({"name": "x", "cron": "@daily"}, "payload"),
        ({"name": " x", "cron": "@daily", "payload": 1}, "name"),
        ({"name": "a/b", "cron": "@daily", "payload": 1}, "name"),
        ({"cron": "@daily", "payload": 1}, "name"),
        ({"name": "x", "cron": "@daily", "payload": 1, "priority": 11}, "priority"),
        ({"name": "x", "cron": "@daily", "payload": 1, "max_retries": 101}, "max_retries"),
        ({"name": "x", "cron": "@daily", "payload": 1, "paused": "yes"}, "paused"),
        ({"name": "x", "cron": "@daily", "payload": 1, "crom": "typo"}, "crom"),
    ],
)
def test_create__invalid_body_is_400(admin_client: APIClient, body: dict[str, Any], field: str):
    QueueFactory(name="q")
    response = admin_client.post("/queues/q/schedules", body, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    error = response.json()["error"]
    assert error["code"] == "invalid"
    assert list(error["fields"]) == [field]
    assert Schedule.objects.count() == 0


def test_create__unknown_queue_is_404(admin_client: APIClient) -> None:
    response = admin_client.post(
        "/queues/nope/schedules", {"name": "x", "cron": "@daily", "payload": 1}, format="json"
    )
    assert response.status_code == status.HTTP_404_NOT_FOUND
    assert response.json()["error"]["code"] == "not_found"


@pytest.mark.parametrize("role", ["producer", "worker"])
def test_every_schedule_endpoint__is_for_admins_only(make_client, role: str) -> None:
    schedule = ScheduleFactory()
    client = make_client(role)
    base = f"/queues/{schedule.queue.name}/schedules"
    answers = [
        client.get(base),
        client.post(base, {"name": "x", "cron": "@daily", "payload": 1}, format="json"),
        client.get(f"{base}/{schedule.name}"),
        client.patch(f"{base}/{schedule.name}", {"paused": True}, format="json"),
        client.delete(f"{base}/{schedule.name}"),
    ]
    assert [a.status_code for a in answers] == [status.HTTP_403_FORBIDDEN] * 5
    assert {a.json()["error"]["code"] for a in answers} == {"forbidden"}


def test_list__by_name_paginated(admin_client: APIClient) -> None:
    queue = QueueFactory()
    for name in ["c", "a", "b"]:
        ScheduleFactory(queue=queue, name=name)
    ScheduleFactory(name="elsewhere")
    first = admin_client.get(f"/queues/{queue.name}/schedules?limit=2").json()
    assert [s["name"] for s in first["results"]] == ["a", "b"]
    second = admin_client.get(first["next"]).json()
    assert [s["name"] for s in second["results"]] == ["c"]
    assert second["next"] is None


def test_list__bad_limit_is_400(admin_client: APIClient) -> None:
    queue = QueueFactory()
    response = admin_client.get(f"/queues/{queue.name}/schedules?limit=0")
    assert response.status_code == status.HTTP_400_BAD_REQUEST


def test_retrieve__and_unknown_schedule_is_404(admin_client: APIClient) -> None:
    schedule = ScheduleFactory(name="hourly", cron="@hourly")
    base = f"/queues/{schedule.queue.name}/schedules"
    body = admin_client.get(f"{base}/hourly").json()
    assert (body["id"], body["cron"]) == (str(schedule.id), "@hourly")
    for missing in ["nope", "bad%00name"]:
        response = admin_client.get(f"{base}/{missing}")
        assert response.status_code == status.HTTP_404_NOT_FOUND
        assert response.json()["error"]["code"] == "not_found"


def test_patch__changes_fields(admin_client: APIClient) -> None:
    schedule = ScheduleFactory(cron="0 3 * * *")
    url = f"/queues/{schedule.queue.name}/schedules/{schedule.name}"
    response = admin_client.patch(
        url,
        {"cron": "30 4 * * *", "timezone": "Asia/Kolkata", "payload": {"v": 2}, "priority": 2},
        format="json",
    )
    assert response.status_code == status.HTTP_200_OK
    body = response.json()
    assert (body["cron"], body["timezone"], body["payload"], body["priority"]) == (
        "30 4 * * *",
        "Asia/Kolkata",
        {"v": 2},
        2,
    )
    # 04:30 in Kolkata (+05:30) is 23:00 UTC.
    next_run = parse(body["next_run_at"])
    assert (next_run.hour, next_run.minute) == (23, 0)
    schedule.refresh_from_db()
    assert schedule.next_run_at == next_run


def test_patch__name_is_400(admin_client: APIClient) -> None:
    schedule = ScheduleFactory()
    url = f"/queues/{schedule.queue.name}/schedules/{schedule.name}"
    response = admin_client.patch(url, {"name": "renamed"}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json() == {
        "error": {
            "code": "invalid",
            "message": response.json()["error"]["message"],
            "fields": {"name": ["A schedule's name cannot change."]},
        }
    }


def test_patch__bad_cron_is_400_and_changes_nothing(admin_client: APIClient) -> None:
    schedule = ScheduleFactory(cron="@daily")
    url = f"/queues/{schedule.queue.name}/schedules/{schedule.name}"
    response = admin_client.patch(url, {"cron": "* * * * * *", "paused": True}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    schedule.refresh_from_db()
    assert (schedule.cron, schedule.paused) == ("@daily", False)


def test_patch__unknown_schedule_is_404(admin_client: APIClient) -> None:
    queue = QueueFactory()
    response = admin_client.patch(
        f"/queues/{queue.name}/schedules/nope", {"paused": True}, format="json"
    )
    assert response.status_code == status.HTTP_404_NOT_FOUND


def test_paused__still_shows_the_next_fire_time(admin_client: APIClient) -> None:
    schedule = ScheduleFactory(cron="* * * * *", paused=True)
    # The pointer stays put while paused: an hour later it is in the past.
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=timezone.now() - timedelta(hours=1))
    body = admin_client.get(f"/queues/{schedule.queue.name}/schedules/{schedule.name}").json()
    next_run = parse(body["next_run_at"])
    assert timezone.now() < next_run <= timezone.now() + timedelta(minutes=1)
    assert next_run.second == 0


def test_delete__204_then_404(admin_client: APIClient) -> None:
    schedule = ScheduleFactory()
    url = f"/queues/{schedule.queue.name}/schedules/{schedule.name}"
    assert admin_client.delete(url).status_code == status.HTTP_204_NO_CONTENT
    assert admin_client.get(url).status_code == status.HTTP_404_NOT_FOUND
    assert admin_client.delete(url).status_code == status.HTTP_404_NOT_FOUND


def test_delete_queue__deletes_its_schedules(admin_client: APIClient) -> None:
    schedule = ScheduleFactory()
    response = admin_client.delete(f"/queues/{schedule.queue.name}")
    assert response.status_code == status.HTTP_204_NO_CONTENT
    assert not Schedule.objects.exists()
