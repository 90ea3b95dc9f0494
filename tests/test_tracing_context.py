"""Trace context without a collector (API.md "Tracing (v1.2)"): which `traceparent` a task
keeps, that nothing of OpenTelemetry's SDK is imported while the OTEL_* variables are unset,
the SDK without OpenTelemetry, and a schedule's task starting a trace of its own.

The spans themselves, through real processes and an OTLP receiver: tests/test_tracing.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from queues.tests.factories import QueueFactory
from taskforge import tracing
from tasks import schedules
from tasks.models import Schedule, Task
from tasks.tests.factories import ScheduleFactory
from tests.service import ROOT

VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.mark.parametrize(
    ("traceparent", "tracestate", "kept"),
    [
        (VALID, "congo=t61rcWkgMzE", (VALID, "congo=t61rcWkgMzE")),
        (VALID, None, (VALID, None)),
        (f" {VALID}\t", " a=1 , b=2 ", (VALID, "a=1,b=2")),
        (VALID.replace("-01", "-00"), "a=1", (VALID.replace("-01", "-00"), "a=1")),
        # A later version: its first four fields, whatever follows a dash.
        ("cc" + VALID[2:] + "-what-ever", None, ("cc" + VALID[2:], None)),
        ("cc" + VALID[2:] + "x", None, (None, None)),
        (VALID + "-x", "a=1", (None, None)),  # version 00 has four fields
        ("ff" + VALID[2:], "a=1", (None, None)),
        (VALID.upper(), "a=1", (None, None)),
        ("00-" + "0" * 32 + VALID[35:], "a=1", (None, None)),
        (VALID[:36] + "0" * 16 + "-01", "a=1", (None, None)),
        (VALID[:-3], "a=1", (None, None)),
        ("", "a=1", (None, None)),
        (None, "a=1", (None, None)),
        (42, "a=1", (None, None)),
        ([VALID], "a=1", (None, None)),
        # A bad tracestate is dropped alone.
        (VALID, "=1", (VALID, None)),
        (VALID, "no-equals", (VALID, None)),
        (VALID, "a=\u00e9", (VALID, None)),
        (VALID, "a=1\n", (VALID, None)),
        (VALID, "a=" + "x" * 511, (VALID, None)),
        (VALID, ",".join(f"k{n}=v" for n in range(33)), (VALID, None)),
        (VALID, 7, (VALID, None)),
    ],
)
def test_context_of__keeps_only_the_w3c_form(traceparent: object, tracestate: object, kept) -> None:
    assert tracing.context_of(traceparent, tracestate) == kept


def test_from_headers__reads_the_wsgi_names() -> None:
    meta = {"HTTP_TRACEPARENT": VALID, "HTTP_TRACESTATE": "a=1"}
    assert tracing.from_headers(meta) == (VALID, "a=1")
    assert tracing.from_headers({"HTTP_TRACESTATE": "a=1"}) == (None, None)


@pytest.mark.parametrize(
    ("env", "enabled"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_SERVICE_NAME": "x", "OTEL_TRACES_SAMPLER": "always_on"}, False),
    ],
)
def test_configured__only_an_otlp_endpoint_turns_exporting_on(env: dict[str, str], enabled: bool):
    assert tracing._configured(env) is enabled


def test_push_context__not_exporting_passes_the_enqueues_values_on() -> None:
    assert not tracing.ENABLED  # the test process sets no OTEL_* variable
    task = SimpleNamespace(pk=uuid.uuid4(), traceparent=VALID, attempts=3, first_claimed_at=None)
    assert tracing.push_context(task, "a=1") == (VALID, "a=1")
    task.traceparent = None
    assert tracing.push_context(task, None) == (None, None)


def _python(code: str, env: dict[str, str]) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_unset__no_opentelemetry_sdk_imported_by_any_service_module() -> None:
    """API.md: unset, no OTLP connection; here, not even the SDK's tracing or an exporter is
    loaded.  (redis-py imports the SDK's metrics part when it is installed, for its own
    optional instruments: not ours, and nothing on a request's path.)"""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["DJANGO_SETTINGS_MODULE"] = "taskforge.settings"
    code = (
        "import sys, django; django.setup()\n"
        "import taskforge.urls, tasks.transitions, tasks.schedules, workers.pusher\n"
        "import workers.watchdog, cloudtasks.views, taskforge.tracing as t\n"
        "loaded = sorted(m for m in sys.modules if m.startswith("
        "('opentelemetry.sdk.trace', 'opentelemetry.exporter')))\n"
        "print(t.ENABLED, loaded)"
    )
    assert _python(code, env) == "False []"


def test_sdk__works_without_opentelemetry() -> None:
    """No hard dependency: with `opentelemetry` unimportable the SDK enqueues and runs
    handlers as before."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'opentelemetry' or name.startswith('opentelemetry.'):\n"
        "            raise ImportError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import taskforge_client\n"
        "from taskforge_client import tracing, TaskSpec\n"
        "with tracing.process_span('q', 't', 1, '" + VALID + "', None):\n"
        "    ran = True\n"
        "print(tracing.available(), tracing.current_context(), ran,\n"
        "      TaskSpec(1, traceparent='" + VALID + "').body()['traceparent'] == '" + VALID + "')"
    )
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    assert _python(code, env) == "False {} True True"


@pytest.mark.django_db
def test_schedule__each_fire_starts_a_trace_of_its_own() -> None:
    queue = QueueFactory()
    schedule = ScheduleFactory(queue=queue, cron="0 * * * *")
    first = datetime(2030, 1, 1, 10, tzinfo=UTC)
    Schedule.objects.filter(pk=schedule.pk).update(next_run_at=first)
    assert schedules.fire_due(first + timedelta(milliseconds=5)) == 1
    assert schedules.fire_due(first + timedelta(hours=1, milliseconds=5)) == 1
    tasks = list(Task.objects.filter(queue=queue).order_by("scheduled_at"))
    assert len(tasks) == 2
    kept = [tracing.context_of(task.traceparent, None)[0] for task in tasks]
    assert kept == [task.traceparent for task in tasks] and None not in kept
    assert kept[0] is not None and kept[1] is not None
    assert kept[0][3:35] != kept[1][3:35]  # two traces
    assert all(task.tracestate is None for task in tasks)
