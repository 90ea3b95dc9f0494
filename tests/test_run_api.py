"""`python manage.py run_api`: the API server as deployments run it (API.md v1.1), stopped
the way supervisors and people stop it.

Real processes: the server is started as `Service` starts it for the fault tests, a worker
long-polls it over HTTP, and the server is told to stop while that request is in flight.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from queues.models import Queue
from taskforge.api.models import ApiKey
from tests.service import API, Api, Service, api_process

pytestmark = pytest.mark.postgres


@pytest.fixture
def server(tmp_path: Path, transactional_db: None, redis_client: redis.Redis) -> Iterator[Service]:
    with api_process(tmp_path, {"SECRET_KEY": "run-api-secret-key"}) as svc:
        yield svc


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_stop__drains_a_waiting_long_poll_and_exits_0(server: Service, signum: int) -> None:
    """A stop answers the waiting claim (empty) at once, exits 0 well within 10 s, and
    prints no traceback (Regression for issue 11: Ctrl-C printed logging errors)."""
    Queue.objects.create(name="idle")
    key = ApiKey.issue(name="run-api-worker", role="worker")[1]
    answer: dict[str, Any] = {}

    def long_poll() -> None:
        body = {"worker_id": "w1", "queues": ["idle"], "wait_seconds": 25}
        began = time.monotonic()
        answer["status"], answer["body"] = Api(server.base_url, key).call(
            "POST", "/workers/claim", body, timeout=30
        )
        answer["seconds"] = time.monotonic() - began

    poller = threading.Thread(target=long_poll)
    poller.start()
    time.sleep(1.0)  # the claim is waiting inside the server
    code, took = server.signal(API, signum, timeout=15)
    poller.join(timeout=15)

    assert code == 0, server.tails()
    assert took < 10, server.tails()
    assert answer["status"] == 200 and answer["body"] == {"tasks": []}, answer
    assert answer["seconds"] < 5, answer  # not the 25 s it asked to wait
    log = server.log_text(API)
    assert "Traceback" not in log and "Logging error" not in log, log


def test_serves__the_api_on_taskforge_bind(server: Service) -> None:
    status, body = Api(server.base_url).call("GET", "/healthz", timeout=5)
    assert (status, body) == (200, {"status": "ok"})
    assert server.base_url.endswith(server.env["TASKFORGE_BIND"].split(":")[1])
