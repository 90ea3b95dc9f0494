"""Push targets through real processes (tests/service.py: run_api, the loops, run_pusher).

- A PATCH of `push` applies to every task enqueued after it was answered
  (API.md "Queue": "applies to tasks not yet handed out").
- A URL naming a blocked address, in any form, or holding a space, tab or
  control character, is 400 `invalid` naming `push` (API.md "Security (v1.2)").
- A bad TASKFORGE_PUSH_*_NETWORKS stops a process at start-up, saying why.
"""

from __future__ import annotations

import os
import subprocess
import sys
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

ROOT = Path(__file__).resolve().parents[1]


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


REFUSED_URLS = [
    "http://169.254.169.254/latest/meta-data",
    "http://[::ffff:169.254.169.254]/",
    "http://0.0.0.0:8080/",
    "http://[::]:8080/",
    "http://[fe80::1]/",
    "http://2130706433/",
    "http://0x7f000001/",
    "http://0177.0.0.1/",
    "http://127.1/",
    "http://a.example/a\tb",
    "http://a.example/a b",
    "http://a.example/\x7f",
]


def test_run_api__a_refused_push_url_is_400_naming_push(service: Service) -> None:
    api = _admin(service)
    api.ok("POST", "/queues", {"name": "good", "push": {"url": "http://127.0.0.1:9/"}})
    for url in REFUSED_URLS:
        status, body = api.call("POST", "/queues", {"name": "bad", "push": {"url": url}})
        assert status == 400, (url, body)
        assert body["error"]["code"] == "invalid", url
        assert set(body["error"]["fields"]) == {"push"}, url
        status, body = api.call("PATCH", "/queues/good", {"push": {"url": url}})
        assert status == 400, (url, body)
        assert body["error"]["code"] == "invalid", url
        assert set(body["error"]["fields"]) == {"push"}, url
    assert api.ok("GET", "/queues/good")["push"]["url"] == "http://127.0.0.1:9/"
    status, _ = api.call("GET", "/queues/bad")
    assert status == 404


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TASKFORGE_PUSH_BLOCKED_NETWORKS", "127.0.0.0/8,10.0.0.1/8"),
        ("TASKFORGE_PUSH_ALLOWED_NETWORKS", "localhost"),
        ("TASKFORGE_PUSH_ALLOWED_NETWORKS", "127.0.0.0/33"),
    ],
)
def test_a_bad_network_setting_stops_start_up(name: str, value: str) -> None:
    env = {**os.environ, "SECRET_KEY": "x", name: value}
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert f"{name}: " in done.stderr and repr(value.split(",")[-1]) in done.stderr
