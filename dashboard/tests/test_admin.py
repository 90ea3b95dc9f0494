"""The Django admin: read-only task tables that never count, actions through the domain layer."""

from __future__ import annotations

from typing import Any

import pytest
from django.contrib import admin
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from dashboard.admin.base import GuardedAdmin
from dlq.models import DeadLetterTask
from queues.models import Queue
from queues.tests.factories import QueueFactory
from taskforge.api.models import ApiKey, hash_key
from tasks.models import Task, TaskEvent, TaskStatus
from tasks.tests.factories import TaskFactory
from workers.models import Worker

pytestmark = pytest.mark.django_db

S = TaskStatus
CHANGELISTS = [
    "/admin/queues/queue/",
    "/admin/tasks/task/",
    "/admin/tasks/taskevent/",
    "/admin/dlq/deadlettertask/",
    "/admin/workers/worker/",
    "/admin/api/apikey/",
]


@pytest.fixture
def world() -> dict[str, Any]:
    queue = QueueFactory(name="q")
    tasks = [TaskFactory(queue=queue, status=s) for s in ("pending", "executing", "dead", "done")]
    Worker.objects.create(worker_id="w", last_seen_at=tasks[1].updated_at)
    ApiKey.issue(name="ci", role="producer")
    return {"queue": queue, "tasks": tasks}


@pytest.mark.parametrize("url", CHANGELISTS)
def test_changelists__render(url: str, superuser_client: Client, world: dict[str, Any]) -> None:
    response = superuser_client.get(url)

    assert response.status_code == 200


@pytest.mark.parametrize("url", CHANGELISTS)
def test_changelists__need_staff(url: str) -> None:
    assert Client().get(url).status_code == 302
    client = Client()
    client.force_login(User.objects.create_user("nobody"))
    assert client.get(url).status_code == 302


@pytest.mark.parametrize(
    "url",
    [
        "/admin/tasks/task/",
        "/admin/tasks/task/?status__exact=dead",
        "/admin/tasks/task/?queue__id__exact={queue}",
        "/admin/tasks/task/?queue__id__exact={queue}&status__exact=pending&p=1",
        "/admin/tasks/taskevent/",
        "/admin/tasks/taskevent/?queue__id__exact={queue}",
        "/admin/dlq/deadlettertask/",
    ],
)
def test_large_changelists__never_count(
    url: str, superuser_client: Client, world: dict[str, Any]
) -> None:
    with CaptureQueriesContext(connection) as queries:
        response = superuser_client.get(url.format(queue=world["queue"].pk))

    assert response.status_code == 200
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts == []


def test_event_changelist__a_queue_through_its_tasks(
    superuser_client: Client, world: dict[str, Any]
) -> None:
    """A queue's events: its tasks newest first, each task's events newest first, found
    through the tasks (task_queue_created_idx), not by walking every event."""
    TaskFactory(queue=QueueFactory(name="other"), status="done")
    queue = world["queue"]
    url = f"/admin/tasks/taskevent/?queue__id__exact={queue.pk}"

    with CaptureQueriesContext(connection) as queries:
        response = superuser_client.get(url)

    listed = list(response.context["cl"].result_list)
    expected = sorted(
        TaskEvent.objects.filter(task__queue=queue).select_related("task"),
        key=lambda e: (e.task.created_at, e.task_id, e.id),
        reverse=True,
    )
    assert [e.pk for e in listed] == [e.pk for e in expected]
    assert len({e.task_id for e in listed}) > 1
    pages = [q["sql"] for q in queries.captured_queries if 'FROM "tasks_taskevent"' in q["sql"]]
    on_tasks = f'"tasks_task"."queue_id" = \'{queue.pk.hex}\'::uuid'
    assert pages and all(on_tasks in q for q in pages)
    # Not a queue id: the admin's own filter refuses it, as before.
    assert superuser_client.get("/admin/tasks/taskevent/?queue__id__exact=x").status_code == 302


def test_task_changelist__pages_with_previous_and_next(
    superuser_client: Client, world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dashboard.admin.tasks import TaskAdmin

    monkeypatch.setattr(TaskAdmin, "list_per_page", 3)

    first = superuser_client.get("/admin/tasks/task/").content.decode()
    second = superuser_client.get("/admin/tasks/task/?p=2").content.decode()

    assert "Next \u203a" in first and "\u2039 Previous" not in first
    assert "\u2039 Previous" in second and "Next \u203a" not in second


def test_task_admin__is_read_only(superuser_client: Client, world: dict[str, Any]) -> None:
    task = world["tasks"][0]

    assert superuser_client.get("/admin/tasks/task/add/").status_code == 403
    page = superuser_client.get(f"/admin/tasks/task/{task.pk}/change/")
    assert page.status_code == 200
    assert b'name="_save"' not in page.content
    assert superuser_client.post(f"/admin/tasks/task/{task.pk}/delete/").status_code == 403
    assert superuser_client.get("/admin/tasks/taskevent/add/").status_code == 403


def test_task_admin__search_by_task_or_worker_id(
    superuser_client: Client, world: dict[str, Any]
) -> None:
    executing = world["tasks"][1]

    by_id = superuser_client.get(f"/admin/tasks/task/?q={executing.pk}")
    by_worker = superuser_client.get("/admin/tasks/task/?q=worker-1")

    assert [t.pk for t in by_id.context["cl"].result_list] == [executing.pk]
    assert {t.pk for t in by_worker.context["cl"].result_list} == {t.pk for t in world["tasks"][1:]}


def test_task_admin__cancel_action_uses_the_transition(
    superuser_client: Client, world: dict[str, Any]
) -> None:
    pending, executing = world["tasks"][0], world["tasks"][1]

    response = superuser_client.post(
        "/admin/tasks/task/",
        {"action": "cancel", "_selected_action": [str(pending.pk), str(executing.pk)]},
        follow=True,
    )

    pending.refresh_from_db()
    executing.refresh_from_db()
    assert pending.status == S.CANCELLED and executing.status == S.EXECUTING
    assert TaskEvent.objects.filter(task=pending, to_status=S.CANCELLED).exists()
    texts = [str(m) for m in response.context["messages"]]
    assert "Cancelled 1 task(s)." in texts
    assert "Skipped 1 task(s) that are executing or finished." in texts


def test_dlq_admin__replay_and_discard_actions(
    superuser_client: Client, world: dict[str, Any]
) -> None:
    queue = world["queue"]
    dead = world["tasks"][2]
    other = TaskFactory(queue=queue, status="dead")

    superuser_client.post(
        "/admin/dlq/deadlettertask/",
        {"action": "replay", "_selected_action": [str(dead.pk)]},
    )
    superuser_client.post(
        "/admin/dlq/deadlettertask/",
        {"action": "discard", "_selected_action": [str(other.pk)]},
    )

    dead.refresh_from_db()
    assert dead.status == S.PENDING
    assert DeadLetterTask.objects.get(task=dead).replay_count == 1
    assert not Task.objects.filter(pk=other.pk).exists()
    # Replayed entries leave the default ("dead now") list.
    listed = superuser_client.get("/admin/dlq/deadlettertask/").context["cl"].result_list
    assert list(listed) == []
    everything = superuser_client.get("/admin/dlq/deadlettertask/?state=all")
    assert [e.task_id for e in everything.context["cl"].result_list] == [dead.pk]


def test_queue_admin__pause_resume_and_purge_with_confirmation(
    superuser_client: Client, world: dict[str, Any]
) -> None:
    queue, pending = world["queue"], world["tasks"][0]
    selected = {"_selected_action": [str(queue.pk)]}

    superuser_client.post("/admin/queues/queue/", {"action": "pause", **selected})
    assert Queue.objects.get(pk=queue.pk).paused is True
    superuser_client.post("/admin/queues/queue/", {"action": "resume", **selected})
    assert Queue.objects.get(pk=queue.pk).paused is False

    confirm = superuser_client.post("/admin/queues/queue/", {"action": "purge", **selected})
    assert confirm.status_code == 200 and b"Yes, purge" in confirm.content
    pending.refresh_from_db()
    assert pending.status == S.PENDING
    superuser_client.post(
        "/admin/queues/queue/", {"action": "purge", "confirmed": "yes", **selected}
    )
    pending.refresh_from_db()
    assert pending.status == S.CANCELLED


def test_queue_admin__create_and_edit_through_services(superuser_client: Client) -> None:
    response = superuser_client.post(
        "/admin/queues/queue/add/", {"name": "new-q", "max_retries": 2, "rate_limit": ""}
    )
    assert response.status_code == 302
    queue = Queue.objects.get(name="new-q")
    assert queue.max_retries == 2 and queue.paused is False

    superuser_client.post(
        f"/admin/queues/queue/{queue.pk}/change/",
        {"max_retries": 5, "rate_limit": 10, "max_concurrency": 4, "paused": "on"},
    )
    queue.refresh_from_db()
    assert (queue.max_retries, queue.rate_limit, queue.max_concurrency, queue.paused) == (
        5,
        10,
        4,
        True,
    )
    response = superuser_client.post(
        f"/admin/queues/queue/{queue.pk}/change/", {"max_retries": 5, "max_concurrency": 0}
    )
    assert response.status_code == 200  # the form again, with the error
    queue.refresh_from_db()
    assert queue.max_concurrency == 4
    assert superuser_client.get(f"/admin/queues/queue/{queue.pk}/delete/").status_code == 403


def test_queue_admin__push_target_checked_by_the_apis_rule(superuser_client: Client) -> None:
    response = superuser_client.post(
        "/admin/queues/queue/add/",
        {"name": "hooks", "max_retries": 3, "push": '{"url": "https://h.example/x"}'},
    )
    assert response.status_code == 302
    queue = Queue.objects.get(name="hooks")
    assert queue.push == {"url": "https://h.example/x", "timeout_seconds": 30, "headers": {}}
    listing = superuser_client.get("/admin/queues/queue/").content.decode()
    assert "https://h.example/x" in listing

    response = superuser_client.post(
        f"/admin/queues/queue/{queue.pk}/change/",
        {"max_retries": 3, "push": '{"url": "https://h.example/x", "headers": {"Host": "a"}}'},
    )
    assert response.status_code == 200  # the form again, with the error
    assert "may not be set" in response.content.decode()
    queue.refresh_from_db()
    assert queue.push is not None and queue.push["headers"] == {}

    superuser_client.post(
        f"/admin/queues/queue/{queue.pk}/change/", {"max_retries": 3, "push": "null"}
    )
    queue.refresh_from_db()
    assert queue.push is None


def test_api_key_admin__shows_a_new_key_once_and_revokes(superuser_client: Client) -> None:
    response = superuser_client.post(
        "/admin/api/apikey/add/", {"name": "deploy-bot", "role": "producer"}
    )

    assert response.status_code == 200
    key = response.context["key"]
    api_key = ApiKey.objects.get(name="deploy-bot")
    assert api_key.key_hash == hash_key(key) and key not in api_key.key_hash
    assert key in response.content.decode()
    assert (
        key not in superuser_client.get(f"/admin/api/apikey/{api_key.pk}/change/").content.decode()
    )

    superuser_client.post(
        "/admin/api/apikey/", {"action": "revoke", "_selected_action": [str(api_key.pk)]}
    )
    api_key.refresh_from_db()
    assert api_key.revoked is True
    assert superuser_client.get(f"/admin/api/apikey/{api_key.pk}/delete/").status_code == 403


def _filters_of(model_admin: Any) -> list[str]:
    """The query parameters of a change list's filters and search box."""
    names = ["q"] if model_admin.search_fields else []
    for spec in model_admin.list_filter:
        if isinstance(spec, str):
            names += [spec, f"{spec}__exact", f"{spec}__id__exact"]
        else:
            names.append(spec.parameter_name)
    return names


ADMINS = [
    (model, model_admin)
    for model, model_admin in admin.site._registry.items()
    if isinstance(model_admin, GuardedAdmin)
]


@pytest.mark.parametrize(
    ("model", "model_admin"), ADMINS, ids=[model.__name__ for model, _ in ADMINS]
)
def test_changelists__nul_in_a_filter_or_search_is_400(
    model: Any, model_admin: Any, superuser_client: Client, world: dict[str, Any]
) -> None:
    """Regression: `?status__exact=%00` (any filter on a field with choices) reached
    Postgres, which cannot hold NUL in text: a 500."""
    url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
    names = _filters_of(model_admin)
    assert names
    for name in names:
        for value in ("%00", "a%00b"):
            response = superuser_client.get(f"{url}?{name}={value}")
            assert response.status_code == 400, (name, value, response.status_code)
    assert superuser_client.get(f"{url}?{names[0]}=x&{names[0]}=%00").status_code == 400
