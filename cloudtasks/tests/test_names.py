"""Named /v2 tasks under faults (API-cloudtasks.md "Task names", "Delivery").

- Concurrent CreateTask calls for the same names through two `run_api` processes: each
  name is taken once, every other call is 409 `ALREADY_EXISTS`.
- `run_pusher` SIGKILLed with named tasks in flight: every task is delivered at least
  once and ends done, none is lost, and no name is ever held by two live tasks (a
  re-create of any name is refused before, during and after the fault).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tasks.models import Task, TaskStatus
from tests.pushtarget import Answer, Request, Target
from tests.service import Api, Service, api_process

P = "/v2/projects/p/locations/l"
NAME_PREFIX = f"{P[4:]}/queues/hooks/tasks"

pytestmark = pytest.mark.timeout(120)


def _wait(check: Callable[[], bool], seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _create(api: Api, name: str, url: str) -> tuple[int, dict[str, object]]:
    task = {
        "name": f"{NAME_PREFIX}/{name}",
        "httpRequest": {"url": url},
        "dispatchDeadline": "15s",  # the shortest: a lost attempt's lease ends 17 s on
    }
    body = {"task": task}
    return api.call("POST", f"{P}/queues/hooks/tasks", body)


def test_names__concurrent_creates_through_two_api_processes_take_each_name_once(
    server: Service, keys: dict[str, str], tmp_path: Path
) -> None:
    first = Api(server.base_url, keys["producer"])
    Api(server.base_url, keys["admin"]).ok("POST", f"{P}/queues", {"name": f"{P[4:]}/queues/hooks"})
    names = [f"order-{n}" for n in range(10)]
    per_name = 8  # 4 calls through each process, released at once
    (tmp_path / "second").mkdir()
    with api_process(tmp_path / "second", {"SECRET_KEY": "cloudtasks-secret-key"}) as other:
        second = Api(other.base_url, keys["producer"])
        statuses: dict[str, list[int]] = {name: [] for name in names}
        errors: list[str] = []
        start = threading.Barrier(per_name)

        def create(api: Api, name: str) -> None:
            try:
                start.wait(10)
                status, body = _create(api, name, "https://example.com/hook")
                statuses[name].append(status)
                if status == 409:
                    assert body["error"]["status"] == "ALREADY_EXISTS", body  # type: ignore[index]
            except Exception as exc:  # reported below, not lost in a thread
                errors.append(repr(exc))

        for name in names:
            threads = [
                threading.Thread(target=create, args=(api, name))
                for api in (first, second)
                for _ in range(per_name // 2)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(20)
            start.reset()

    assert not errors, errors
    for name in names:
        assert sorted(statuses[name]) == [200] + [409] * (per_name - 1), (name, statuses[name])
        assert Task.objects.filter(name=name).count() == 1


def test_names__run_pusher_killed_mid_delivery_loses_none_and_never_doubles_a_name(
    fleet: Service, keys: dict[str, str]
) -> None:
    admin = Api(fleet.base_url, keys["admin"])
    admin.ok(
        "POST",
        f"{P}/queues",
        {"name": f"{P[4:]}/queues/hooks", "retryConfig": {"minBackoff": "0.1s"}},
    )
    release = threading.Event()
    seen: set[str] = set()
    lock = threading.Lock()

    def script(request: Request) -> Answer:
        name = request.header("X-CloudTasks-TaskName") or ""
        with lock:
            first = name not in seen
            seen.add(name)
        if first:  # every first attempt hangs until the push process is gone
            release.wait(30)
            return Answer(hang_up=True)
        return Answer(200, b'{"ok": 1}')

    names = [f"n-{n}" for n in range(12)]

    def refused_everywhere(url: str) -> None:
        for name in names:
            status, body = _create(admin, name, url)
            assert status == 409, (name, status, body)

    with Target(script) as target:
        for name in names:
            status, body = _create(admin, name, target.url())
            assert status == 200, body
        _wait(lambda: len(target.requests) == len(names), 30, "every first attempt in flight")
        refused_everywhere(target.url())  # executing: taken
        fleet.kill("pusher")
        release.set()
        refused_everywhere(target.url())  # their process gone, leases running: taken
        fleet.restart("pusher")
        # The leases last dispatchDeadline (15 s) + the heartbeat timeout (2 s here).
        _wait(
            lambda: (
                Task.objects.filter(name__in=names, status=TaskStatus.DONE).count() == len(names)
            ),
            60,
            "every named task done",
        )
        refused_everywhere(target.url())  # finished: taken for the dedup window
        per_name = Counter(r.header("X-CloudTasks-TaskName") for r in target.requests)

    assert set(per_name) == set(names) and min(per_name.values()) >= 2
    assert Task.objects.filter(name__in=names).count() == len(names)
    for task in Task.objects.filter(name__in=names):
        assert task.attempts >= 2 and task.result == {"ok": 1}
