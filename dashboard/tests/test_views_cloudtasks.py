"""The dashboard's view of Cloud Tasks API tasks and queues (API-cloudtasks.md "Native view")."""

from __future__ import annotations

import base64

import pytest
from django.test import Client

from dashboard.tests.pages import D
from queues.tests.factories import QueueFactory
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def test_task_detail__shows_a_v2_tasks_name_method_target_header_names_and_body_size(
    staff_client: Client,
) -> None:
    task = TaskFactory(
        payload=None,
        name="order-7",
        http_request={
            "url": "https://user:pw@api.example.com/hook?token=s3cret",
            "http_method": "PUT",
            "headers": {"X-Api-Key": "value-never-shown", "Content-Type": "text/plain"},
            "body": base64.b64encode(b"x" * 1234).decode(),
            "oidc_token": None,
            "dispatch_deadline_seconds": 600.0,
        },
    )

    response = staff_client.get(f"{D}/tasks/{task.pk}")

    page = response.content.decode()
    assert response.status_code == 200
    assert "order-7" in page
    assert "PUT https://api.example.com/hook" in page
    assert "X-Api-Key" in page and "Content-Type" in page
    assert "1234 bytes" in page
    for secret in ("value-never-shown", "s3cret", "pw@"):
        assert secret not in page


def test_overview__shows_a_fractional_rate_and_a_retry_policy(staff_client: Client) -> None:
    QueueFactory(
        name="v2",
        rate_limit=0.5,
        retry_policy={
            "min_backoff_seconds": 0.1,
            "max_backoff_seconds": 3600,
            "max_doublings": 16,
            "max_retry_duration_seconds": 0,
        },
    )

    response = staff_client.get(f"{D}/")

    rows = {row["name"]: row for row in response.context["snapshot"]["queues"]}
    assert rows["v2"]["rate_limit"] == "0.50/s"
    assert rows["v2"]["retry_policy"] == "backoff 0.1-3600 s, 16 doublings"
    assert "0.50/s" in response.content.decode()
