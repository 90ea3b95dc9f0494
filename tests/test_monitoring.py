"""The monitoring kit of deploy/ (API.md "Tracing (v1.2)"): Prometheus alert rules checked
and unit-tested by `promtool`, and a Grafana dashboard, both held to what a running
TaskForge really exposes.

The real check: the whole service runs as processes (tests/service.py, with run_pusher)
and does some work (tasks enqueued, handed out, acked, dead, pushed); a real Prometheus
scrapes its `/metrics` with the rules loaded; every metric the dashboard's expressions and
the rules name is then in Prometheus, every dashboard expression evaluates, and every rule
evaluates without error.  Prometheus and promtool come from Debian's `prometheus` package
(`make test` installs it when it can); without them these tests skip and say why.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from django.conf import settings
from django.db import connection

from taskforge.api.models import ApiKey
from tests.pushtarget import Target
from tests.service import ROOT, Api, Service, database_url, free_port

DEPLOY = ROOT / "deploy"
RULES = DEPLOY / "prometheus" / "alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "taskforge.json"
JOB = "taskforge"  # the scrape job the rules and docs/operations.md name

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None,
    reason="no promtool (Debian's prometheus package: apt-get install prometheus; "
    "make test installs it when run as root)",
)
needs_prometheus = pytest.mark.skipif(
    PROMETHEUS is None,
    reason="no prometheus (Debian's prometheus package: apt-get install prometheus; "
    "make test installs it when run as root)",
)

# PromQL words that are not metric names.
_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression reads (selectors, with or without braces)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values, Grafana's $variables
    text = re.sub(r"\{[^}]*\}", " ", text)  # label matchers
    text = re.sub(r"\[[^\]]*\]", " ", text)  # ranges
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    names = set()
    for match in re.finditer(r"(?<![\w$.])([a-zA-Z_:][\w:]*)\s*(\()?", text):
        name, call = match[1], match[2]
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def dashboard() -> dict[str, Any]:
    board: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return board


def dashboard_panels() -> list[dict[str, Any]]:
    return [panel for panel in dashboard()["panels"] if panel["type"] != "row"]


def dashboard_exprs() -> list[str]:
    return [target["expr"] for panel in dashboard_panels() for target in panel["targets"]]


def rules() -> list[dict[str, Any]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def test_metric_names__read_from_promql() -> None:
    expr = (
        'sum by (queue) (rate(taskforge_tasks_completed_total{job=~"$job", status="dead"}'
        "[$__rate_interval])) / on (queue) group_left taskforge_dlq_depth - "
        "min_over_time(taskforge_queue_depth[15m]) unless absent(up) > 0.5"
    )

    assert metric_names(expr) == {
        "taskforge_tasks_completed_total",
        "taskforge_dlq_depth",
        "taskforge_queue_depth",
        "up",
    }


# --- the rules, by promtool --------------------------------------------------------


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_alert_rules__pass_promtool_check_rules() -> None:
    result = _promtool("check", "rules", str(RULES))

    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout


@needs_promtool
def test_alert_rules__pass_their_promtool_unit_tests() -> None:
    result = _promtool("test", "rules", str(RULE_TESTS))

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_alert_rules__each_is_tested_firing_and_not_firing() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in tests["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check["exp_alerts"] else quiet).add(check["alertname"])
    names = {rule["alert"] for rule in rules()}

    assert names == fired
    assert names == quiet
    # What API.md and the issue name, each by its rule.
    assert {
        "TaskForgeApiDown",
        "TaskForgeBacklogOld",
        "TaskForgeNoDispatchProgress",
        "TaskForgeDLQGrowing",
        "TaskForgeTaskErrorRate",
        "TaskForgeStaleWorker",
    } <= names


def test_docs__name_every_alert_and_link_the_kit() -> None:
    operations = (ROOT / "docs" / "operations.md").read_text()
    section = operations.split("## Metrics and alerts", 1)[1].split("\n## ", 1)[0]
    readme = (ROOT / "README.md").read_text()

    for rule in rules():
        assert f"`{rule['alert']}`" in section, rule["alert"]
    for path in ("deploy/prometheus/alerts.yml", "deploy/grafana/taskforge.json"):
        assert f"(../{path})" in section and f"({path})" in readme
    assert f"job_name: {JOB}" in section


# --- the dashboard, as Grafana imports it ------------------------------------------


def test_dashboard__importable_with_a_datasource_variable() -> None:
    board = dashboard()
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert board["uid"] == "taskforge" and board.get("id") is None
    assert "__inputs" not in board  # nothing to answer on import

    panels = dashboard_panels()
    assert panels
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    source = {"type": "prometheus", "uid": "${datasource}"}
    for panel in panels:
        assert panel["datasource"] == source, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == source, panel["title"]
    for name in ("job", "queue"):
        assert variables[name]["datasource"] == source


def test_dashboard__panels_do_not_overlap() -> None:
    taken: set[tuple[int, int]] = set()
    for panel in dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, panel["title"]
        taken |= cells


def test_dashboard__covers_what_on_call_needs() -> None:
    """Queue depth and age, throughput, error rate, DLQ, execution duration percentiles,
    workers and heartbeat age, push outcomes."""
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))

    assert {
        "taskforge_queue_depth",
        "taskforge_queue_oldest_pending_age_seconds",
        "taskforge_tasks_enqueued_total",
        "taskforge_tasks_dispatched_total",
        "taskforge_tasks_completed_total",
        "taskforge_dlq_depth",
        "taskforge_task_execution_duration_seconds_bucket",
        "taskforge_worker_state",
        "taskforge_worker_heartbeat_age_seconds",
        "taskforge_push_requests_total",
    } <= used
    assert any("histogram_quantile(0.99" in expr for expr in dashboard_exprs())


# --- a real Prometheus scraping a running TaskForge ----------------------------------


def _get(url: str, params: dict[str, str] | None = None) -> Any:
    if params:
        url = f"{url}?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.load(answer)


def _wait(check: Callable[[], Any], timeout: float, what: Callable[[], str]) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting: {what()}"
        time.sleep(0.2)


@pytest.fixture
def service(tmp_path: Path, transactional_db: None, redis_client: Any) -> Iterator[Service]:
    svc = Service(
        tmp_path,
        {
            "DATABASE_URL": database_url(connection.settings_dict),
            "REDIS_URL": settings.REDIS_URL,
            "SECRET_KEY": "monitoring-secret-key",
            # The push target listens on 127.0.0.1 (blocked by default).
            "TASKFORGE_PUSH_ALLOWED_NETWORKS": "127.0.0.0/8",
            "TASKFORGE_WEB_WORKERS": "1",
            # The worker's last task stays its own until the test nacks it.
            "TASKFORGE_HEARTBEAT_TIMEOUT_SECONDS": "120",
        },
        extra_loops=("pusher",),
    )
    try:
        svc.start()
        yield svc
    finally:
        svc.stop()


def _work(svc: Service, target: Target) -> Callable[[], Any]:
    """A pull queue with a cap (tasks done, dead and executing) and a push queue; returns
    the nack (retry false) of the task left executing."""
    _, admin_key = ApiKey.issue(name="monitoring-admin", role="admin")
    _, worker_key = ApiKey.issue(name="monitoring-worker", role="worker")
    admin, worker = Api(svc.base_url, admin_key), Api(svc.base_url, worker_key)
    admin.ok("POST", "/queues", {"name": "mon-pull", "max_concurrency": 5})
    admin.ok("POST", "/queues", {"name": "mon-push", "push": {"url": target.url()}})
    admin.ok(
        "POST", "/queues/mon-pull/tasks/batch", {"tasks": [{"payload": {"n": n}} for n in range(3)]}
    )
    admin.ok("POST", "/queues/mon-push/tasks", {"payload": {"n": 0}})
    claimed: list[str] = []
    while len(claimed) < 3:
        answer = worker.ok(
            "POST",
            "/workers/claim",
            {
                "worker_id": "mon-w1",
                "queues": ["mon-pull"],
                "max_tasks": 3 - len(claimed),
                "wait_seconds": 5,
            },
        )
        claimed += [task["id"] for task in answer["tasks"]]
    worker.ok("POST", "/workers/ack", {"worker_id": "mon-w1", "task_id": claimed[0]})
    nacked = worker.ok(
        "POST",
        "/workers/nack",
        {"worker_id": "mon-w1", "task_id": claimed[1], "error": "boom", "retry": False},
    )
    assert nacked["status"] == "dead"
    _wait(
        lambda: admin.ok("GET", "/queues/mon-push/stats")["throughput_per_second"] > 0,
        30,
        lambda: "the push queue's task done",
    )
    body = {"worker_id": "mon-w1", "task_id": claimed[2], "error": "boom", "retry": False}
    return lambda: worker.ok("POST", "/workers/nack", body)


@pytest.fixture
def prometheus(tmp_path: Path, service: Service) -> Iterator[str]:
    """Prometheus scraping the service every second with the rules loaded; its base URL."""
    assert PROMETHEUS is not None
    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(RULES)],
                "scrape_configs": [
                    {
                        "job_name": JOB,
                        "static_configs": [{"targets": [f"127.0.0.1:{service.port}"]}],
                    }
                ],
            }
        )
    )
    log = (tmp_path / "prometheus.log").open("wb")
    proc = subprocess.Popen(
        [
            PROMETHEUS,
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)
        log.close()


def _ready(base: str) -> bool:
    try:
        with urllib.request.urlopen(f"{base}/-/ready", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@needs_prometheus
@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_prometheus__scrapes_every_metric_the_dashboard_and_rules_use(
    service: Service, prometheus: str, tmp_path: Path
) -> None:
    with Target() as target:
        nack_dead = _work(service, target)
    _wait(lambda: _ready(prometheus), 30, lambda: (tmp_path / "prometheus.log").read_text())
    used = set().union(*(metric_names(expr) for expr in dashboard_exprs()))
    used |= set().union(*(metric_names(rule["expr"]) for rule in rules()))

    def stored() -> set[str]:
        return set(_get(f"{prometheus}/api/v1/label/__name__/values")["data"])

    _wait(lambda: not used - stored(), 60, lambda: f"not scraped: {sorted(used - stored())}")
    up = _get(f"{prometheus}/api/v1/query", {"query": f'up{{job="{JOB}"}}'})["data"]["result"]
    assert [sample["value"][1] for sample in up] == ["1"]

    # Every dashboard expression evaluates (Grafana's variables as "all").
    time.sleep(2)  # two scrapes in every rate window
    for expr in dashboard_exprs():
        query = expr.replace("$__rate_interval", "1m").replace("$job", JOB).replace("$queue", ".*")
        answer = _get(f"{prometheus}/api/v1/query", {"query": query})
        assert answer["status"] == "success", (expr, answer)

    # Every rule evaluates on real series without an error (matching, types).
    def evaluated() -> list[dict[str, Any]] | None:
        groups = _get(f"{prometheus}/api/v1/rules")["data"]["groups"]
        found = [rule for group in groups for rule in group["rules"]]
        return found if found and all(r["health"] != "unknown" for r in found) else None

    loaded = _wait(evaluated, 30, lambda: "every rule evaluated once")
    assert {rule["name"] for rule in loaded} == {rule["alert"] for rule in rules()}
    assert [(r["name"], r.get("lastError")) for r in loaded if r["health"] != "ok"] == []
    # The worker holds a task and was just seen: not stale; nothing is down.
    assert firing(prometheus) == set()

    # A task dies while Prometheus watches: the DLQ grew.
    nack_dead()
    _wait(
        lambda: firing(prometheus) == {("TaskForgeDLQGrowing", "mon-pull")},
        30,
        lambda: f"TaskForgeDLQGrowing alone: {firing(prometheus)}",
    )


def firing(prometheus: str) -> set[tuple[str, str | None]]:
    alerts = _get(f"{prometheus}/api/v1/alerts")["data"]["alerts"]
    return {
        (alert["labels"]["alertname"], alert["labels"].get("queue"))
        for alert in alerts
        if alert["state"] == "firing"
    }
