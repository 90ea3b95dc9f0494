"""GET /metrics: counted metrics after known activity, database gauges, token auth,
and values summed across gunicorn workers and loop processes."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from django.conf import settings
from django.db import OperationalError, connection
from django.test import Client
from django.urls import resolve
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from rest_framework import status
from rest_framework.test import APIClient

from dashboard import metrics as dashboard_metrics
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge import metrics, urls
from taskforge.api.models import ApiKey
from tasks import transitions
from tasks.dispatcher import DispatcherLoop
from tasks.models import TaskStatus
from tasks.tests.factories import TaskFactory, age_lease
from tests.helpers import TRANSITION_FIELDS
from tests.service import children, database_url, paused
from workers.models import Worker

S = TaskStatus
Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def parse(text: str) -> Samples:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))


def scrape(client: Client, **headers: str) -> Samples:
    response = client.get("/metrics", headers=headers)
    assert response.status_code == status.HTTP_200_OK, response.content
    assert response["Content-Type"].startswith("text/plain")
    return parse(response.content.decode())


def depth(samples: Samples, queue: str) -> dict[str, float | None]:
    return {
        s: value(samples, "taskforge_queue_depth", queue=queue, status=s)
        for s in dashboard_metrics.DEPTH_STATUSES
    }


def unique(name: str) -> str:
    """A queue name no other run counted: counters outlive a test (and, in
    multiprocess mode, the test process)."""
    return f"m-{name}-{uuid.uuid4().hex[:8]}"


def dispatch() -> None:
    loop = DispatcherLoop()
    while loop.tick():
        pass


# --- counted metrics, in this process -------------------------------------------------


@pytest.mark.django_db
@pytest.mark.usefixtures("redis_client")
def test_metrics__enqueue_3_ack_2_dead_1(
    producer_client: APIClient,
    worker_client: APIClient,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    """Counters count committed transitions made through the API, exactly."""
    queue = QueueFactory(name=unique("activity"), max_retries=3)

    with django_capture_on_commit_callbacks(execute=True):
        for n in range(3):
            response = producer_client.post(
                f"/queues/{queue.name}/tasks", {"payload": {"n": n}}, format="json"
            )
            assert response.status_code == status.HTTP_201_CREATED
    with django_capture_on_commit_callbacks(execute=True):
        dispatch()
    with django_capture_on_commit_callbacks(execute=True):
        response = worker_client.post(
            "/workers/claim",
            {"worker_id": "w1", "queues": [queue.name], "max_tasks": 3},
            format="json",
        )
        claimed = [task["id"] for task in response.json()["tasks"]]
        assert len(claimed) == 3
    with django_capture_on_commit_callbacks(execute=True):
        for task_id in claimed[:2]:
            response = worker_client.post(
                "/workers/ack", {"worker_id": "w1", "task_id": task_id}, format="json"
            )
            assert response.status_code == status.HTTP_200_OK
        response = worker_client.post(
            "/workers/nack",
            {"worker_id": "w1", "task_id": claimed[2], "error": "boom", "retry": False},
            format="json",
        )
        assert response.json()["status"] == S.DEAD

    samples = scrape(Client())

    q = queue.name
    assert value(samples, "taskforge_tasks_enqueued_total", queue=q) == 3
    assert value(samples, "taskforge_tasks_dispatched_total", queue=q) == 3
    assert value(samples, "taskforge_tasks_completed_total", queue=q, status="done") == 2
    assert value(samples, "taskforge_tasks_completed_total", queue=q, status="dead") == 1
    assert value(samples, "taskforge_task_execution_duration_seconds_count", queue=q) == 2
    assert value(samples, "taskforge_task_execution_duration_seconds_bucket", queue=q, le="+Inf")
    assert depth(samples, q) == dict.fromkeys(dashboard_metrics.DEPTH_STATUSES, 0)
    assert value(samples, "taskforge_dlq_depth", queue=q) == 1


@pytest.mark.django_db
def test_metrics__duration_is_claim_to_ack(
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:
    queue = QueueFactory(name=unique("duration"))
    task = TaskFactory(queue=queue, status=S.CLAIMED)
    claimed_at = timezone.now()

    with django_capture_on_commit_callbacks(execute=True):
        transitions.hand_out([str(task.pk)], worker_id="w1", now=claimed_at)
        transitions.ack(
            [(str(task.pk), None, None)], worker_id="w1", now=claimed_at + timedelta(seconds=1.5)
        )

    samples = scrape(Client())
    histogram = "taskforge_task_execution_duration_seconds"
    assert value(samples, f"{histogram}_sum", queue=queue.name) == pytest.approx(1.5)
    assert value(samples, f"{histogram}_count", queue=queue.name) == 1
    assert value(samples, f"{histogram}_bucket", queue=queue.name, le="1.0") == 0
    assert value(samples, f"{histogram}_bucket", queue=queue.name, le="2.5") == 1
    assert value(samples, f"{histogram}_bucket", queue=queue.name, le="0.005") == 0
    assert value(samples, f"{histogram}_bucket", queue=queue.name, le="3600.0") == 1


def test_metrics__counting_never_raises_into_the_commit(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A committed ack must not become a failed request because a metric failed."""

    def broken(**labels: str) -> Any:
        raise OSError("multiprocess directory is gone")

    monkeypatch.setattr(metrics, "_enqueued", metrics._Children(SimpleNamespace(labels=broken)))
    line = {"queue": "q", "from_status": None, "to_status": S.PENDING, "duration_ms": None}

    metrics.on_transitions("task.created", [line])

    assert [r.getMessage() for r in caplog.records] == ["metrics.count_failed"]


# --- gauges, read from Postgres --------------------------------------------------------


@pytest.mark.django_db
def test_metrics__depth_and_dlq_depth_by_live_status() -> None:
    queue = QueueFactory(name=unique("depth"))
    empty = QueueFactory(name=unique("empty"))
    TaskFactory(queue=queue)  # due
    TaskFactory(queue=queue, scheduled_at=timezone.now() + timedelta(hours=1))
    for state in (S.CLAIMED, S.EXECUTING, S.RETRY, S.DEAD, S.DEAD, S.DONE, S.CANCELLED):
        TaskFactory(queue=queue, status=state)

    samples = scrape(Client())

    assert depth(samples, queue.name) == {
        "pending": 1,
        "scheduled": 1,
        "claimed": 1,
        "executing": 1,
        "retry": 1,
    }
    assert value(samples, "taskforge_dlq_depth", queue=queue.name) == 2
    # A queue without live tasks still has its series, at 0.
    assert depth(samples, empty.name) == dict.fromkeys(dashboard_metrics.DEPTH_STATUSES, 0)
    assert value(samples, "taskforge_dlq_depth", queue=empty.name) == 0


@pytest.mark.django_db
def test_metrics__running_against_the_queue_cap() -> None:
    capped = QueueFactory(name=unique("capped"), max_concurrency=10)
    free = QueueFactory(name=unique("free"))
    for _ in range(3):
        TaskFactory(queue=capped, status=S.EXECUTING)
    TaskFactory(queue=free, status=S.EXECUTING)

    samples = scrape(Client())

    assert value(samples, "taskforge_queue_running", queue=capped.name) == 3
    assert value(samples, "taskforge_queue_max_concurrency", queue=capped.name) == 10
    assert value(samples, "taskforge_queue_running", queue=free.name) == 1
    assert value(samples, "taskforge_queue_max_concurrency", queue=free.name) is None


@pytest.mark.django_db
def test_metrics__heartbeat_age_of_workers_seen_in_the_last_hour() -> None:
    now = timezone.now()
    Worker.objects.create(worker_id="w-recent", last_seen_at=now - timedelta(seconds=10))
    Worker.objects.create(worker_id="w-gone", last_seen_at=now - timedelta(hours=2))

    samples = scrape(Client())

    age = value(samples, "taskforge_worker_heartbeat_age_seconds", worker_id="w-recent")
    assert age is not None and 10 <= age < 20
    assert value(samples, "taskforge_worker_heartbeat_age_seconds", worker_id="w-gone") is None


@pytest.mark.django_db
def test_metrics__oldest_due_task_and_pause_by_queue() -> None:
    """The age of the oldest due task not yet handed out (pending or buffered), as
    GET /queues/:name/stats says it; 0 for a queue with none."""
    now = timezone.now()
    late = QueueFactory(name=unique("late"))
    idle = QueueFactory(name=unique("idle"), paused=True)
    TaskFactory(queue=late, scheduled_at=now - timedelta(minutes=10))
    TaskFactory(queue=late, status=S.CLAIMED, scheduled_at=now - timedelta(minutes=20))
    TaskFactory(queue=late, status=S.EXECUTING, scheduled_at=now - timedelta(hours=2))
    TaskFactory(queue=idle, scheduled_at=now + timedelta(hours=1))  # not due

    samples = scrape(Client())

    oldest = value(samples, "taskforge_queue_oldest_pending_age_seconds", queue=late.name)
    assert oldest is not None and 1200 <= oldest < 1260
    assert value(samples, "taskforge_queue_oldest_pending_age_seconds", queue=idle.name) == 0
    assert value(samples, "taskforge_queue_paused", queue=late.name) == 0
    assert value(samples, "taskforge_queue_paused", queue=idle.name) == 1


@pytest.mark.django_db
def test_metrics__worker_state_as_the_dashboard_shows_it() -> None:
    """active, left (quiet, holding nothing) or stale (quiet while holding a task, or
    after the watchdog reclaimed one): one series of value 1 per worker."""
    now = timezone.now()
    quiet = now - timedelta(minutes=5)
    for worker_id, seen in (("w-busy", now), ("w-left", quiet), ("w-hung", quiet)):
        Worker.objects.create(worker_id=worker_id, last_seen_at=seen)
    Worker.objects.create(worker_id="w-lost", last_seen_at=quiet, lost_tasks_at=now)
    TaskFactory(status=S.EXECUTING, worker_id="w-hung")

    samples = scrape(Client())

    states = {
        dict(labels)["worker_id"]: dict(labels)["state"]
        for (name, labels), v in samples.items()
        if name == "taskforge_worker_state" and v == 1
    }
    assert {w: s for w, s in states.items() if w.startswith("w-")} == {
        "w-busy": "active",
        "w-left": "left",
        "w-hung": "stale",
        "w-lost": "stale",
    }


def test_metrics__counters_still_scrape_when_postgres_fails(
    client: Client, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def down() -> Any:
        raise OperationalError("connection refused")

    monkeypatch.setattr(dashboard_metrics.DatabaseGauges, "_read", staticmethod(down))

    response = client.get("/metrics")

    assert response.status_code == status.HTTP_200_OK
    assert b"# TYPE taskforge_tasks_enqueued_total counter" in response.content
    assert b"taskforge_queue_depth" not in response.content
    assert "metrics.gauges_unavailable" in [r.getMessage() for r in caplog.records]


@pytest.mark.django_db
def test_metrics__request_metrics_of_django_prometheus(client: Client) -> None:
    # OPTIONS: no other process of this test run sends one, while services started by
    # earlier tests of the same test process count their GETs in the same directory.
    name, method = "django_http_requests_total_by_method_total", "OPTIONS"
    before = value(scrape(client), name, method=method) or 0

    client.options("/healthz")

    assert value(scrape(client), name, method=method) == before + 1


# --- the endpoint ----------------------------------------------------------------------


def test_metrics__one_route() -> None:
    routes = [p for p in urls.urlpatterns if "metrics" in str(getattr(p, "pattern", ""))]
    assert [str(p.pattern) for p in routes] == ["metrics"]
    assert resolve("/metrics").func is dashboard_metrics.metrics


@pytest.mark.django_db
def test_metrics__open_without_a_token_configured(client: Client, settings: Any) -> None:
    settings.TASKFORGE_METRICS_TOKEN = ""

    response = client.get("/metrics")

    assert response.status_code == status.HTTP_200_OK
    assert b"# TYPE taskforge_tasks_enqueued_total counter" in response.content


@pytest.mark.django_db
@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong", "Bearer", "Basic s3cret", "s3cret", "Bearer s3cret-and-more"],
)
def test_metrics__token_required_when_configured(
    client: Client, settings: Any, authorization: str | None
) -> None:
    settings.TASKFORGE_METRICS_TOKEN = "s3cret"
    headers = {} if authorization is None else {"Authorization": authorization}

    response = client.get("/metrics", headers=headers)

    assert response.status_code == status.HTTP_401_UNAUTHORIZED
    assert response.json() == {
        "error": {
            "code": "unauthenticated",
            "message": "Missing or wrong metrics token (TASKFORGE_METRICS_TOKEN).",
        }
    }
    assert response["WWW-Authenticate"] == 'Bearer realm="taskforge-metrics"'


@pytest.mark.django_db
def test_metrics__an_api_key_is_not_the_metrics_token(client: Client, settings: Any) -> None:
    settings.TASKFORGE_METRICS_TOKEN = "s3cret"
    _, key = ApiKey.issue(name="admin", role="admin")

    response = client.get("/metrics", headers={"Authorization": f"Bearer {key}"})

    assert response.status_code == status.HTTP_401_UNAUTHORIZED


@pytest.mark.django_db
def test_metrics__right_token(client: Client, settings: Any) -> None:
    settings.TASKFORGE_METRICS_TOKEN = "s3cret"

    response = client.get("/metrics", headers={"Authorization": "Bearer s3cret"})

    assert response.status_code == status.HTTP_200_OK


@pytest.mark.django_db
def test_metrics__openmetrics_when_asked(client: Client) -> None:
    response = client.get("/metrics", headers={"Accept": "application/openmetrics-text"})

    assert response.status_code == status.HTTP_200_OK
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.endswith(b"# EOF\n")


def test_metrics__get_only(client: Client) -> None:
    response = client.post("/metrics")

    assert response.status_code == status.HTTP_405_METHOD_NOT_ALLOWED
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_child_exit__forgets_live_gauges_keeps_counters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "MULTIPROC_DIR", str(tmp_path))
    ident = metrics.process_identifier(4242)
    (tmp_path / f"gauge_livesum_{ident}.db").write_bytes(b"")
    (tmp_path / f"counter_{ident}.db").write_bytes(b"")

    metrics.child_exit(None, SimpleNamespace(pid=4242))

    assert sorted(p.name for p in tmp_path.iterdir()) == [f"counter_{ident}.db"]


# --- across processes: two gunicorn workers and a loop ------------------------------------

BASE_DIR = Path(settings.BASE_DIR)
TOKEN = "multiprocess-test-token"
# <type>_<host>-<pid>.db: every file, django-prometheus's too, is named by host and pid.
FILE_NAME = re.compile(r"^(counter|histogram|summary|gauge_[a-z]+)_([A-Za-z0-9.-]+)-(\d+)\.db$")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def process_env(tmp_path: Path) -> dict[str, str]:
    """Environment of the API and loop processes: the test database, one metrics dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TASKFORGE_", "PROMETHEUS"))}
    env.update(
        DATABASE_URL=database_url(connection.settings_dict),
        REDIS_URL=settings.REDIS_URL,
        SECRET_KEY="multiprocess-test",
        DATABASE_POOL_MAX="4",
        LOG_LEVEL="INFO",
        PROMETHEUS_MULTIPROC_DIR=str(tmp_path / "prometheus"),
        TASKFORGE_METRICS_TOKEN=TOKEN,
    )
    return env


class Api:
    def __init__(self, base: str, key: str, log: Path, pid: int) -> None:
        self.base, self.key, self.log, self.pid = base, key, log, pid

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> Any:
        request = urllib.request.Request(
            self.base + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"Bearer {token or self.key}",
                "Content-Type": "application/json",
            },
        )
        # urllib sends `Connection: close`: every call is a new connection,
        # which either worker may accept.
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()

    def scrape(self) -> Samples:
        code, body = self.call("GET", "/metrics", token=TOKEN)
        assert code == status.HTTP_200_OK
        return parse(body.decode())

    def request_lines(self) -> list[dict[str, Any]]:
        lines = []
        for raw in self.log.read_text().splitlines():
            if raw.startswith("{"):
                line = json.loads(raw)
                if line.get("event") == "http.request":
                    lines.append(line)
        return lines


@pytest.fixture
def api(process_env: dict[str, str], tmp_path: Path) -> Iterator[Api]:
    """gunicorn with 2 workers (the project's gunicorn.conf.py) on a free port."""
    _, key = ApiKey.issue(name="multiprocess", role="admin")
    port = _free_port()
    log = tmp_path / "gunicorn.log"
    env = {
        **process_env,
        "TASKFORGE_BIND": f"127.0.0.1:{port}",
        "TASKFORGE_WEB_WORKERS": "2",
        "TASKFORGE_WEB_THREADS": "4",
    }
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "taskforge.wsgi",
                "-c",
                "gunicorn.conf.py",
                # Not the per-user default socket another gunicorn on this host may hold.
                "--no-control-socket",
            ],
            cwd=BASE_DIR,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    server = Api(f"http://127.0.0.1:{port}", key, log, proc.pid)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                if server.call("GET", "/healthz")[0] == status.HTTP_200_OK:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=40)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _run_loop(command: str, env: dict[str, str]) -> tuple[list[dict[str, Any]], int]:
    """`manage.py <command> --once` in its own process; its JSON log lines and pid."""
    proc = subprocess.Popen(
        [sys.executable, "manage.py", command, "--once"],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    return [json.loads(raw) for raw in stderr.splitlines() if raw.startswith("{")], proc.pid


@pytest.mark.postgres
@pytest.mark.timeout(180)
@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("redis_client")
def test_metrics__summed_across_gunicorn_workers_and_loop_processes(
    api: Api, process_env: dict[str, str]
) -> None:
    Queue.objects.create(name="mp", max_retries=3)
    posted = 0

    def enqueue(n: int) -> int:
        code: int = api.call("POST", "/queues/mp/tasks", {"payload": {"n": n}})[0]
        return code

    # Each worker serves 8 concurrent enqueues while the other is stopped: which
    # process the kernel hands a connection to is not left to chance.
    workers = children(api.pid, 2)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        for serving in workers:
            with paused([pid for pid in workers if pid != serving]):
                codes = list(pool.map(enqueue, range(posted, posted + 8)))
            assert codes == [status.HTTP_201_CREATED] * 8
            posted += 8
    lines = [line for line in api.request_lines() if line["path"] == "/queues/mp/tasks"]
    assert [(line["pid"], line["status"]) for line in lines] == [
        (pid, 201) for pid in workers for _ in range(8)
    ]
    pids = set(workers)

    samples = api.scrape()

    assert value(samples, "taskforge_tasks_enqueued_total", queue="mp") == posted
    # Due tasks of a running queue go straight into the buffer (claimed).
    pending_depth, claimed_depth = (
        value(samples, "taskforge_queue_depth", queue="mp", status=state)
        for state in ("pending", "claimed")
    )
    assert pending_depth is not None and claimed_depth is not None
    assert pending_depth + claimed_depth == posted
    # django-prometheus's request metrics are summed as well.
    assert (
        value(
            samples,
            "django_http_responses_total_by_status_view_method_total",
            status="201",
            view="task-list",
            method="POST",
        )
        == posted
    )

    # Acks in whichever worker the request lands on: completed and the histogram.
    _run_loop("run_dispatcher", process_env)
    code, body = api.call(
        "POST", "/workers/claim", {"worker_id": "w1", "queues": ["mp"], "max_tasks": 100}
    )
    assert code == status.HTTP_200_OK
    claimed = [task["id"] for task in json.loads(body)["tasks"]]
    assert len(claimed) == min(posted, 100)
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        codes = list(
            pool.map(
                lambda task_id: api.call(
                    "POST", "/workers/ack", {"worker_id": "w1", "task_id": task_id}
                )[0],
                claimed,
            )
        )
    assert codes == [status.HTTP_200_OK] * len(claimed)
    ack_pids = {line["pid"] for line in api.request_lines() if line["path"] == "/workers/ack"}

    samples = api.scrape()

    assert value(samples, "taskforge_tasks_completed_total", queue="mp", status="done") == len(
        claimed
    )
    assert value(samples, "taskforge_task_execution_duration_seconds_count", queue="mp") == len(
        claimed
    )
    assert value(samples, "taskforge_queue_depth", queue="mp", status="pending") == (
        posted - len(claimed)
    )

    # A loop process: the watchdog makes an expired lease's task dead.
    doomed = Queue.objects.create(name="mp-doomed", max_retries=0)
    task = TaskFactory(queue=doomed, status=S.EXECUTING)
    age_lease(task.pk, 3600)
    lines, watchdog_pid = _run_loop(
        "run_watchdog", {**process_env, "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS": "5"}
    )

    transition_lines = [line for line in lines if line.get("task_id") == str(task.pk)]
    assert [line["event"] for line in transition_lines] == ["task.dead_lettered"]
    assert TRANSITION_FIELDS <= set(transition_lines[0])
    assert transition_lines[0]["from_status"] == S.EXECUTING
    assert transition_lines[0]["to_status"] == S.DEAD

    samples = api.scrape()

    assert value(samples, "taskforge_tasks_completed_total", queue="mp-doomed", status="dead") == 1
    assert value(samples, "taskforge_dlq_depth", queue="mp-doomed") == 1
    assert value(samples, "taskforge_queue_depth", queue="mp-doomed", status="executing") == 0

    # Files: one set per process that counted, named by host and pid.
    directory = Path(process_env["PROMETHEUS_MULTIPROC_DIR"])
    files = [path.name for path in directory.iterdir() if path.name != ".lock"]
    assert (directory / ".lock").exists()  # held by every process while it runs
    matches = [FILE_NAME.match(name) for name in files]
    assert all(matches), files
    counter_pids = {int(m.group(3)) for m in matches if m and m.group(1) == "counter"}
    assert pids | ack_pids <= counter_pids
    assert watchdog_pid in counter_pids


# --- the per-host directory, with no setting (API.md v1.1) -------------------------


def test_directory__a_fresh_start_empties_it_a_running_process_keeps_it(tmp_path: Path) -> None:
    """The first process when none holds the lock clears the last run's files; a
    process joining a running deployment leaves the others' counts alone."""
    directory = tmp_path / "metrics"
    directory.mkdir()
    (directory / "counter_old-1.db").write_bytes(b"last run")
    probe = (
        "import sys, time; from taskforge import metrics;"
        "metrics.join_directory(sys.argv[1]); print('joined', flush=True); time.sleep(30)"
    )
    env = {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    env["PROMETHEUS_MULTIPROC_DIR"] = ""  # the probe itself counts in memory
    env["DJANGO_SETTINGS_MODULE"] = "taskforge.settings"
    first = subprocess.Popen(
        [sys.executable, "-c", "import django; django.setup();" + probe, str(directory)],
        cwd=BASE_DIR,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert first.stdout is not None and first.stdout.readline().strip() == "joined"
        assert not (directory / "counter_old-1.db").exists()  # a fresh start
        (directory / "counter_live-2.db").write_bytes(b"a running process's counts")
        os.close(metrics.join_directory(str(directory)))  # another process joins meanwhile
        assert (directory / "counter_live-2.db").exists()
    finally:
        first.kill()
        first.wait(timeout=10)
        if first.stdout is not None:
            first.stdout.close()


@pytest.mark.postgres
@pytest.mark.timeout(120)
def test_metrics__summed_across_run_api_processes_and_loops_with_no_setting(
    tmp_path: Path, transactional_db: None
) -> None:
    """Started as API.md says (run_api and the loops, no metrics setting at all): every
    scrape, whichever process answers it, shows the counts of all of them."""
    from tests.service import Api, Service

    env = {k: v for k, v in os.environ.items() if not k.startswith("PROMETHEUS")}
    env.update(
        DATABASE_URL=database_url(connection.settings_dict),
        REDIS_URL=settings.REDIS_URL,
        SECRET_KEY="no-setting-metrics",
        TMPDIR=str(tmp_path),  # where the per-host directory goes
    )
    svc = Service(tmp_path, env)
    svc.env = {k: v for k, v in svc.env.items() if not k.startswith("PROMETHEUS")}
    queue = f"ns-{uuid.uuid4().hex[:8]}"
    Queue.objects.create(name=queue, max_retries=0)
    _, key = ApiKey.issue(name="no-setting", role="admin")
    try:
        svc.start()
        api = Api(svc.base_url, key)
        for n in range(6):
            api.ok("POST", f"/queues/{queue}/tasks", {"payload": {"n": n}})
        # One lease left to expire: the watchdog (another process) dead-letters it.
        deadline = time.monotonic() + 20
        claimed: list[Any] = []
        while not claimed and time.monotonic() < deadline:
            claimed = api.ok("POST", "/workers/claim", {"worker_id": "w", "queues": [queue]})[
                "tasks"
            ]
        assert claimed
        scrapes: list[tuple[float | None, float | None]] = []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            status_code, text = api.call("GET", "/metrics")
            assert status_code == 200
            samples = parse(text)
            scrapes.append(
                (
                    value(samples, "taskforge_tasks_enqueued_total", queue=queue),
                    value(samples, "taskforge_tasks_completed_total", queue=queue, status="dead"),
                )
            )
            if scrapes[-1] == (6, 1) and len(scrapes) >= 6:
                break
            time.sleep(0.3)
        assert scrapes[-1] == (6, 1), scrapes
        assert all(enqueued == 6 for enqueued, _ in scrapes[-6:]), scrapes  # any process
        directories = list(tmp_path.glob("taskforge-metrics-*"))
        assert len(directories) == 1, directories
    finally:
        svc.stop()


@pytest.mark.django_db
def test_metrics__fairness_keys_by_queue() -> None:
    keyed = QueueFactory(name=unique("keyed"))
    for key in ("a", "a", "b", None):
        TaskFactory(queue=keyed, fairness_key=key)
    TaskFactory(queue=keyed, fairness_key="gone", status=S.DONE)
    samples = scrape(Client())
    assert value(samples, "taskforge_queue_keys", queue=keyed.name) == 3  # a, b, anonymous
