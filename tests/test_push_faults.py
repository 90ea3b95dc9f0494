"""Push delivery against real processes: a push process killed mid-request loses nothing.

The whole service runs as OS processes (tests/service.py, with `run_pusher`
added) and delivers to a real local HTTP target the test scripts
(tests/pushtarget.py).  Knobs are turned down: leases end 2 s after the
target's timeout, the watchdog looks every 0.5 s.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from taskforge.api.models import ApiKey
from tasks.models import Task, TaskEvent
from tests.pushtarget import Answer, Request, Target
from tests.service import Api, Service, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

TIMEOUT_SECONDS = 3  # the target's timeout_seconds: the lease is this + 2 s


@pytest.fixture
def service(tmp_path: Path, redis_client: Any) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "push-faults-secret-key",
            # The target listens on 127.0.0.1 (blocked by default).
            "TASKFORGE_PUSH_ALLOWED_NETWORKS": "127.0.0.0/8",
        },
        extra_loops=("pusher",),
    )
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()
        print(svc.tails())


def _admin(svc: Service) -> Api:
    _, key = ApiKey.issue(name="push-faults", role="admin")
    return Api(svc.base_url, key)


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_a_push_process_killed_mid_request_loses_nothing(service: Service) -> None:
    """Every first request hangs; the push process is SIGKILLed while they hang. The
    leases end, the tasks are retried by a new push process, and all end done."""
    release = threading.Event()
    first_seen: set[str] = set()
    lock = threading.Lock()

    def script(request: Request) -> Answer:
        task_id = request.header("TaskForge-Task-Id") or ""
        with lock:
            first = task_id not in first_seen
            first_seen.add(task_id)
        if first:
            release.wait(30)
            return Answer(hang_up=True)
        return Answer(200, b'{"ok": 1}')

    with Target(script) as target:
        api = _admin(service)
        api.ok(
            "POST",
            "/queues",
            {
                "name": "hooks",
                "max_retries": 3,
                "push": {"url": target.url(), "timeout_seconds": TIMEOUT_SECONDS},
            },
        )
        created = api.ok(
            "POST",
            "/queues/hooks/tasks/batch",
            {"tasks": [{"payload": {"n": n}} for n in range(20)]},
        )
        ids = {task["id"] for task in created["results"]}
        _wait(lambda: len(target.requests) == 20, 15, "20 requests in flight")
        assert Task.objects.filter(pk__in=ids, status="executing").count() == 20
        service.kill("pusher")
        release.set()
        service.restart("pusher")
        _wait(
            lambda: Task.objects.filter(pk__in=ids, status="done").count() == 20,
            TIMEOUT_SECONDS + 20,
            "every task done",
        )
        per_task = Counter(r.header("TaskForge-Task-Id") for r in target.requests)
        attempts = Counter(r.header("TaskForge-Attempt") for r in target.requests)

    assert set(per_task) == ids and set(per_task.values()) == {2}
    assert attempts == Counter({"1": 20, "2": 20})
    for task in Task.objects.filter(pk__in=ids):
        assert task.attempts == 2 and task.result == {"ok": 1}
        assert task.claimed_by is not None and task.claimed_by.startswith("push:")
    expired = TaskEvent.objects.filter(task_id__in=ids, to_status="retry")
    assert expired.count() == 20
    assert {e.error for e in expired} == {
        "lease expired: no heartbeat within the heartbeat timeout"
    }


def test_run_pusher_exits_0_on_sigterm_within_the_bound(service: Service) -> None:
    """API.md: a loop exits 0 on SIGTERM within max(its tick, 1 s) + 2 s, requests in flight
    or not; what is still in flight is left to its lease."""
    release = threading.Event()
    with Target(lambda request: (release.wait(30), Answer(200))[1]) as target:
        api = _admin(service)
        api.ok("POST", "/queues", {"name": "slow", "push": {"url": target.url()}})
        api.ok("POST", "/queues/slow/tasks", {"payload": {"n": 1}})
        _wait(lambda: len(target.requests) == 1, 15, "the request in flight")
        code, took = service.signal("pusher", signal.SIGTERM, timeout=10)
        release.set()
    assert code == 0
    assert took <= 3.0 + 0.5, took
    assert "push.stopped_in_flight" in service.log_text("pusher")
