"""Push targets through real processes (tests/service.py: run_api, the loops, run_pusher).

- A PATCH of `push` applies to every task enqueued after it was answered
  (API.md "Queue": "applies to tasks not yet handed out").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings
from django.db import connection

from taskforge.api.models import ApiKey
from tasks.models import Task
from tests.pushtarget import Target
from tests.service import Api, Service, database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(180)]


@pytest.fixture
def service(tmp_path: Path, redis_client: Any) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "push-targets-secret-key",
            # The targets listen on 127.0.0.1; the rest of the blocked list holds.
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
    _, key = ApiKey.issue(name="push-targets", role="admin")
    return Api(svc.base_url, key)


def _wait(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _done(task_id: str) -> Callable[[], bool]:
    return lambda: Task.objects.get(pk=task_id).status == "done"


def test_a_task_enqueued_after_a_push_patch_goes_to_the_new_target(service: Service) -> None:
    """Regression: a push process sent such a task to the old URL with the old headers
    (it used its copy of the queue, read up to a second before)."""
    api = _admin(service)
    with Target() as one, Target() as two:
        targets = [one, two]
        api.ok("POST", "/queues", {"name": "hooks", "push": {"url": one.url("/v0")}})
        for n in range(1, 5):
            old, new = targets[(n - 1) % 2], targets[n % 2]
            # The push process has just read the queue: a task went to the old target.
            warm = api.ok("POST", "/queues/hooks/tasks", {"payload": {"warm": n}})
            _wait(_done(warm["id"]), 15, "warm-up")
            before = (len(old.requests), len(new.requests))
            push = {"url": new.url(f"/v{n}"), "headers": {"X-Target-Version": str(n)}}
            api.ok("PATCH", "/queues/hooks", {"push": push})
            task = api.ok("POST", "/queues/hooks/tasks", {"payload": {"after": n}})
            _wait(_done(task["id"]), 15, "delivery")
            assert (len(old.requests), len(new.requests)) == (before[0], before[1] + 1), n
            [request] = [r for r in new.requests if r.json() == {"after": n}]
            assert request.path == f"/v{n}"
            assert request.header("X-Target-Version") == str(n)
        service.assert_running()
