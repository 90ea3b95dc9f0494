"""The overview's server-sent events stream: bounded, and light on the database."""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client

from dashboard import snapshot, sse
from queues.tests.factories import QueueFactory
from taskforge.api import revocation
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

URL = "/admin/dashboard/stream"


def _events(body: str) -> list[dict[str, Any]]:
    return [
        json.loads(block.split("data: ", 1)[1])
        for block in body.split("\n\n")
        if block.startswith("event: snapshot")
    ]


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """A fake clock and wait for the stream's own calls only.

    `time` is one module for the whole process: other callers (the Redis
    listener thread of an earlier test, say) keep the real clock and sleep,
    or they would eat the stream's ticks.
    """
    slept: list[float] = []
    monkeypatch.setattr(sse, "INTERVAL_SECONDS", 2.0)
    monkeypatch.setattr(sse, "LIFETIME_SECONDS", 7.0)
    clock = iter(range(0, 1000, 2))  # each monotonic() call of the stream: 2 s later
    real_monotonic = time.monotonic

    def from_sse() -> bool:
        return sys._getframe(2).f_globals.get("__name__") == sse.__name__

    def wait(woken: threading.Event, seconds: float, allowed: Any) -> bool:
        slept.append(seconds)
        return True

    def monotonic() -> float:
        return float(next(clock)) if from_sse() else real_monotonic()

    monkeypatch.setattr(sse, "_wait", wait)
    monkeypatch.setattr(time, "monotonic", monotonic)
    monkeypatch.setattr(snapshot, "MAX_AGE_SECONDS", 0.0)
    return slept


def test_stream__sends_snapshots_then_ends_at_its_lifetime(
    staff_client: Client, quick: list[float]
) -> None:
    queue = QueueFactory(name="q")
    TaskFactory(queue=queue)

    response = staff_client.get(URL)

    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]
    assert body.startswith(f"retry: {sse.RETRY_MS}\n\n")
    events = _events(body)
    assert 2 <= len(events) <= 4  # bounded: the stream ends, EventSource reconnects
    assert events[0]["queues"][0]["name"] == "q"
    assert events[0]["queues"][0]["depth"]["pending"] == 1
    assert quick and all(s == sse.INTERVAL_SECONDS for s in quick)


def test_stream__gives_its_database_connection_back_between_snapshots(
    staff_client: Client, quick: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    QueueFactory(name="q")
    released: list[bool] = []
    monkeypatch.setattr(sse, "_release_connection", lambda: released.append(True))

    response = staff_client.get(URL)
    events = _events(b"".join(response.streaming_content).decode())  # type: ignore[attr-defined]

    # Once after each snapshot, and once when the stream ends.
    assert len(released) == len(events) + 1


def test_stream__past_the_limit_a_client_gets_one_snapshot_and_polls(
    staff_client: Client, quick: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    QueueFactory(name="q")
    monkeypatch.setattr(sse, "_streams", threading.BoundedSemaphore(1))
    assert sse._streams.acquire(blocking=False)  # another browser holds the only slot

    response = staff_client.get(URL)
    body = b"".join(response.streaming_content).decode()  # type: ignore[attr-defined]

    assert body.startswith(f"retry: {sse.BUSY_RETRY_MS}\n\n")
    assert len(_events(body)) == 1
    assert quick == []


def test_stream__frees_its_slot_when_the_client_goes_away(
    staff_client: Client, quick: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    QueueFactory(name="q")
    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(sse, "_streams", slots)

    response = staff_client.get(URL)
    stream = iter(response.streaming_content)  # type: ignore[attr-defined]
    next(stream)
    next(stream)
    assert not slots.acquire(blocking=False)  # held while streaming
    response.close()  # what the WSGI server does when the client disconnects

    assert slots.acquire(blocking=False)


def test_stream__unstarted_response_holds_no_slot(
    staff_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    slots = threading.BoundedSemaphore(1)
    monkeypatch.setattr(sse, "_streams", slots)

    response = staff_client.get(URL)
    response.close()

    assert slots.acquire(blocking=False)


def test_stream__only_for_staff() -> None:
    response = Client().get(URL)

    assert response.status_code == 302


def _wait_subscribed() -> None:
    deadline = time.monotonic() + 5
    while not revocation.listener.subscribed():
        assert time.monotonic() < deadline, "the revocation listener did not subscribe"
        time.sleep(0.02)


def _deactivate(user: User) -> None:
    user.is_active = False
    user.save()


def _unstaff(user: User) -> None:
    user.is_staff = False
    user.save(update_fields=["is_staff"])


def _delete(user: User) -> None:
    user.delete()


@pytest.mark.parametrize("take_away", [_deactivate, _unstaff, _delete])
def test_stream__ends_within_a_second_when_its_user_loses_access(
    staff_client: Client,
    staff_user: User,
    take_away: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    """Issue 14: a stream went on for its whole lifetime (3 minutes) after its user
    was deactivated."""
    QueueFactory(name="q")
    _wait_subscribed()
    response = staff_client.get(URL)
    stream = iter(response.streaming_content)  # type: ignore[attr-defined]
    next(stream)  # retry
    next(stream)  # the first snapshot; the stream now watches its user

    with django_capture_on_commit_callbacks(execute=True):
        take_away(staff_user)
    began = time.monotonic()
    rest = list(stream)  # the stream ends

    assert time.monotonic() - began < 1.0
    assert rest == []
    response.close()


def test_stream__goes_on_when_its_user_keeps_access(
    staff_client: Client, staff_user: User, django_capture_on_commit_callbacks: Any
) -> None:
    QueueFactory(name="q")
    _wait_subscribed()
    response = staff_client.get(URL)
    stream = iter(response.streaming_content)  # type: ignore[attr-defined]
    next(stream)
    next(stream)

    with django_capture_on_commit_callbacks(execute=True):
        staff_user.first_name = "On"
        staff_user.save()  # named, but still active staff

    assert next(stream).startswith(b"event: snapshot")
    response.close()
