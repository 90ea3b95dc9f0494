"""The audit log page: newest first, the filters of GET /audit, keyset pages."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import transaction
from django.test import Client
from django.utils import timezone

from dashboard.tests.pages import D
from dashboard.views import audit
from taskforge.audit.log import CLI, Actor, record
from taskforge.audit.models import Action, AuditEntry

pytestmark = pytest.mark.django_db


def _entry(minutes_ago: int, action: Action, actor: Actor, queue: str | None) -> AuditEntry:
    with transaction.atomic():
        entry = record(actor, action, queue=queue, target=queue or "key-1")
    AuditEntry.objects.filter(pk=entry.pk).update(
        at=timezone.now() - timedelta(minutes=minutes_ago)
    )
    return entry


@pytest.fixture
def log() -> list[AuditEntry]:
    """Newest first."""
    return [
        _entry(1, Action.QUEUE_DELETE, Actor.api_key("deploy-bot"), "old"),
        _entry(2, Action.APIKEY_REVOKE, Actor.user("ann"), None),
        _entry(3, Action.QUEUE_PAUSE, Actor.user("ann"), "emails"),
        _entry(4, Action.QUEUE_CREATE, CLI, "emails"),
    ]


def _shown(response: object) -> list[int]:
    return [row["entry"].pk for row in response.context["rows"]]  # type: ignore[attr-defined]


def test_audit__lists_every_entry_newest_first(staff_client: Client, log: list[AuditEntry]) -> None:
    response = staff_client.get(f"{D}/audit/")

    assert response.status_code == 200
    assert _shown(response) == [e.pk for e in log]
    html = response.content.decode()
    assert "deploy-bot" in html and "queue.delete" in html and "manage.py" in html


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ({"action": "queue.pause"}, [2]),
        ({"actor": "ann"}, [1, 2]),
        ({"actor": "an"}, []),
        ({"queue": "emails"}, [2, 3]),
        ({"queue": "old"}, [0]),  # a deleted queue stays searchable
    ],
)
def test_audit__filters(
    staff_client: Client, log: list[AuditEntry], query: dict[str, str], expected: list[int]
) -> None:
    assert _shown(staff_client.get(f"{D}/audit/", query)) == [log[i].pk for i in expected]


def test_audit__time_filters_are_exclusive(staff_client: Client, log: list[AuditEntry]) -> None:
    at = AuditEntry.objects.get(pk=log[2].pk).at
    after = (at - timedelta(seconds=30)).strftime("%Y-%m-%dT%H:%M:%S")

    assert _shown(staff_client.get(f"{D}/audit/", {"after": after})) == [e.pk for e in log[:3]]


def test_audit__pages_on_a_cursor_and_refuses_a_bad_one(
    staff_client: Client, log: list[AuditEntry]
) -> None:
    first = audit.audit_page({}, limit=3)
    assert [e.pk for e in first.rows] == [e.pk for e in log[:3]]
    assert first.next_cursor is not None

    response = staff_client.get(f"{D}/audit/", {"cursor": first.next_cursor})
    assert _shown(response) == [log[3].pk]

    bad = staff_client.get(f"{D}/audit/", {"cursor": "!!!"})
    assert bad.status_code == 200
    assert "not valid any more" in bad.content.decode()


def test_audit__an_unknown_action_is_a_form_error_not_a_500(staff_client: Client) -> None:
    response = staff_client.get(f"{D}/audit/", {"action": "queue.explode"})

    assert response.status_code == 200
    assert response.context["form"].errors["action"]
