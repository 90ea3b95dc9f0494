"""Strings are taken as sent (API.md "Security (v1.2)"): worker ids and the names of
queues, schedules and API keys are never trimmed.

The API's bodies are rows of tests/test_malformed.py; here, the other ways in:
the management commands (exit 1 and a message) and Django admin's forms.
"""

from __future__ import annotations

import subprocess
import sys
from io import StringIO

import pytest
from django.conf import settings
from django.contrib.auth.models import User
from django.core.management import CommandError, call_command
from django.db import connection
from django.test import Client

from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.models import ApiKey
from tasks.models import Schedule
from tests.service import ROOT, database_url

pytestmark = pytest.mark.django_db

NOT_AS_SENT = {
    "leading space": " ci",
    "trailing space": "ci ",
    "trailing newline": "ci\n",
    "tab inside": "c\ti",
    "control character": "c\x01i",
    "DEL": "ci\x7f",
}


@pytest.mark.parametrize("name", NOT_AS_SENT.values(), ids=NOT_AS_SENT.keys())
def test_createapikey__refuses_a_name_not_as_sent(name: str) -> None:
    out = StringIO()
    with pytest.raises(CommandError, match="whitespace"):
        call_command("createapikey", name, "--role", "worker", stdout=out)
    assert out.getvalue() == ""
    assert not ApiKey.objects.exists()


@pytest.mark.parametrize("name", NOT_AS_SENT.values(), ids=NOT_AS_SENT.keys())
def test_revokeapikey__refuses_a_name_not_as_sent(name: str) -> None:
    ApiKey.issue(name="ci", role="worker")
    with pytest.raises(CommandError, match="whitespace"):
        call_command("revokeapikey", name, stdout=StringIO())
    assert not ApiKey.objects.get().revoked


@pytest.mark.parametrize("name", NOT_AS_SENT.values(), ids=NOT_AS_SENT.keys())
def test_createqueue__refuses_a_name_not_as_sent(name: str) -> None:
    with pytest.raises(CommandError, match="name"):
        call_command("createqueue", name, stdout=StringIO())
    assert not Queue.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_commands__exit_1_with_a_message_for_a_control_character() -> None:
    env = {
        "DATABASE_URL": database_url(connection.settings_dict),
        "REDIS_URL": settings.REDIS_URL,
        "SECRET_KEY": "as-sent-secret-key",
        "PATH": "/usr/bin:/bin",
    }
    for argv, words in [
        (["createapikey", "ci\x01", "--role", "admin"], "control characters"),
        (["createqueue", "q\x01"], "name: Use 1 to 100"),
    ]:
        done = subprocess.run(
            [sys.executable, "manage.py", *argv],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, (argv, done.stderr)
        assert done.stdout == ""
        assert words in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not ApiKey.objects.exists() and not Queue.objects.exists()


# -- Django admin's forms (Django's form fields trim by default) ----------------------------


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(User.objects.create_superuser("root", password="x" * 20))
    return client


@pytest.mark.parametrize("name", [" new-q", "new-q\n", "new-q\t"])
def test_queue_admin__refuses_a_name_not_as_sent(name: str, superuser_client: Client) -> None:
    response = superuser_client.post("/admin/queues/queue/add/", {"name": name, "max_retries": 2})
    assert response.status_code == 200  # the form again, with its error
    assert response.context["adminform"].form.errors["name"]
    assert not Queue.objects.exists()


def test_schedule_admin__refuses_a_name_not_as_sent(superuser_client: Client) -> None:
    queue = QueueFactory(name="q")
    form = {
        "queue": str(queue.pk),
        "name": "nightly\n",
        "cron": "0 0 * * *",
        "timezone": "UTC",
        "payload": '{"a": 1}',
        "priority": "5",
        "max_retries": "",
    }
    response = superuser_client.post("/admin/tasks/schedule/add/", form)
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["name"]
    assert not Schedule.objects.exists()
    response = superuser_client.post("/admin/tasks/schedule/add/", {**form, "name": "nightly"})
    assert response.status_code == 302
    assert Schedule.objects.get().name == "nightly"


@pytest.mark.parametrize("name", [" deploy-bot", "deploy-bot ", "deploy\x01bot"])
def test_api_key_admin__refuses_a_name_not_as_sent(name: str, superuser_client: Client) -> None:
    response = superuser_client.post("/admin/api/apikey/add/", {"name": name, "role": "worker"})
    assert response.status_code == 200
    assert "key" not in response.context or response.context.get("key") is None
    assert response.context["adminform"].form.errors["name"]
    assert not ApiKey.objects.exists()
