"""Retry policies: Cloud Tasks' backoff and limits, and a queue's native `retry_policy`."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework import status
from rest_framework.test import APIClient

from queues.retrypolicy import RetryPolicy
from queues.tests.factories import QueueFactory
from tasks import transitions
from tasks.models import Task, TaskStatus
from tasks.retry import policy_delay_seconds, policy_exhausted
from tasks.tests.factories import TaskFactory

S = TaskStatus


def test_policy_delay__doubles_then_grows_linearly() -> None:
    """The contract's example: 10s / 300s / 3 doublings."""
    policy = RetryPolicy(10, 300, 3, 0)
    delays = [policy_delay_seconds(policy, k) for k in range(1, 9)]
    assert delays == [10, 20, 40, 80, 160, 240, 300, 300]


def test_policy_exhausted__both_limits_must_be_reached() -> None:
    now = timezone.now()
    early = now - timedelta(seconds=5)
    late = now - timedelta(seconds=100)

    def exhausted(attempts: int, since: datetime, *, most: int = 3, limit: float = 60) -> bool:
        return policy_exhausted(
            max_attempts=most,
            attempts=attempts,
            first_attempt_at=since,
            now=now,
            max_retry_duration_seconds=limit,
        )

    assert not exhausted(3, early)
    assert not exhausted(2, late)
    assert exhausted(3, late)
    # One limit set: that one decides; none: never.
    assert exhausted(3, early, limit=0)
    assert not exhausted(10**6, late, most=-1, limit=0)


@pytest.mark.django_db
def test_fail__a_native_task_waits_by_its_queues_policy() -> None:
    queue = QueueFactory(retry_policy=RetryPolicy(30, 300, 2, 0).as_json(), max_retries=5)
    task = TaskFactory(queue=queue, status=S.EXECUTING)
    now = timezone.now()
    with transaction.atomic():
        locked = Task.objects.select_for_update().select_related("queue").get(pk=task.pk)
        transitions.fail(locked, error="boom", now=now)
    task.refresh_from_db()
    assert task.status == S.RETRY
    assert task.scheduled_at == now + timedelta(seconds=30)


@pytest.mark.django_db
def test_fail__an_http_task_follows_its_own_config() -> None:
    """maxAttempts 2 in the task's retryConfig: dead after its second attempt."""
    queue = QueueFactory(max_retries=10)
    task = TaskFactory(
        queue=queue,
        http_request={"url": "http://example.com/", "http_method": "POST"},
        retry_config={**RetryPolicy(1, 10, 16, 0).as_json(), "max_attempts": 2},
        status=S.EXECUTING,
    )
    now = timezone.now()
    with transaction.atomic():
        locked = Task.objects.select_for_update().select_related("queue").get(pk=task.pk)
        transitions.fail(locked, error="boom", now=now)
    task.refresh_from_db()
    assert (task.status, task.scheduled_at) == (S.RETRY, now + timedelta(seconds=1))
    Task.objects.filter(pk=task.pk).update(attempts=2, status=S.EXECUTING)
    with transaction.atomic():
        locked = Task.objects.select_for_update().select_related("queue").get(pk=task.pk)
        transitions.fail(locked, error="boom", now=now)
    task.refresh_from_db()
    assert task.status == S.DEAD


@pytest.mark.django_db
def test_api__a_queue_takes_and_shows_its_retry_policy(admin_client: APIClient) -> None:
    policy = {
        "min_backoff_seconds": 0.5,
        "max_backoff_seconds": 60,
        "max_doublings": 4,
        "max_retry_duration_seconds": 0,
    }
    response = admin_client.post("/queues", {"name": "q", "retry_policy": policy}, format="json")
    assert response.status_code == status.HTTP_201_CREATED, response.json()
    assert response.json()["retry_policy"] == policy
    response = admin_client.patch("/queues/q", {"retry_policy": None}, format="json")
    assert response.json()["retry_policy"] is None


@pytest.mark.parametrize(
    "policy",
    [
        {"min_backoff_seconds": 1, "extra": 1},
        {"min_backoff_seconds": -1},
        {"max_backoff_seconds": 86401},
        {"max_doublings": 33},
        {"max_doublings": 1.5},
        {"min_backoff_seconds": 10, "max_backoff_seconds": 5},
        {"max_retry_duration_seconds": 2592001},
        "fast",
    ],
)
@pytest.mark.django_db
def test_api__a_bad_retry_policy_is_400(admin_client: APIClient, policy: object) -> None:
    response = admin_client.post("/queues", {"name": "q", "retry_policy": policy}, format="json")
    assert response.status_code == status.HTTP_400_BAD_REQUEST
    assert response.json()["error"]["code"] == "invalid"
    assert "retry_policy" in response.json()["error"]["fields"]


@pytest.mark.django_db
def test_api__fractional_rate_and_unlimited_attempts_read_back(admin_client: APIClient) -> None:
    """Set over /v2 (a fraction, maxAttempts -1): the native answer shows 0.5 and null."""
    QueueFactory(name="q", rate_limit=0.5, max_attempts=-1, max_retries=100)
    body = admin_client.get("/queues/q").json()
    assert (body["rate_limit"], body["max_retries"]) == (0.5, None)
    # A native max_retries says maxAttempts again; integer rates show as integers.
    body = admin_client.patch(
        "/queues/q", {"max_retries": 4, "rate_limit": 5}, format="json"
    ).json()
    assert (body["rate_limit"], body["max_retries"]) == (5, 4)
    assert isinstance(body["rate_limit"], int)
