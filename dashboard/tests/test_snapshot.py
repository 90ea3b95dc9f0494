"""Queue health as the overview judges it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from dashboard import formatting as fmt
from dashboard import snapshot
from queues.tests.factories import QueueFactory
from tasks.tests.factories import TaskFactory
from workers.models import Worker


def _stats(**overrides: Any) -> dict[str, Any]:
    stats: dict[str, Any] = {
        "paused": False,
        "depth": {"pending": 0, "scheduled": 0, "claimed": 0, "executing": 0, "retry": 0},
        "dlq_depth": 0,
        "throughput_per_second": 1.0,
        "error_rate": 0,
        "oldest_pending_age_seconds": None,
    }
    stats.update(overrides)
    return stats


@pytest.mark.parametrize(
    ("overrides", "level", "reasons"),
    [
        ({}, "ok", []),
        ({"error_rate": 0.09}, "ok", []),
        ({"error_rate": 0.1}, "warn", ["10% of attempts failing"]),
        ({"error_rate": 0.5}, "crit", ["50% of attempts failing"]),
        ({"oldest_pending_age_seconds": 59.0}, "ok", []),
        ({"oldest_pending_age_seconds": 61.0}, "warn", ["oldest task waiting 1m 01s"]),
        ({"oldest_pending_age_seconds": 301.0}, "crit", ["oldest task waiting 5m 01s"]),
        ({"dlq_depth": 1200}, "warn", ["1,200 dead"]),
        ({"paused": True}, "warn", ["paused"]),
        # Waiting is expected while paused: no "oldest task waiting" alarm then.
        (
            {
                "paused": True,
                "oldest_pending_age_seconds": 900.0,
                "depth": {"pending": 3, "scheduled": 0, "claimed": 0, "executing": 0, "retry": 1},
            },
            "warn",
            ["paused, 4 waiting"],
        ),
        (
            {"dlq_depth": 2, "error_rate": 0.75},
            "crit",
            ["75% of attempts failing", "2 dead"],
        ),
    ],
)
def test_queue_health(overrides: dict[str, Any], level: str, reasons: list[str]) -> None:
    assert snapshot.queue_health(_stats(**overrides)) == (level, reasons)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(None, "—"), (0.4, "0s"), (59, "59s"), (61, "1m 01s"), (3600, "1h 00m"), (200000, "2d 7h")],
)
def test_format_age(seconds: float | None, text: str) -> None:
    assert fmt.age(seconds) == text


@pytest.mark.django_db
def test_build__summary_names_unhealthy_queues_worst_first_and_worker_trouble() -> None:
    now = timezone.now()
    QueueFactory(name="fine")
    slow = QueueFactory(name="slow")
    TaskFactory(queue=slow, scheduled_at=now - timedelta(minutes=10))
    failing = QueueFactory(name="failing")
    TaskFactory(queue=failing, status="retry")
    Worker.objects.create(worker_id="old", last_seen_at=now - timedelta(minutes=5))
    TaskFactory(queue=failing, status="executing", worker_id="old")

    data = snapshot.build()

    assert data["summary"]["health"] == "crit"
    assert [item["name"] for item in data["summary"]["unhealthy"]] == ["failing", "slow"]
    assert data["summary"]["title"] == "2 of 3 queues need attention"
    assert [a["text"] for a in data["summary"]["alerts"]] == [
        "No active worker, and 1 tasks are due",
        "1 worker stopped heartbeating while holding tasks",
    ]
    assert data["workers"] == {"active": 0, "stale": 1, "left": 0}


@pytest.mark.django_db
def test_build__a_worker_that_left_raises_no_alarm() -> None:
    """Issue 14 (on-call noise): every deploy stops workers cleanly, and each one
    turned the overview to "needs attention" once it went quiet."""
    now = timezone.now()
    fine = QueueFactory(name="fine")
    Worker.objects.create(worker_id="busy", last_seen_at=now)
    Worker.objects.create(worker_id="drained", last_seen_at=now - timedelta(minutes=5))
    TaskFactory(queue=fine, status="done", worker_id="drained")

    data = snapshot.build()

    assert data["summary"]["health"] == "ok"
    assert data["summary"]["alerts"] == []
    assert data["summary"]["title"] == "All 1 queue healthy"
    assert data["workers"] == {"active": 1, "stale": 0, "left": 1}


@pytest.mark.django_db
def test_build__a_worker_whose_leases_the_watchdog_reclaimed_still_needs_attention() -> None:
    """A crashed worker holds nothing once the watchdog took its tasks back: it did
    not leave, and stays stale until it is seen again."""
    now = timezone.now()
    QueueFactory(name="fine")
    Worker.objects.create(
        worker_id="crashed",
        last_seen_at=now - timedelta(minutes=5),
        lost_tasks_at=now - timedelta(minutes=4),
    )
    Worker.objects.create(
        worker_id="back",  # lost tasks once, and was seen since
        last_seen_at=now - timedelta(minutes=2),
        lost_tasks_at=now - timedelta(minutes=4),
    )

    data = snapshot.build()

    assert data["summary"]["health"] == "warn"
    assert data["workers"] == {"active": 0, "stale": 1, "left": 1}


@pytest.mark.django_db
def test_build__a_quiet_worker_holding_tasks_needs_attention() -> None:
    now = timezone.now()
    QueueFactory(name="fine")
    Worker.objects.create(worker_id="busy", last_seen_at=now)
    Worker.objects.create(worker_id="hung", last_seen_at=now - timedelta(minutes=5))
    TaskFactory(status="executing", worker_id="hung")

    data = snapshot.build()

    assert data["summary"]["health"] == "warn"
    assert data["summary"]["title"] == "Queues healthy; workers need attention"
    assert data["workers"] == {"active": 1, "stale": 1, "left": 0}


@pytest.mark.django_db
def test_current__is_cached_briefly_and_invalidated_by_actions(
    django_assert_num_queries: Any,
) -> None:
    QueueFactory(name="a")
    first = snapshot.current()
    QueueFactory(name="b")
    with django_assert_num_queries(0):
        assert snapshot.current() == first
    snapshot.invalidate()
    assert [q["name"] for q in snapshot.current()["queues"]] == ["a", "b"]


@pytest.mark.django_db
def test_current__is_shared_through_the_cache(django_assert_num_queries: Any) -> None:
    """Another API process finds the snapshot this one built (Redis, not process memory)."""
    from django.core.cache import caches

    QueueFactory(name="a")
    built = snapshot.current()
    other_process = caches.create_connection("default")  # a client of its own
    assert other_process.get(snapshot.CACHE_KEY) == built
