"""Secrets in push settings (API.md v1.2): the dashboard and Django admin show a queue's push
target redacted to every user, superusers included; the admin's queue form takes the
redacted form back without wiping the stored secrets."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.test import Client

from dashboard import sse
from dashboard.tests.pages import D
from queues import services
from queues.models import Queue
from taskforge.audit.log import CLI
from taskforge.audit.models import AuditEntry
from tasks.tests.factories import TaskFactory

pytestmark = pytest.mark.django_db

SECRETS = ("pa55word", "qt0ken", "s3cret", "k3y-value")
PUSH: dict[str, Any] = {
    "url": "https://bot:pa55word@hooks.example.com/in?token=qt0ken",
    "timeout_seconds": 30,
    "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y-value"},
}
SHOWN: dict[str, Any] = {
    "url": "https://hooks.example.com/in",
    "timeout_seconds": 30,
    "headers": {"Authorization": "[redacted]", "X-Api-Key": "[redacted]"},
}
CHANGE = "/admin/queues/queue/{}/change/"


@pytest.fixture
def queue() -> Queue:
    """A push queue created and changed as an operator would (so the audit log has entries)."""
    queue = services.create_queue("hooks", actor=CLI, push={**PUSH, "timeout_seconds": 10})
    return services.update_queue(queue, actor=CLI, push=PUSH)


def _text(response: Any) -> str:
    assert response.status_code == 200, response.status_code
    if getattr(response, "streaming", False):
        return b"".join(response.streaming_content).decode()
    return str(response.content.decode())


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


@pytest.mark.parametrize("who", ["viewer_client", "superuser_client"])
@pytest.mark.parametrize("page", ["", "audit/", "task", "stream"])
def test_dashboard__pages_show_no_secret(
    who: str, page: str, queue: Queue, request: pytest.FixtureRequest, monkeypatch: Any
) -> None:
    client: Client = request.getfixturevalue(who)
    monkeypatch.setattr(sse, "LIFETIME_SECONDS", 0.0)  # one snapshot, then the stream ends
    if page == "task":
        page = f"tasks/{TaskFactory(queue=queue).pk}"
    text = _text(client.get(f"{D}/{page}"))
    _assert_no_secret(text)
    if page == "audit/":
        assert "hooks.example.com/in" in text and "[redacted]" in text


@pytest.mark.parametrize(
    "url", ["/admin/queues/queue/", "/admin/audit/auditentry/", CHANGE, "history"]
)
def test_admin__superusers_see_no_secret(url: str, queue: Queue, superuser_client: Client) -> None:
    if url == "history":
        url = f"/admin/queues/queue/{queue.pk}/history/"
    text = _text(superuser_client.get(url.format(queue.pk)))
    _assert_no_secret(text)


def test_admin__the_change_form_shows_push_redacted(queue: Queue, superuser_client: Client) -> None:
    form = superuser_client.get(CHANGE.format(queue.pk)).context["adminform"].form
    assert json.loads(form["push"].value()) == SHOWN


def test_admin__a_view_only_page_shows_push_redacted(queue: Queue, viewer_client: Client) -> None:
    """A viewer's queue page prints the fields as stored; `push` is shown redacted instead."""
    text = _text(viewer_client.get(CHANGE.format(queue.pk)))
    _assert_no_secret(text)
    assert "hooks.example.com/in" in text and "Authorization" in text
    entry = AuditEntry.objects.get(action="queue.update")
    _assert_no_secret(_text(viewer_client.get(f"/admin/audit/auditentry/{entry.pk}/change/")))


def _post(client: Client, queue: Queue, push: Any, **fields: Any) -> Any:
    data = {
        "max_retries": "3",
        "rate_limit": "",
        "max_concurrency": "",
        "push": json.dumps(push),
        "_save": "Save",
        **fields,
    }
    return client.post(CHANGE.format(queue.pk), data)


def test_admin__saving_another_field_keeps_the_stored_secrets(
    queue: Queue, superuser_client: Client
) -> None:
    response = _post(superuser_client, queue, SHOWN, max_retries="7")
    assert response.status_code == 302, response.context["adminform"].form.errors
    queue.refresh_from_db()
    assert (queue.max_retries, queue.push) == (7, PUSH)
    last = AuditEntry.objects.order_by("-id").first()
    assert last is not None and last.details == {"changed": {"max_retries": [3, 7]}}


def test_admin__a_changed_timeout_keeps_the_redacted_values(
    queue: Queue, superuser_client: Client
) -> None:
    response = _post(superuser_client, queue, {**SHOWN, "timeout_seconds": 5})
    assert response.status_code == 302
    queue.refresh_from_db()
    assert queue.push == {**PUSH, "timeout_seconds": 5}


def test_admin__values_typed_anew_replace_the_stored_ones(
    queue: Queue, superuser_client: Client
) -> None:
    typed = {
        **SHOWN,
        "url": "https://hooks.example.com/in?token=n3w",
        "headers": {"Authorization": "Bearer n3w", "X-Api-Key": "[redacted]"},
    }
    assert _post(superuser_client, queue, typed).status_code == 302
    queue.refresh_from_db()
    assert queue.push == {
        "url": "https://hooks.example.com/in?token=n3w",
        "timeout_seconds": 30,
        "headers": {"Authorization": "Bearer n3w", "X-Api-Key": "k3y-value"},
    }


def test_admin__a_redacted_value_with_nothing_stored_is_a_form_error(
    queue: Queue, superuser_client: Client
) -> None:
    added = {**SHOWN, "headers": {**SHOWN["headers"], "X-New": "[redacted]"}}
    response = _post(superuser_client, queue, added)
    assert response.status_code == 200
    assert "X-New" in str(response.context["adminform"].form.errors["push"])
    queue.refresh_from_db()
    assert queue.push == PUSH
