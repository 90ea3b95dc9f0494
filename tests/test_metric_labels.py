"""Metrics take no label value from request input (API.md, "Security (v1.2)").

Except an existing queue's name and a worker id given with a valid worker key.
A made-up method is 405 `method_not_allowed` on every path, before
authentication, and adds no series; a worker not seen for
TASKFORGE_WORKER_FORGET_SECONDS leaves `/metrics`; after every process is
stopped and started again, `/metrics` holds no series from before.

What a server does is tested through `run_api` (tests/service.py).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse
from django.test import Client
from django.utils import timezone
from prometheus_client import Counter
from rest_framework import status

from queues.models import Queue
from taskforge.api import middleware
from taskforge.api.models import ApiKey
from tests.service import API, Api, Service, database_url
from tests.test_metrics import Samples, parse, scrape, value
from workers.models import Worker

MADE_UP = ("FOO", "PROPFIND", "TRACE", "CONNECT", "get_", "X" * 40)
PATHS = (
    "/queues/q/tasks",
    "/workers/claim",
    "/admin/",
    "/admin/login/",
    "/no/such/path",
    "/metrics",
    "/healthz",
    "/static/dashboard/app.js",
)


def assert_method_not_allowed(code: int, body: Any) -> None:
    assert code == status.HTTP_405_METHOD_NOT_ALLOWED, body
    assert body == {
        "error": {
            "code": "method_not_allowed",
            "message": "The method is not one of DELETE, GET, HEAD, OPTIONS, PATCH, POST, PUT.",
        }
    }


# --- the rule, in this process ---------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("method", MADE_UP)
@pytest.mark.parametrize("path", PATHS)
def test_known_methods__a_made_up_method_is_405_on_every_path_before_authentication(
    method: str, path: str
) -> None:
    response = Client().generic(method, path)

    assert_method_not_allowed(response.status_code, response.json())
    assert response["Content-Type"] == "application/json"
    # The API view's methods, as its own 405 names them; no view, no Allow.
    allow = {"/queues/q/tasks": "GET, POST, HEAD, OPTIONS", "/workers/claim": "POST, OPTIONS"}
    assert response.get("Allow") == allow.get(path)


@pytest.mark.django_db
def test_known_methods__the_refusal_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="taskforge.request"):
        Client().generic("FOO", "/queues/q/tasks")

    (record,) = [r for r in caplog.records if r.getMessage() == "http.request"]
    fields = record.__dict__
    assert (fields["method"], fields["path"], fields["status"]) == ("FOO", "/queues/q/tasks", 405)


@pytest.mark.django_db
def test_known_methods__known_methods_go_on() -> None:
    client = Client()

    assert client.get("/healthz").status_code == status.HTTP_200_OK
    assert client.head("/healthz").status_code == status.HTTP_200_OK
    assert client.options("/queues").status_code == status.HTTP_401_UNAUTHORIZED
    assert client.generic("PATCH", "/queues").status_code == status.HTTP_401_UNAUTHORIZED
    # Django reads a method upper-cased: `get` is GET.
    assert client.generic("get", "/healthz").status_code == status.HTTP_200_OK


def test_known_methods__ahead_of_counting_authentication_and_views() -> None:
    chain = settings.MIDDLEWARE
    index = chain.index("taskforge.api.middleware.KnownMethodMiddleware")

    assert chain[:index] == ["taskforge.api.request_log.RequestLogMiddleware"]


def test_label_metric__a_made_up_method_is_one_label_and_the_children_are_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """django-prometheus labels its latency histogram by the raw method: whatever
    reaches it, the method is a known one or `<invalid method>`, and the cache of
    children stays within CHILDREN_KEPT."""
    monkeypatch.setattr(middleware, "CHILDREN_KEPT", 10)
    after = middleware.PrometheusAfterMiddleware(lambda request: HttpResponse())
    metric = Counter("labels_test", "test", ["view", "method"], registry=None)
    request = HttpRequest()

    for n in range(100):
        after.label_metric(metric, request, view="v", method=f"M{n}").inc()
        after.label_metric(metric, request, view=f"v{n}", method="GET").inc()

    methods = {labels[1] for labels in metric._metrics}
    assert methods == {"GET", middleware.INVALID_METHOD}
    assert len(after._children) == 10


# --- through run_api ------------------------------------------------------------------


def _env(**extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": "metric-labels-secret",
        "TASKFORGE_WEB_WORKERS": "2",
        **extra,
    }


@pytest.fixture
def api_server(
    tmp_path: Path, transactional_db: None, redis_client: redis.Redis
) -> Iterator[Service]:
    """run_api alone, with a metrics directory of its own."""
    svc = Service(
        tmp_path,
        _env(
            PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
            TASKFORGE_WORKER_FORGET_SECONDS="600",
        ),
    )
    svc.spawn(API)
    try:
        svc.wait_ready([API])
        yield svc
    finally:
        svc.stop()


def _scrape(api: Api) -> tuple[Samples, str]:
    code, text = api.call("GET", "/metrics")
    assert code == status.HTTP_200_OK
    return parse(text), text


@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_run_api__made_up_methods_unknown_paths_and_queues_add_no_series(
    api_server: Service,
) -> None:
    Queue.objects.create(name="known")
    producer = Api(api_server.base_url, ApiKey.issue(name="p", role="producer")[1])
    worker = Api(api_server.base_url, ApiKey.issue(name="w", role="worker")[1])
    anonymous = Api(api_server.base_url)
    unknown_queue = "/queues/{}/tasks"

    def requests(tag: str) -> list[tuple[Api, str, str, Any, int]]:
        """(client, method, path, body, expected status): one of each kind."""
        return [
            (anonymous, f"MADEUP{tag}", "/queues/known/tasks", None, 405),
            (anonymous, f"MADEUP{tag}", "/admin/", None, 405),
            (producer, f"Q{tag}", f"/no/such/{tag}", None, 405),
            (anonymous, "GET", f"/no/such/{tag}", None, 404),
            (anonymous, "GET", f"/admin/{tag}/", None, 302),  # to the sign-in page
            (producer, "GET", unknown_queue.format(f"q{tag}"), None, 404),
            (producer, "POST", unknown_queue.format(f"q{tag}"), {"payload": {}}, 404),
            (
                worker,
                "POST",
                "/workers/claim",
                # A worker id with a worker's key may be a label; the queue may not.
                {"worker_id": "w-known", "queues": [f"q{tag}"]},
                404,
            ),
            # A worker id with a key that is not a worker's: 403, never a label.
            (
                producer,
                "POST",
                "/workers/claim",
                {"worker_id": f"w{tag}", "queues": ["known"]},
                403,
            ),
        ]

    # Each kind once, and a scrape (which counts itself), before the baseline.
    for client, method, path, body, expected in requests("warmup"):
        assert client.call(method, path, body)[0] == expected, (method, path)
    _scrape(anonymous)
    before, _ = _scrape(anonymous)

    tags = [uuid.uuid4().hex[:10] for _ in range(200 // len(requests("x")) + 1)]
    for tag in tags:
        for client, method, path, body, expected in requests(tag):
            code, answer = client.call(method, path, body)
            assert code == expected, (method, path, code, answer)
            if expected == 405:
                assert_method_not_allowed(code, answer)

    after, text = _scrape(anonymous)
    assert set(after) - set(before) == set()
    for tag in tags:
        assert tag not in text
    assert value(after, "django_http_responses_total_by_status_total", status="405") == value(
        before, "django_http_responses_total_by_status_total", status="405"
    )
    assert not Worker.objects.exclude(worker_id="w-known").exists()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_run_api__a_worker_leaves_metrics_when_forgotten(api_server: Service) -> None:
    """TASKFORGE_WORKER_FORGET_SECONDS is 600 in this server."""
    Queue.objects.create(name="known")
    worker = Api(api_server.base_url, ApiKey.issue(name="w", role="worker")[1])
    anonymous = Api(api_server.base_url)
    remembered, forgotten = (f"w-{uuid.uuid4().hex[:10]}" for _ in range(2))
    for worker_id in (remembered, forgotten):
        assert (
            worker.call("POST", "/workers/claim", {"worker_id": worker_id, "queues": ["known"]})[0]
            == 200
        )

    samples, _ = _scrape(anonymous)
    for worker_id in (remembered, forgotten):
        assert (
            value(samples, "taskforge_worker_heartbeat_age_seconds", worker_id=worker_id)
            is not None
        )

    now = timezone.now()
    Worker.objects.filter(worker_id=remembered).update(last_seen_at=now - timedelta(seconds=300))
    Worker.objects.filter(worker_id=forgotten).update(last_seen_at=now - timedelta(seconds=900))

    samples, text = _scrape(anonymous)
    assert (
        value(samples, "taskforge_worker_heartbeat_age_seconds", worker_id=remembered) is not None
    )
    assert forgotten not in text


@pytest.mark.django_db
def test_metrics__a_worker_leaves_after_the_forget_setting(settings: Any) -> None:
    settings.TASKFORGE_WORKER_FORGET_SECONDS = 60
    now = timezone.now()
    Worker.objects.create(worker_id="w-seen", last_seen_at=now - timedelta(seconds=50))
    Worker.objects.create(worker_id="w-forgotten", last_seen_at=now - timedelta(seconds=70))

    samples = scrape(Client())

    assert value(samples, "taskforge_worker_heartbeat_age_seconds", worker_id="w-seen") is not None
    assert value(samples, "taskforge_worker_heartbeat_age_seconds", worker_id="w-forgotten") is None


@pytest.mark.postgres
@pytest.mark.timeout(240)
def test_restart__after_every_process_stopped_and_started_metrics_hold_nothing_from_before(
    tmp_path: Path, transactional_db: None, redis_client: redis.Redis
) -> None:
    """Started as API.md says (no metrics setting): the API's two processes and the
    loops, all at once, twice."""
    svc = Service(tmp_path, _env(TMPDIR=str(tmp_path)))
    svc.env = {k: v for k, v in svc.env.items() if not k.startswith("PROMETHEUS")}
    queue = f"r-{uuid.uuid4().hex[:8]}"
    Queue.objects.create(name=queue)
    api = Api(svc.base_url, ApiKey.issue(name="restart", role="admin")[1])
    try:
        svc.start()
        for n in range(3):
            api.ok("POST", f"/queues/{queue}/tasks", {"payload": {"n": n}})
        first, _ = _scrape(api)
        assert value(first, "taskforge_tasks_enqueued_total", queue=queue) == 3
        task_list = [key for key in first if ("view", "task-list") in key[1]]
        assert task_list

        svc.stop()
        svc.start()

        again, _ = _scrape(api)
        assert value(again, "taskforge_tasks_enqueued_total", queue=queue) is None
        assert [key for key in again if ("view", "task-list") in key[1]] == []
        # Only the files of processes alive now.
        (directory,) = tmp_path.glob("taskforge-metrics-*")
        pids = {
            int(m.group(1))
            for m in (re.search(r"-(\d+)\.db$", p.name) for p in directory.iterdir())
            if m
        }
        assert pids and all(_alive(pid) for pid in pids), pids
    finally:
        svc.stop()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_directory__processes_started_at_once_keep_each_others_files(tmp_path: Path) -> None:
    """Several processes joining an unheld directory at the same moment (honcho starts
    the API and the loops at once): the last run's files go, and no process's own
    file goes with them, whichever joins first."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_old-1.db").write_bytes(b"last run")
    probe = (
        "import django, os, sys; django.setup(); from taskforge import metrics;"
        "print('ready', flush=True); sys.stdin.readline();"
        "metrics.join_directory(sys.argv[1]);"
        "open(os.path.join(sys.argv[1], f'counter_probe-{os.getpid()}.db'), 'wb').close();"
        "print('joined', flush=True); sys.stdin.read()"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PROMETHEUS_MULTIPROC_DIR"] = ""  # the probes themselves count in memory
    env["DJANGO_SETTINGS_MODULE"] = "taskforge.settings"
    probes = [
        subprocess.Popen(
            [sys.executable, "-c", probe, str(directory)],
            cwd=settings.BASE_DIR,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    try:
        for proc in probes:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        for proc in probes:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in probes:
            assert proc.stdout is not None and proc.stdout.readline().strip() == "joined"

        names = sorted(p.name for p in directory.iterdir() if p.name != ".lock")
        assert names == sorted(f"counter_probe-{proc.pid}.db" for proc in probes)
    finally:
        for proc in probes:
            proc.kill()
            proc.communicate(timeout=10)
