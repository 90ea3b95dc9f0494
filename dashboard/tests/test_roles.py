"""Roles for people (API.md v1.1, issue 14): the groups the migration creates, and the
permission each dashboard page and action, and each Django admin action, checks."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from dashboard import roles
from dashboard.tests.pages import D
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.models import ApiKey
from taskforge.audit.models import AuditEntry
from tasks.models import Schedule, Task, TaskStatus
from tasks.tests.factories import ScheduleFactory, TaskFactory

pytestmark = pytest.mark.django_db

S = TaskStatus
PAGES = [
    f"{D}/",
    f"{D}/stream",
    f"{D}/tasks/",
    f"{D}/tasks/{{pending}}",
    f"{D}/tasks/{{pending}}/status",
    f"{D}/dlq/",
    f"{D}/workers/",
    f"{D}/audit/",
    f"{D}/schedules/",
]
ACTIONS = [
    f"{D}/queues/q/pause",
    f"{D}/queues/q/resume",
    f"{D}/queues/q/purge",
    f"{D}/tasks/{{pending}}/cancel",
    f"{D}/dlq/replay",
    f"{D}/dlq/discard",
    f"{D}/dlq/{{dead}}/replay",
    f"{D}/dlq/{{dead}}/discard",
    f"{D}/schedules/{{schedule}}/pause",
    f"{D}/schedules/{{schedule}}/resume",
]


@pytest.fixture
def world() -> dict[str, str]:
    queue = QueueFactory(name="q")
    return {
        "pending": str(TaskFactory(queue=queue).pk),
        "dead": str(TaskFactory(queue=queue, status=S.DEAD).pk),
        "schedule": str(ScheduleFactory(queue=queue, name="hourly").pk),
    }


def state() -> Any:
    return (
        sorted(Queue.objects.values_list("name", "paused")),
        sorted(Task.objects.values_list("id", "status")),
        sorted(Schedule.objects.values_list("name", "paused")),
        AuditEntry.objects.count(),
    )


def get(client: Client, path: str) -> Any:
    response = client.get(path)
    if hasattr(response, "streaming_content"):
        response.close()  # the SSE stream: its status is all this needs
    return response


def test_migration__creates_the_two_groups_with_their_permissions() -> None:
    for name, expected in roles.GROUPS.items():
        group = Group.objects.get(name=name)
        held = {
            f"{p.content_type.app_label}.{p.codename}"
            for p in group.permissions.select_related("content_type")
        }
        assert held == set(expected), name
    assert set(roles.OPERATE) <= set(roles.GROUPS[roles.OPERATORS])
    assert not set(roles.OPERATE) & set(roles.GROUPS[roles.VIEWERS])


@pytest.mark.parametrize("path", PAGES)
def test_viewer__sees_every_page(path: str, viewer_client: Client, world: dict[str, str]) -> None:
    assert get(viewer_client, path.format(**world)).status_code == 200


@pytest.mark.parametrize("path", ACTIONS)
def test_viewer__is_refused_every_action_and_nothing_changes(
    path: str, viewer_client: Client, world: dict[str, str]
) -> None:
    before = state()

    response = viewer_client.post(
        path.format(**world), {"confirm": "q", "all": "1", "ids": list(world.values())}
    )

    assert response.status_code == 403
    assert state() == before


def test_viewer__is_refused_the_purge_confirmation_page(viewer_client: Client, world: Any) -> None:
    assert viewer_client.get(f"{D}/queues/q/purge").status_code == 403


@pytest.mark.parametrize("path", PAGES + ACTIONS)
def test_staff_without_a_group__is_refused_everything(
    path: str, bare_staff_client: Client, world: dict[str, str]
) -> None:
    before = state()
    method = bare_staff_client.post if path in ACTIONS else bare_staff_client.get

    response = method(path.format(**world), {"confirm": "q"} if path in ACTIONS else None)

    assert response.status_code == 403
    assert state() == before
    if hasattr(response, "streaming_content"):
        response.close()


@pytest.mark.parametrize("path", PAGES)
def test_operator__sees_every_page(path: str, staff_client: Client, world: dict[str, str]) -> None:
    assert get(staff_client, path.format(**world)).status_code == 200


def test_operator__may_take_every_action(staff_client: Client, world: dict[str, str]) -> None:
    for path in ACTIONS:
        response = staff_client.post(path.format(**world), {"confirm": "q", "ids": [world["dead"]]})
        assert response.status_code == 302, path
    recorded = set(AuditEntry.objects.filter(actor_name="oncall").values_list("action", flat=True))
    assert recorded == {
        "queue.pause",
        "queue.resume",
        "queue.purge",
        "dlq.replay",
        "schedule.update",
    }


# What the pages offer ----------------------------------------------------------------


CONTROLS = {
    "overview": ("", ["/queues/q/pause", "/queues/q/resume", "/queues/q/purge"]),
    "dlq": ("dlq/", ["/dlq/replay", "/dlq/discard", 'name="ids"', "/replay", "/discard"]),
    "dead task": ("tasks/{dead}", ["/replay", "/discard"]),
    "pending task": ("tasks/{pending}", ["/cancel"]),
    "schedules": ("schedules/", ["/schedules/{schedule}/pause"]),
}


@pytest.mark.parametrize("page", list(CONTROLS))
def test_pages__offer_a_viewer_no_control(
    page: str, viewer_client: Client, world: dict[str, str]
) -> None:
    path, controls = CONTROLS[page]
    html = viewer_client.get(f"{D}/{path.format(**world)}").content.decode()

    assert [c for c in controls if c.format(**world) in html] == []


@pytest.mark.parametrize("page", list(CONTROLS))
def test_pages__offer_an_operator_every_control(
    page: str, staff_client: Client, world: dict[str, str]
) -> None:
    path, controls = CONTROLS[page]
    html = staff_client.get(f"{D}/{path.format(**world)}").content.decode()

    assert [c for c in controls if c.format(**world) not in html] == []


def test_nav__links_only_the_pages_the_user_may_see(bare_staff_client: Client) -> None:
    """The 403 page still shows the header: without links to pages that would refuse."""
    html = bare_staff_client.get(f"{D}/").content.decode()

    assert f'href="{D}/tasks/"' not in html
    assert f'href="{D}/audit/"' not in html


# Django admin -----------------------------------------------------------------------


ADMIN_ACTIONS = [
    ("queues/queue", "pause", "queue"),
    ("queues/queue", "resume", "queue"),
    ("queues/queue", "purge", "queue"),
    ("tasks/task", "cancel", "pending"),
    ("dlq/deadlettertask", "replay", "dead"),
    ("dlq/deadlettertask", "discard", "dead"),
    ("api/apikey", "revoke", "key"),
    ("tasks/schedule", "pause", "schedule"),
    ("tasks/schedule", "resume", "schedule"),
]


@pytest.fixture
def admin_world(world: dict[str, str]) -> dict[str, str]:
    key, _ = ApiKey.issue(name="k", role="admin")
    return {**world, "queue": str(Queue.objects.get(name="q").pk), "key": str(key.pk)}


def _offered(client: Client, changelist: str) -> set[str]:
    response = client.get(f"/admin/{changelist}/")
    assert response.status_code == 200
    form = response.context["action_form"]  # None when no action is offered
    return set() if form is None else {value for value, _ in form.fields["action"].choices} - {""}


@pytest.mark.parametrize(("changelist", "action", "row"), ADMIN_ACTIONS)
def test_admin__a_viewer_sees_the_list_is_offered_no_action_and_is_refused_it(
    changelist: str, action: str, row: str, viewer_client: Client, admin_world: dict[str, str]
) -> None:
    assert _offered(viewer_client, changelist) == set()
    before = (state(), list(ApiKey.objects.values_list("revoked", flat=True)))

    response = viewer_client.post(
        f"/admin/{changelist}/",
        {"action": action, "_selected_action": [admin_world[row]], "confirmed": "yes"},
    )

    assert response.status_code == 403
    assert (state(), list(ApiKey.objects.values_list("revoked", flat=True))) == before


@pytest.mark.parametrize(("changelist", "action", "row"), ADMIN_ACTIONS)
def test_admin__an_operator_is_offered_the_operator_actions_only(
    changelist: str, action: str, row: str, staff_client: Client, admin_world: dict[str, str]
) -> None:
    offered = action in _offered(staff_client, changelist)
    if (changelist, action) == ("tasks/schedule", "resume"):
        Schedule.objects.update(paused=True)  # a resume that changes something

    response = staff_client.post(
        f"/admin/{changelist}/",
        {"action": action, "_selected_action": [admin_world[row]], "confirmed": "yes"},
    )

    if action == "revoke":  # keys are for superusers (or api.change_apikey)
        assert not offered
        assert response.status_code == 403
        assert ApiKey.objects.get(pk=admin_world["key"]).revoked is False
    else:
        assert offered
        assert response.status_code == 302
        assert AuditEntry.objects.filter(actor_name="oncall").exists()


def test_admin__a_viewer_cannot_change_a_queue(viewer_client: Client, admin_world: Any) -> None:
    response = viewer_client.post(
        f"/admin/queues/queue/{admin_world['queue']}/change/", {"max_retries": 9}
    )

    assert response.status_code == 403
    assert Queue.objects.get(name="q").max_retries == 3


def test_admin__the_audit_log_is_read_only_even_for_superusers(
    superuser_client: Client, admin_world: Any
) -> None:
    AuditEntry.objects.all().delete()  # the world's own (the schedule's creation)
    superuser_client.post("/admin/dashboard/queues/q/pause")
    entry = AuditEntry.objects.get()

    assert superuser_client.get("/admin/audit/auditentry/").status_code == 200
    assert superuser_client.get(f"/admin/audit/auditentry/{entry.pk}/change/").status_code == 200
    assert superuser_client.post(f"/admin/audit/auditentry/{entry.pk}/delete/").status_code == 403
    assert superuser_client.get("/admin/audit/auditentry/add/").status_code == 403
    assert AuditEntry.objects.count() == 1
